"""The batch runner: read rows as a stream, keep the engine's worth in flight, write each result
as it completes, and pick up where a stopped run left off.

- Memory stays flat: at most `engine.max_in_flight` rows are in flight (and, with `--ordered`,
  a bounded reorder window), whatever the input's size.
- Resume needs no flag: rows already in the output are skipped, a torn last line is cut, and a
  re-run with other settings is refused (see `data.resume`). `--overwrite` starts over.
- A row that cannot be parsed or whose generation fails goes to OUT.errors.jsonl; the job goes
  on (`--on-error skip`, the default) or stops (`--on-error fail`, `--max-errors N`).
- Ctrl-C stops taking rows, gives those in flight a few seconds, writes the summary and exits
  130; a second Ctrl-C exits at once. The output stays valid for resume either way.

The runner shows nothing itself: it reports what happens to a `BatchEvents` (started, a row
done or failed, a notice, finished), and `cli/report.py` draws the progress bar, the failed
rows' lines and the summary table from those.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmpress.configs.overrides import generation_with_overrides
from lmpress.configs.schema import RunConfig
from lmpress.data.formats import (
    ParsedRow,
    RowError,
    output_format_for,
    parse_row,
    render_failure,
    render_row,
    row_id,
)
from lmpress.data.idkeys import IdKeys
from lmpress.data.jsonl import JsonlWriter, LazyJsonlWriter, Line, read_lines
from lmpress.data.resume import (
    EarlierRun,
    JobFiles,
    fingerprint,
    id_key,
    read_earlier_run,
    scan_input,
    write_fingerprint,
)
from lmpress.data.targets import STDIO, check_input, resolve_output
from lmpress.engines.base import Engine, check_params, check_tools
from lmpress.engines.registry import create_engine, load_engine_class
from lmpress.errors import LmpressError, UnsupportedParamError
from lmpress.structured import check_structure
from lmpress.types import GenerationParams, Request, Result

EXIT_OK, EXIT_FAILED_ROWS, EXIT_INTERRUPTED = 0, 1, 130
CONNECTION_ERROR = "connection_error"  # the error kind remote engines give an unreachable host


@dataclass
class BatchOptions:
    input_path: str
    output_path: str
    overwrite: bool = False
    on_error: str = "skip"  # "skip": set failed rows aside and go on; "fail": stop the job
    retry_failed: bool = True  # retry rows that failed in an earlier run
    max_errors: int | None = None  # stop the job once this many rows failed
    ordered: bool = False  # write rows in input order
    shard: tuple[int, int] | None = None  # (I, N): every N-th row starting at I
    output_format: str = "auto"  # "auto" (follow the input), "lmpress" or "openai"
    recipe: str | None = None  # recorded in the fingerprint
    grace_s: float = 5.0  # how long rows in flight may finish after Ctrl-C

    def in_shard(self, ordinal: int) -> bool:
        """Whether the input's row at `ordinal` (0-based, blank lines not counted) is this
        shard's."""
        return self.shard is None or ordinal % self.shard[1] == self.shard[0]

    @property
    def shard_label(self) -> str | None:
        return f"{self.shard[0]}/{self.shard[1]}" if self.shard else None


@dataclass
class BatchSummary:
    input_path: str
    output_path: str
    rows_total: int = 0  # rows of the input in this shard
    rows_ok: int = 0
    rows_failed: int = 0
    rows_skipped: int = 0  # done (or set aside) by an earlier run
    prompt_tokens: int = 0
    completion_tokens: int = 0
    wall_s: float = 0.0
    interrupted: bool = False
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
    def exit_code(self) -> int:
        if self.interrupted:
            return EXIT_INTERRUPTED
        return EXIT_FAILED_ROWS if self.rows_failed or self.stopped_because else EXIT_OK

    def as_dict(self) -> dict[str, Any]:
        return {
            "input": self.input_path,
            "output": self.output_path,
            "rows_total": self.rows_total,
            "rows_ok": self.rows_ok,
            "rows_failed": self.rows_failed,
            "rows_skipped": self.rows_skipped,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "wall_s": round(self.wall_s, 3),
            "rows_per_s": round(self.rows_per_s, 3),
            "tokens_per_s": round(self.tokens_per_s, 3),
            "interrupted": self.interrupted,
            "stopped_because": self.stopped_because,
        }


@dataclass
class RowFailure:
    """A row set aside: it could not be read, or its generation failed."""

    line: int  # 1-based line of the input
    row_id: str
    kind: str  # invalid_json, invalid_row, unsupported_param, or the engine's error kind
    message: str
    status: int | None = None  # the HTTP status, where a remote engine gave one
    openai: bool = False  # recorded as an OpenAI Batch error line

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
        """Ctrl-C came; a notice says what happens next."""

    def progressed(self, summary: BatchSummary) -> None:
        """A row was written or set aside."""

    def row_failed(self, failure: RowFailure) -> None:
        """A row was set aside (not said again for each row of an unreachable endpoint)."""

    def finished(self, summary: BatchSummary) -> None:
        """The run is over, whether it completed or an error ends it."""


async def run_batch(
    config: RunConfig,
    options: BatchOptions,
    *,
    engine: Engine | None = None,
    events: BatchEvents | None = None,
) -> BatchSummary:
    """Run every row of the input (in this shard, not yet done) through the config's engine.

    Without `engine`, the engine is created when the first row needs it (so a finished job
    re-run loads no model) and closed at the end.
    """
    job = BatchJob(config, options, engine, events)
    try:
        return await job.run()
    finally:
        if engine is None and job.engine is not None:
            await job.engine.aclose()


class BatchJob:
    def __init__(
        self,
        config: RunConfig,
        options: BatchOptions,
        engine: Engine | None = None,
        events: BatchEvents | None = None,
    ):
        self.config = config
        self.engine = engine
        self.engine_class = type(engine) if engine else load_engine_class(config.engine)
        self.options = options
        self.events = events or BatchEvents()
        self.files = JobFiles.beside(options.output_path)
        check_input(options.input_path)
        side = [self.files.errors, self.files.summary, self.files.fingerprint]
        self.target = resolve_output(options.output_path, options.input_path, side)
        label = "stdout" if self.target.path == STDIO else options.output_path
        self.summary = BatchSummary(options.input_path, label)
        if not self.target.stream:
            self.summary.errors_path = str(self.files.errors)
        self.unreachable = False  # stopped because the endpoint never answered
        self.stopping = False  # no new rows: Ctrl-C, --on-error fail or --max-errors
        self._interrupts = 0

    # --- the whole job ---------------------------------------------------------------------

    async def run(self) -> BatchSummary:
        started = time.perf_counter()
        total, keys = scan_input(self.options.input_path, self.options.in_shard)
        earlier = self._read_earlier_run()
        done, set_aside = earlier.done, earlier.set_aside
        self.summary.rows_total = total
        left = total > len(keys) or any(k not in done and k not in set_aside for k in keys)
        if self.engine is None and left:
            # Load the model before anything is written; a finished job loads none.
            model = self.config.model.model_name
            self._say(f"loading {model} on {self.config.engine}…" if model else "starting…")
            self.engine = await asyncio.to_thread(create_engine, self.config)
        if earlier.fresh:
            self.files.remove_all()
            write_fingerprint(self.files, self._fingerprint(), self.options.recipe)
        loop = asyncio.get_running_loop()
        handled = _install_interrupt(loop, self._on_interrupt)
        try:
            self.events.started(self.summary)
            with self._open_output() as out, LazyJsonlWriter(self._errors_path()) as errors:
                self._out, self._errors = out, errors
                await self._process(done, set_aside)
        finally:
            if handled:
                loop.remove_signal_handler(signal.SIGINT)
            self.summary.wall_s = time.perf_counter() - started
            self.events.finished(self.summary)
            self._write_summary()
        return self.summary

    def _open_output(self) -> JsonlWriter:
        """The output: the file (appended to, for resume), or the stream as it is."""
        if not self.target.stream:
            return JsonlWriter(self.files.output, mode="a")
        if self.target.path == STDIO:
            return JsonlWriter(STDIO, handle=sys.stdout)
        return JsonlWriter(self.target.path, handle=open(self.target.path, "a", encoding="utf-8"))

    def _errors_path(self) -> Path | None:
        return None if self.target.stream else self.files.errors

    def _fingerprint(self) -> dict[str, Any]:
        options = self.options
        return fingerprint(self.config, options.output_format, options.shard_label)

    def _read_earlier_run(self) -> EarlierRun:
        if self.target.stream:  # nothing to resume from, nothing to start over
            return EarlierRun(IdKeys(), IdKeys(), fresh=False)
        return read_earlier_run(
            self.files,
            self._fingerprint(),
            overwrite=self.options.overwrite,
            retry_failed=self.options.retry_failed,
            say=self._say,
        )

    # --- rows ------------------------------------------------------------------------------

    async def _process(self, done: IdKeys, set_aside: IdKeys) -> None:
        options = self.options
        base = self.config.generation
        window = 1  # until the engine exists and says how many it wants
        reorder = _Reorder(self._out) if options.ordered else None
        in_flight: set[asyncio.Task] = set()
        seq = 0

        async def settle(all_of_them: bool) -> None:
            nonlocal in_flight
            if not in_flight:
                return
            mode = asyncio.ALL_COMPLETED if all_of_them else asyncio.FIRST_COMPLETED
            finished, in_flight = await asyncio.wait(in_flight, return_when=mode)
            for task in finished:
                if not task.cancelled():
                    self._finish(*task.result(), reorder)

        for ordinal, line in enumerate(read_lines(options.input_path)):
            if self.stopping:
                break
            if not options.in_shard(ordinal):
                continue
            rid, read = self._read_row(line, base)
            key = id_key(rid)
            if key in done or key in set_aside:
                self.summary.rows_skipped += 1
                continue
            if isinstance(read, RowFailure):
                self._fail(read, reorder, seq)
                seq += 1
                continue
            row, request = read
            assert self.engine is not None
            window = self.engine.max_in_flight
            # Bounded memory: rows in flight, plus (when ordered) finished rows held for order.
            while in_flight and (
                len(in_flight) >= window
                or (reorder is not None and len(in_flight) + reorder.held >= 4 * window)
            ):
                await settle(all_of_them=False)
            if self.stopping:
                break
            in_flight.add(asyncio.create_task(self._run_row(seq, row, request)))
            await asyncio.sleep(0)  # let the engine see the request at once
            seq += 1
        await self._drain(in_flight, settle)

    async def _drain(self, in_flight: set[asyncio.Task], settle) -> None:
        if not in_flight:
            return
        if not self._interrupts:
            await settle(all_of_them=True)
            return
        # Interrupted: rows in flight get a few seconds, then are abandoned (redone next run).
        finished, pending = await asyncio.wait(in_flight, timeout=self.options.grace_s)
        in_flight.clear()
        in_flight.update(finished)
        await settle(all_of_them=True)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)
            self._say(f"left {len(pending)} unfinished rows for the next run")

    def _read_row(
        self, line: Line, base: GenerationParams
    ) -> tuple[str, tuple[ParsedRow, Request] | RowFailure]:
        """The row's id, and its parsed row and request, or why it cannot run."""
        if line.error:
            rid = _line_id(line.number)
            return rid, RowFailure(line.number, rid, "invalid_json", line.error)
        value = line.value
        rid = row_id(value, line.number) if isinstance(value, dict) else _line_id(line.number)
        try:
            row = parse_row(value, line.number)
        except RowError as exc:
            openai = self.options.output_format == "openai" or (
                self.options.output_format == "auto" and isinstance(value, dict)
                and "custom_id" in value and "body" in value
            )  # fmt: skip
            return rid, RowFailure(line.number, rid, "invalid_row", str(exc), None, openai)
        openai = output_format_for(row, self.options.output_format) == "openai"
        try:
            params = generation_with_overrides(base, row.overrides, source="generation")
            check_params(self.engine_class, params)
            request = row.request(params)
            check_tools(self.engine_class, request)
        except LmpressError as exc:
            kind = "unsupported_param" if isinstance(exc, UnsupportedParamError) else "invalid_row"
            return rid, RowFailure(line.number, rid, kind, str(exc), None, openai)
        return rid, (row, request)

    async def _run_row(self, seq: int, row: ParsedRow, request: Request):
        assert self.engine is not None
        result = await self.engine.complete(request)
        return seq, row, check_structure(request, result)

    def _finish(self, seq: int, row: ParsedRow, result: Result, reorder: _Reorder | None) -> None:
        summary = self.summary
        summary.prompt_tokens += result.usage.prompt_tokens
        summary.completion_tokens += result.usage.completion_tokens
        if result.error is not None:
            error = result.error
            self._check_reachable(error.kind, error.message)
            openai = output_format_for(row, self.options.output_format) == "openai"
            failure = RowFailure(row.line, row.id, error.kind, error.message, error.status, openai)
            self._fail(failure, reorder, seq)
            return
        line = render_row(row, result, self.options.output_format)
        if reorder is not None:
            reorder.put(seq, line)
        else:
            self._out.write(line)
        summary.rows_ok += 1
        self.events.progressed(summary)

    def _fail(self, failure: RowFailure, reorder: _Reorder | None, seq: int) -> None:
        summary = self.summary
        summary.rows_failed += 1
        if not (self.unreachable and failure.kind == CONNECTION_ERROR):  # said once, not per row
            self.events.row_failed(failure)
        self._errors.write(failure.record())
        if reorder is not None:
            reorder.put(seq, None)
        self.events.progressed(summary)
        options = self.options
        if options.on_error == "fail" and not self.stopping:
            self._stop(f"a row failed and --on-error is fail (line {failure.line})")
        elif options.max_errors and summary.rows_failed >= options.max_errors and not self.stopping:
            self._stop(f"{summary.rows_failed} rows failed (--max-errors {options.max_errors})")

    # --- stopping --------------------------------------------------------------------------

    def _check_reachable(self, kind: str, message: str) -> None:
        """Stop the job when the endpoint has never answered: with no row done yet and the
        first failure a connection error, every other row would only fail the same way."""
        if kind != CONNECTION_ERROR or self.summary.rows_ok or self.stopping:
            return
        self.unreachable = True
        where = self.config.remote_params.api_url or "the endpoint"
        self._stop(
            f"{where} cannot be reached: {message}; no row was generated, so the job stops "
            f"here: re-run the same command to resume once it is up"
        )

    def _stop(self, reason: str) -> None:
        self.stopping = True
        self.summary.stopped_because = reason
        self._say(f"stopping: {reason}; rows in flight finish first")

    def _on_interrupt(self) -> None:
        self._interrupts += 1
        self.events.interrupted()
        if self._interrupts > 1:
            # Every written row is already flushed; the next run repairs and resumes.
            self._say("stopped at once; re-run the same command to resume")
            sys.stderr.flush()
            os._exit(EXIT_INTERRUPTED)
        self.stopping = True
        self.summary.interrupted = True
        self._say(
            f"interrupted: finishing rows in flight for up to {self.options.grace_s:g}s "
            f"(Ctrl-C again to stop at once); re-run the same command to resume"
        )

    # --- helpers ---------------------------------------------------------------------------

    def _write_summary(self) -> None:
        if self.target.stream:
            return
        try:
            text = json.dumps(self.summary.as_dict(), indent=2) + "\n"
            self.files.summary.write_text(text, encoding="utf-8")
        except OSError as exc:
            self._say(f"could not write {self.files.summary}: {exc.strerror}")

    def _say(self, message: str) -> None:
        self.events.notice(message)


def _line_id(line_no: int) -> str:
    """The id of a line that has none of its own because it is not a JSON object."""
    return f"line-{line_no}"


class _Reorder:
    """Holds finished rows until every earlier row is written (failed rows leave a gap)."""

    def __init__(self, out: JsonlWriter):
        self.out = out
        self.next = 0
        self.waiting: dict[int, dict[str, Any] | None] = {}

    @property
    def held(self) -> int:
        return len(self.waiting)

    def put(self, seq: int, line: dict[str, Any] | None) -> None:
        self.waiting[seq] = line
        while self.next in self.waiting:
            ready = self.waiting.pop(self.next)
            if ready is not None:
                self.out.write(ready)
            self.next += 1


def _install_interrupt(loop: asyncio.AbstractEventLoop, handler) -> bool:
    try:
        loop.add_signal_handler(signal.SIGINT, handler)
        return True
    except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or Windows
        return False
