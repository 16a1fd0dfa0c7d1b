"""What a batch run reports: its summary, the rows it set aside, and the events a front end
draws (`cli/report.py`) or a Python caller listens to."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lmpress.data.row_shapes import render_failure
from lmpress.vocabulary.errors import ErrorKind
from lmpress.vocabulary.types import round_usd

EXIT_OK, EXIT_FAILED_ROWS, EXIT_INTERRUPTED, EXIT_TERMINATED = 0, 1, 130, 143
# The signals that stop a job (Ctrl-C; what Slurm, Kubernetes, systemd and `timeout` send),
# each with the exit code a shell gives a process they end (128 + the signal's number).
STOP_SIGNALS = {"SIGINT": EXIT_INTERRUPTED, "SIGTERM": EXIT_TERMINATED}


@dataclass
class BatchSummary:
    input_path: str
    output_path: str
    input_unit: str = "line"  # what a failed row's number counts: "line" or "row" (Parquet)
    task: str = "generate"  # a run of another task writes no tokens: its rate is input
    rows_total: int = 0  # rows of the input in this shard
    rows_ok: int = 0
    rows_failed: int = 0
    rows_skipped: int = 0  # done (or set aside) by an earlier run
    rows_left: int = 0  # not reached: a stop (a signal, a budget, --max-errors) came first
    rows_elsewhere: int = 0  # a --models job's lines that name another of its models
    rows_naming_other_model: int = 0  # answered by this model, though they named another
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0  # of completion_tokens, a reasoning model's thinking
    # Of prompt_tokens, those read from and written to the provider's prompt cache.
    cached_tokens: int = 0
    cache_creation_tokens: int = 0
    cost_usd: float | None = None  # what this run's rows cost, where a price is known
    cost_live_usd: float | None = None  # what they would have cost live (provider batches)
    # The response cache: rows answered from it (counted in rows_ok, not in the tokens or the
    # cost above), cacheable rows generated, and what the hits would have cost.
    cache_hits: int = 0
    cache_misses: int = 0
    cost_saved_usd: float | None = None
    cache_write_wait_s: float = 0.0  # the longest this run waited for another's cache write
    wall_s: float = 0.0
    interrupted: bool = False  # a signal stopped the run (`signal` says which)
    signal: str | None = None  # "SIGINT" (Ctrl-C) or "SIGTERM"
    stopped_because: str | None = None
    errors_path: str | None = None  # OUT.errors.jsonl; None when streaming (no side files)

    @property
    def rows_done(self) -> int:
        return self.rows_ok + self.rows_failed

    @property
    def rows_per_s(self) -> float:
        return self.rows_done / self.wall_s if self.wall_s else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.completion_tokens / self.wall_s if self.wall_s else 0.0

    @property
    def input_tokens_per_s(self) -> float:
        return self.prompt_tokens / self.wall_s if self.wall_s else 0.0

    @property
    def exit_code(self) -> int:
        if self.interrupted:
            return STOP_SIGNALS.get(self.signal or "SIGINT", EXIT_INTERRUPTED)
        return EXIT_FAILED_ROWS if self.rows_failed or self.stopped_because else EXIT_OK

    def count_left(self) -> None:
        """Count the rows a stop left: every row of the job is done, failed, skipped or left.
        A job whose counts do not add up lost rows somewhere; it says so (RowCountError)
        rather than report success."""
        counted = self.rows_ok + self.rows_failed + self.rows_skipped + self.rows_elsewhere
        self.rows_left = self.rows_total - counted
        stopped = self.interrupted or self.stopped_because is not None
        if self.rows_left < 0 or (self.rows_left and not stopped):
            error = RowCountError(self)
            self.stopped_because = str(error)
            raise error

    def as_dict(self) -> dict[str, Any]:
        return {
            "input": self.input_path,
            "output": self.output_path,
            "rows_total": self.rows_total,
            "rows_ok": self.rows_ok,
            "rows_failed": self.rows_failed,
            "rows_skipped": self.rows_skipped,
            "rows_left": self.rows_left,
            # Only where lines named a model, so other runs' summaries stay as they were.
            **({"rows_elsewhere": self.rows_elsewhere} if self.rows_elsewhere else {}),
            **(
                {"rows_naming_other_model": self.rows_naming_other_model}
                if self.rows_naming_other_model
                else {}
            ),
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            # Only where a model reasoned, so other runs' summaries stay as they were.
            **({"reasoning_tokens": self.reasoning_tokens} if self.reasoning_tokens else {}),
            **({"cached_tokens": self.cached_tokens} if self.cached_tokens else {}),
            **(
                {"cache_creation_tokens": self.cache_creation_tokens}
                if self.cache_creation_tokens
                else {}
            ),
            "cost_usd": None if self.cost_usd is None else round_usd(self.cost_usd),
            "cost_live_usd": None if self.cost_live_usd is None else round_usd(self.cost_live_usd),
            # Only where the response cache answered or kept a row.
            **({"cache": self.cache_record()} if self.cache_hits or self.cache_misses else {}),
            "wall_s": round(self.wall_s, 3),
            "rows_per_s": round(self.rows_per_s, 3),
            "tokens_per_s": round(self.tokens_per_s, 3),
            "input_tokens_per_s": round(self.input_tokens_per_s, 3),
            "interrupted": self.interrupted,
            "signal": self.signal,
            "stopped_because": self.stopped_because,
        }

    def cache_record(self) -> dict[str, Any]:
        saved = None if self.cost_saved_usd is None else round_usd(self.cost_saved_usd)
        return {
            "hits": self.cache_hits,
            "misses": self.cache_misses,
            "saved_usd": saved,
            "longest_write_wait_s": round(self.cache_write_wait_s, 3),
        }


class RowCountError(RuntimeError):
    """A job's rows do not add up (rows_total != ok + failed + skipped + left): rows were lost
    on the way, a fault of lmpress's, never reported as a success."""

    def __init__(self, summary: BatchSummary):
        s = summary
        super().__init__(
            f"the job's rows do not add up: {s.rows_total} in the input, {s.rows_ok} ok, "
            f"{s.rows_failed} failed, {s.rows_skipped} skipped, {max(s.rows_left, 0)} left by "
            f"a stop; the output may lack rows: re-run the same command to resume"
        )


@dataclass
class RowFailure:
    """A row set aside: it could not be read, or its generation failed."""

    line: int  # 1-based line of the input
    row_id: str
    kind: ErrorKind  # invalid_json, invalid_row, unsupported_param, or the engine's error kind
    message: str
    status: int | None = None  # the HTTP status, where a remote engine gave one
    openai: bool = False  # recorded as an OpenAI Batch error line
    columns: dict[str, Any] | None = None  # the row as read, for a Parquet output's error row

    def __post_init__(self) -> None:
        self.kind = ErrorKind(self.kind)  # a string naming a kind is read as it; others refused

    def record(self) -> dict[str, Any]:
        """The OUT.errors.jsonl line."""
        return render_failure(
            self.row_id, self.line, self.kind, self.message, self.status, self.openai
        )


class BatchEvents:
    """What a batch run reports as it goes. Each method does nothing here; `cli/report.py`
    renders them for `lmpress batch`, and a Python caller overrides what it wants to see."""

    def started(self, summary: BatchSummary) -> None:
        """Work begins; `summary.rows_total` is the shard's row count."""

    def notice(self, message: str) -> None:
        """Something the user should know: loading, resuming, repairing, stopping."""

    def interrupted(self) -> None:
        """Ctrl-C or SIGTERM came; a notice says what happens next."""

    def progressed(self, summary: BatchSummary) -> None:
        """A row was written or set aside."""

    def row_failed(self, failure: RowFailure) -> None:
        """A row was set aside (not said again for each row of an unreachable endpoint)."""

    def finished(self, summary: BatchSummary) -> None:
        """The run is over, whether it completed or an error ends it."""
