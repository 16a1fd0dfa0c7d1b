"""What `lmpress batch` shows on stderr, drawn from the events the runner reports: the progress
bar, a line for each failed row and each notice, and the summary table at the end; and for
`--dry-run`, the table of what the job would read, send and cost (`dry_run_table`)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, TextIO

from lmpress.batch import BatchEvents, BatchSummary, RowFailure
from lmpress.progress import ProgressBar

# Failed rows said on stderr, one line each, when the errors file keeps every one: a file of
# many bad lines would otherwise flood the terminal; the rest are counted at the end.
SHOWN_FAILURES = 5

if TYPE_CHECKING:
    from lmpress.batch.several import SeveralSummary
    from lmpress.dryrun.tally import DryRunSummary


class BatchReport(BatchEvents):
    def __init__(self, stream: TextIO | None = None, bar: bool = True) -> None:
        self.stream = stream or sys.stderr
        self.bar = ProgressBar("lmpress batch", self.stream) if bar else None
        self.input_path = ""
        self.input_unit = "line"
        self.errors_path: str | None = None
        self.said = 0
        self.unsaid = 0  # failed rows not said, since the errors file keeps them

    def started(self, summary: BatchSummary) -> None:
        self.input_path, self.input_unit = summary.input_path, summary.input_unit
        self.errors_path = summary.errors_path
        if self.bar is not None:
            self.bar.start(summary.rows_total)

    def notice(self, message: str) -> None:
        print(f"lmpress: {message}", file=self.stream)

    def interrupted(self) -> None:
        if self.stream.isatty():
            print(file=self.stream)  # past the ^C the terminal echoed

    def progressed(self, summary: BatchSummary) -> None:
        if self.bar is not None:
            self.bar.update(summary.rows_done, summary.rows_skipped, summary.completion_tokens)

    def row_failed(self, failure: RowFailure) -> None:
        if self.errors_path is not None and self.said >= SHOWN_FAILURES:
            self.unsaid += 1
            return
        self.said += 1
        where = f"{self.input_path}:{failure.line}"
        if self.input_unit == "row":
            where = f"{self.input_path} row {failure.line}"
        print(f"lmpress: {where}: {failure.message}", file=self.stream)

    def finished(self, summary: BatchSummary) -> None:
        if self.bar is not None:
            self.bar.stop()
        if self.unsaid:
            print(
                f"lmpress: {self.unsaid} more failed rows not shown; every failed row is in "
                f"{self.errors_path}",
                file=self.stream,
            )

    def summary_table(self, summary: BatchSummary) -> None:
        from rich.console import Console
        from rich.table import Table

        table = Table(title="lmpress batch", show_header=False, title_justify="left")
        table.add_column(style="bold")
        table.add_column(justify="right")
        table.add_row("rows ok", str(summary.rows_ok))
        table.add_row("rows failed", str(summary.rows_failed))
        table.add_row("rows skipped (done before)", str(summary.rows_skipped))
        if summary.cache_hits or summary.cache_misses:
            saved = summary.cost_saved_usd
            money = f", saved {_usd(saved)}" if saved else ""
            table.add_row(
                "response cache",
                f"{summary.cache_hits} hits / {summary.cache_misses} misses{money}",
            )
        table.add_row("tokens in / out", f"{summary.prompt_tokens} / {summary.completion_tokens}")
        if summary.cached_tokens:  # inside "in", priced as cached input
            table.add_row("  of in, read from cache", str(summary.cached_tokens))
        if summary.cache_creation_tokens:
            table.add_row("  of in, written to cache", str(summary.cache_creation_tokens))
        if summary.reasoning_tokens:  # inside "out", priced as output
            table.add_row("  of out, thinking", str(summary.reasoning_tokens))
        table.add_row("wall time", f"{summary.wall_s:.2f} s")
        table.add_row("rows/s", f"{summary.rows_per_s:.2f}")
        if summary.task == "generate":
            table.add_row("tokens/s", f"{summary.tokens_per_s:.1f}")
        else:  # vectors and scores: the rate is what was read
            table.add_row("input tokens/s", f"{summary.input_tokens_per_s:.1f}")
        if summary.cost_usd is not None:
            table.add_row("cost", _usd(summary.cost_usd))
        if summary.cost_live_usd is not None and summary.cost_live_usd != summary.cost_usd:
            table.add_row("cost had it run live", _usd(summary.cost_live_usd))
        if summary.rows_naming_other_model:
            table.add_row(
                "lines naming another model", f"{summary.rows_naming_other_model} (answered)"
            )
        table.add_row("output", summary.output_path)
        if summary.rows_failed:
            table.add_row("failed rows", summary.errors_path or "listed above (stderr)")
        if summary.stopped_because:  # "stopped by SIGTERM", a budget, --on-error fail...
            table.add_row("stopped", summary.stopped_because)
        if summary.interrupted:
            table.add_row("to resume", "re-run the same command")
        Console(file=self.stream).print(table)


def models_table(summary: SeveralSummary, stream: TextIO | None = None) -> None:
    """A --models job's summary: a line per model, then the totals."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table(title="lmpress batch --models", title_justify="left")
    for name in ("model", "ok", "failed", "skipped", "tokens in / out", "tokens/s", "cost"):
        table.add_column(name, justify="left" if name == "model" else "right")
    total = summary.total
    for label, s in [*summary.models, ("all", total)]:
        cost = "-" if s.cost_usd is None else _usd(s.cost_usd)
        rate = "-" if s is total else f"{s.tokens_per_s:.1f}"
        table.add_row(
            escape(label), str(s.rows_ok), str(s.rows_failed), str(s.rows_skipped),
            f"{s.prompt_tokens} / {s.completion_tokens}", rate, cost,
        )  # fmt: skip
    console = Console(file=stream or sys.stderr)
    console.print(table)
    console.print(f"output: {escape(total.output_path)}  wall time: {total.wall_s:.2f} s")
    if total.rows_failed:
        console.print(f"failed rows: {escape(total.errors_path or '')}")
    if total.stopped_because:
        console.print(
            f"stopped: {escape(total.stopped_because)}; re-run the same command to resume"
        )


def dry_run_table(summary: DryRunSummary, stream: TextIO | None = None) -> None:
    """The dry run's table on stderr. A count that is an estimate, and a cost made from one,
    carry "~"; costs are upper bounds, since they count every output token a row may make."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    approx = "" if summary.prompt_tokens_exact else "~"
    table = Table(title="lmpress batch --dry-run", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column(justify="right")
    table.add_row("rows", f"{summary.rows:,}")
    kinds = ", ".join(f"{kind} {n:,}" for kind, n in sorted(summary.bad_kinds.items()))
    table.add_row("bad rows", f"{summary.bad_rows:,}" + (f" ({kinds})" if kinds else ""))
    table.add_row("duplicate ids", f"{summary.duplicates:,}")
    if summary.cache_hits:  # left out of the tokens and the cost below
        table.add_row("answered by the response cache", f"{summary.cache_hits:,}")
    context = f" (context {summary.context:,} tokens)" if summary.context else ""
    table.add_row("over the context", f"{summary.over_context:,}{context}")
    table.add_row("prompt tokens", f"{approx}{summary.prompt_tokens:,}")
    if summary.cached_tokens:  # an estimate whatever counted the prompts
        table.add_row("  of those, read from cache", f"~{summary.cached_tokens:,}")
    if summary.cache_creation_tokens:
        table.add_row("  of those, written to cache", f"~{summary.cache_creation_tokens:,}")
    table.add_row("longest prompt", f"{approx}{summary.longest_prompt:,}")
    bound = summary.output_token_bound
    table.add_row("output tokens, at most", "unbounded" if bound is None else f"{bound:,}")
    label = summary.tokenizer
    if not summary.prompt_tokens_exact and not label.startswith("estimate"):
        label = f"estimate: {label}"
    table.add_row("tokenizer", escape(label))
    if summary.cached_tokens or summary.cache_creation_tokens:
        approx = "~"  # the prompt cache's share is a guess
    _add_cost_rows(table, summary, approx)
    Console(file=stream or sys.stderr).print(table)


def _add_cost_rows(table: Any, summary: DryRunSummary, approx: str) -> None:
    from rich.markup import escape

    price = summary.price
    if price is None:
        table.add_row(
            "price",
            "none known: set remote_params.input_price_per_million and "
            "output_price_per_million (USD)",
        )
        return
    per_million = f"{_usd(price.input_per_million)} in, {_usd(price.output_per_million)} out"
    if summary.cached_tokens and price.cached_input_per_million is not None:
        per_million += f", {_usd(price.cached_input_per_million)} cached in"
    if summary.cache_creation_tokens and price.cache_write_per_million is not None:
        per_million += f", {_usd(price.cache_write_per_million)} cache write"
    table.add_row("price per million tokens", f"{per_million} ({escape(price.source)})")
    if summary.cost_live is None:
        table.add_row("cost", "unbounded (no max_new_tokens)")
        return
    table.add_row("cost live, at most", f"{approx}{_usd(summary.cost_live)}")
    if summary.cost_batch is not None:
        table.add_row("cost with the batch API, at most", f"{approx}{_usd(summary.cost_batch)}")
    else:
        table.add_row("cost with a batch API", "no batch API")


def _usd(amount: float) -> str:
    """Dollars and cents, or the digits a small amount needs ($0.075, $0.0003)."""
    if amount >= 1 or round(amount, 2) == amount:
        return f"${amount:,.2f}"
    return f"${amount:.4g}"
