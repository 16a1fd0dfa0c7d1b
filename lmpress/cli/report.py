"""What a batch run shows on stderr: a progress bar (plain lines when not a terminal) and the
summary table. Kept apart from the runner so that the runner stays about rows, not rendering."""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from lmpress.batch import BatchSummary


class Progress:
    """Rows/s, tokens/s and ETA: a rich bar on a terminal, a plain line now and then otherwise."""

    PLAIN_EVERY_S = 10.0

    def __init__(self, stream: TextIO | None = None, fancy: bool | None = None):
        self.stream = stream or sys.stderr
        self.fancy = self.stream.isatty() if fancy is None else fancy
        self.total = 0
        self.started = time.perf_counter()
        self._bar: Any = None
        self._task: Any = None
        self._last_plain = 0.0

    def start(self, total: int) -> None:
        self.total = total
        self.started = time.perf_counter()
        if self.fancy:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(
                TextColumn("[bold]lmpress batch"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[rate]}"),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                console=Console(file=self.stream),
                transient=True,
            )
            self._task = self._bar.add_task("rows", total=total, rate="")
            self._bar.start()

    def update(self, summary: BatchSummary) -> None:
        elapsed = max(time.perf_counter() - self.started, 1e-9)
        done = summary.rows_done
        rate = f"{done / elapsed:.1f} rows/s  {summary.completion_tokens / elapsed:.0f} tok/s"
        if self._bar is not None:
            self._bar.update(self._task, completed=done + summary.rows_skipped, rate=rate)
        elif elapsed - self._last_plain >= self.PLAIN_EVERY_S:
            self._last_plain = elapsed
            left = self.total - done - summary.rows_skipped
            eta = f"{left / (done / elapsed):.0f}s" if done else "?"
            print(f"lmpress: {done + summary.rows_skipped}/{self.total} rows, {rate}, ETA {eta}",
                  file=self.stream)  # fmt: skip

    def stop(self, summary: BatchSummary) -> None:
        if self._bar is not None:
            self._bar.stop()


def print_summary(summary: BatchSummary, stream: TextIO | None = None) -> None:
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
    Console(file=stream or sys.stderr).print(table)
