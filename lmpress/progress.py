"""The one progress bar: rows done of a total, rows/s, tokens/s and the time left. On a
terminal it is a rich bar that clears itself when done; elsewhere (a log, a pipe) a plain line
every ten seconds. `lmpress batch` draws it (cli/report.py) and so does
`Engine.generate(progress=True)`. It writes to stderr, so it never mixes with the output."""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO


class ProgressBar:
    PLAIN_EVERY_S = 10.0

    def __init__(self, label: str, stream: TextIO | None = None, fancy: bool | None = None) -> None:
        self.label = label
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
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeRemainingColumn,
            )

            self._bar = Progress(
                TextColumn(f"[bold]{self.label}"),
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

    def update(self, done: int, skipped: int = 0, tokens: int = 0) -> None:
        """`done` rows finished in this run, `skipped` finished before it, `tokens` generated
        in this run."""
        elapsed = max(time.perf_counter() - self.started, 1e-9)
        rate = f"{done / elapsed:.1f} rows/s  {tokens / elapsed:.0f} tok/s"
        if self._bar is not None:
            self._bar.update(self._task, completed=done + skipped, rate=rate)
        elif elapsed - self._last_plain >= self.PLAIN_EVERY_S:
            self._last_plain = elapsed
            left = self.total - done - skipped
            eta = f"{left / (done / elapsed):.0f}s" if done else "?"
            print(f"lmpress: {done + skipped}/{self.total} rows, {rate}, ETA {eta}",
                  file=self.stream)  # fmt: skip

    def stop(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
