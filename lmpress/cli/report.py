"""What `lmpress batch` shows on stderr, drawn from the events the runner reports: the progress
bar, a line for each failed row and each notice, and the summary table at the end."""

from __future__ import annotations

import sys
from typing import TextIO

from lmpress.batch import BatchEvents, BatchSummary, RowFailure
from lmpress.progress import ProgressBar


class BatchReport(BatchEvents):
    def __init__(self, stream: TextIO | None = None, bar: bool = True) -> None:
        self.stream = stream or sys.stderr
        self.bar = ProgressBar("lmpress batch", self.stream) if bar else None
        self.input_path = ""
        self.input_unit = "line"

    def started(self, summary: BatchSummary) -> None:
        self.input_path, self.input_unit = summary.input_path, summary.input_unit
        if self.bar is not None:
            self.bar.start(summary.rows_total)

    def notice(self, message: str) -> None:
        print(f"lmpress: {message}", file=self.stream)

    def interrupted(self) -> None:
        print(file=self.stream)  # past the ^C the terminal echoed

    def progressed(self, summary: BatchSummary) -> None:
        if self.bar is not None:
            self.bar.update(summary.rows_done, summary.rows_skipped, summary.completion_tokens)

    def row_failed(self, failure: RowFailure) -> None:
        where = f"{self.input_path}:{failure.line}"
        if self.input_unit == "row":
            where = f"{self.input_path} row {failure.line}"
        print(f"lmpress: {where}: {failure.message}", file=self.stream)

    def finished(self, summary: BatchSummary) -> None:
        if self.bar is not None:
            self.bar.stop()

    def summary_table(self, summary: BatchSummary) -> None:
        from rich.console import Console
        from rich.table import Table

        table = Table(title="lmpress batch", show_header=False, title_justify="left")
        table.add_column(style="bold")
        table.add_column(justify="right")
        table.add_row("rows ok", str(summary.rows_ok))
        table.add_row("rows failed", str(summary.rows_failed))
        table.add_row("rows skipped (done before)", str(summary.rows_skipped))
        table.add_row("tokens in / out", f"{summary.prompt_tokens} / {summary.completion_tokens}")
        table.add_row("wall time", f"{summary.wall_s:.2f} s")
        table.add_row("rows/s", f"{summary.rows_per_s:.2f}")
        table.add_row("tokens/s", f"{summary.tokens_per_s:.1f}")
        table.add_row("output", summary.output_path)
        if summary.rows_failed:
            table.add_row("failed rows", summary.errors_path or "listed above (stderr)")
        if summary.stopped_because:
            table.add_row("stopped", summary.stopped_because)
        if summary.interrupted:
            table.add_row("interrupted", "re-run the same command to resume")
        Console(file=self.stream).print(table)
