"""The batch runner: read rows as a stream, keep the engine's worth in flight, write each result
as it completes, report progress, and sum it up.

Memory stays flat: at most `engine.max_in_flight` rows are held, whatever the input's size.
A row that cannot be parsed or whose generation fails is reported and written to
`OUT.errors.jsonl`; the other rows go on.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from lmpress.configs.loading import generation_with_overrides
from lmpress.data.formats import ParsedRow, RowError, parse_row, render_row
from lmpress.data.jsonl import JsonlWriter, count_lines, read_lines
from lmpress.engines.base import Engine, check_params
from lmpress.errors import InputError, LmpressError, UnsupportedParamError
from lmpress.types import Result


@dataclass
class RowFailure:
    line: int
    id: str | None
    kind: str
    message: str
    status: int | None = None  # the HTTP status, for rows a remote engine refused

    def as_row(self) -> dict[str, Any]:
        error: dict[str, Any] = {"kind": self.kind, "message": self.message}
        if self.status is not None:
            error["status"] = self.status
        return {"line": self.line, "id": self.id, "error": error}


@dataclass
class BatchSummary:
    input_path: str
    output_path: str
    rows_ok: int = 0
    rows_failed: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    wall_s: float = 0.0
    failures: list[RowFailure] = field(default_factory=list)  # the first few, for the report

    @property
    def rows_done(self) -> int:
        return self.rows_ok + self.rows_failed

    @property
    def rows_per_s(self) -> float:
        return self.rows_done / self.wall_s if self.wall_s else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.completion_tokens / self.wall_s if self.wall_s else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "input": self.input_path,
            "output": self.output_path,
            "rows_ok": self.rows_ok,
            "rows_failed": self.rows_failed,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "wall_s": round(self.wall_s, 3),
            "rows_per_s": round(self.rows_per_s, 3),
            "tokens_per_s": round(self.tokens_per_s, 3),
        }


MAX_FAILURES_KEPT = 20


def errors_path(output_path: str | Path) -> Path:
    """Where failed rows go: OUT.jsonl -> OUT.errors.jsonl."""
    out = Path(output_path)
    stem = out.name[: -len(".jsonl")] if out.name.endswith(".jsonl") else out.name
    return out.with_name(f"{stem}.errors.jsonl")


async def run_batch(
    engine: Engine,
    input_path: str | Path,
    output_path: str | Path,
    *,
    progress: Progress | None = None,
    stderr: TextIO | None = None,
) -> BatchSummary:
    """Run every row of `input_path` through `engine`, writing `output_path`."""
    stderr = stderr or sys.stderr
    summary = BatchSummary(str(input_path), str(output_path))
    base = engine.config.generation
    started = time.perf_counter()
    failures_out: JsonlWriter | None = None
    errors_file = errors_path(output_path)

    def fail(failure: RowFailure) -> None:
        nonlocal failures_out
        summary.rows_failed += 1
        if len(summary.failures) < MAX_FAILURES_KEPT:
            summary.failures.append(failure)
        where = f"{input_path}:{failure.line}"
        print(f"lmpress: {where}: {failure.message}", file=stderr)
        if failures_out is None:
            failures_out = JsonlWriter(errors_file)
        failures_out.write(failure.as_row())
        if progress:
            progress.update(summary)

    def finish(row: ParsedRow, result: Result) -> None:
        summary.prompt_tokens += result.usage.prompt_tokens
        summary.completion_tokens += result.usage.completion_tokens
        if result.ok:
            writer.write(render_row(row, result))
            summary.rows_ok += 1
            if progress:
                progress.update(summary)
        else:
            assert result.error is not None
            error = result.error
            fail(RowFailure(row.line, row.id, error.kind, error.message, error.status))

    async def run_one(row: ParsedRow, request) -> tuple[ParsedRow, Result]:
        return row, await engine.complete(request)

    async def settle(wait_for_all: bool) -> None:
        nonlocal in_flight
        if not in_flight:
            return
        mode = asyncio.ALL_COMPLETED if wait_for_all else asyncio.FIRST_COMPLETED
        done, in_flight = await asyncio.wait(in_flight, return_when=mode)
        for task in done:
            finish(*task.result())

    total = count_lines(input_path)
    if total == 0:
        raise InputError(f"{input_path}: the input has no rows")
    errors_file.unlink(missing_ok=True)
    writer = JsonlWriter(output_path)
    in_flight: set[asyncio.Task] = set()
    try:
        if progress:
            progress.start(total)
        for line in read_lines(input_path):
            if line.error:
                fail(RowFailure(line.number, None, "invalid_json", line.error))
                continue
            try:
                row = parse_row(line.value, line.number)
                params = generation_with_overrides(base, row.overrides)
                check_params(engine, params)
            except (RowError, LmpressError) as exc:
                kind = (
                    "unsupported_param" if isinstance(exc, UnsupportedParamError) else "invalid_row"
                )
                row_id = line.value.get("id") if isinstance(line.value, dict) else None
                fail(RowFailure(line.number, row_id, kind, str(exc)))
                continue
            request = row.request(params)
            while len(in_flight) >= engine.max_in_flight:
                await settle(wait_for_all=False)
            in_flight.add(asyncio.create_task(run_one(row, request)))
            await asyncio.sleep(0)  # let the engine see the request at once
        await settle(wait_for_all=True)
    finally:
        for task in in_flight:
            task.cancel()
        writer.close()
        if failures_out is not None:
            failures_out.close()
        summary.wall_s = time.perf_counter() - started
        if progress:
            progress.stop(summary)
    return summary


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
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                TextColumn,
                TimeRemainingColumn,
            )
            from rich.progress import (
                Progress as RichProgress,
            )

            self._bar = RichProgress(
                TextColumn("[bold]lmpress batch"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[rate]}"),
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
            self._bar.update(self._task, completed=done, rate=rate)
        elif elapsed - self._last_plain >= self.PLAIN_EVERY_S:
            self._last_plain = elapsed
            eta = (self.total - done) / (done / elapsed) if done else float("nan")
            print(f"lmpress: {done}/{self.total} rows, {rate}, ETA {eta:.0f}s", file=self.stream)

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
    table.add_row("tokens in / out", f"{summary.prompt_tokens} / {summary.completion_tokens}")
    table.add_row("wall time", f"{summary.wall_s:.2f} s")
    table.add_row("rows/s", f"{summary.rows_per_s:.2f}")
    table.add_row("tokens/s", f"{summary.tokens_per_s:.1f}")
    table.add_row("output", summary.output_path)
    if summary.rows_failed:
        table.add_row("errors", str(errors_path(summary.output_path)))
    Console(file=stream or sys.stderr).print(table)


def summary_json(summary: BatchSummary) -> str:
    return json.dumps(summary.as_dict(), indent=2)
