"""JSONL read and written as a stream: one line in memory at a time, each output line flushed."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from lmpress.data.targets import open_read, open_write
from lmpress.errors import InputError

BOM = b"\xef\xbb\xbf"  # Excel and Notepad start UTF-8 files with it


@dataclass
class Line:
    number: int  # 1-based
    value: Any = None
    error: str | None = None  # why the line is not valid JSON


def open_input(path: str | Path) -> IO[bytes]:
    """Open an input file for reading, or raise an InputError that names it."""
    p = Path(path).expanduser()
    if not p.exists():
        raise InputError(f"{path}: no such input file")
    if p.is_dir():
        raise InputError(f"{path}: is a directory, expected a JSONL file")
    try:
        return open_read(p)
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror})") from exc


def read_lines(path: str | Path) -> Iterator[Line]:
    """Every non-blank line of a JSONL file, decoded, with its line number.

    A line that is not UTF-8 or not JSON comes back with `error` set; reading goes on. A
    byte-order mark before the first line is skipped. A compressed file that ends early (a
    copy cut short) is one clear InputError after the lines that could be read.
    """
    with open_input(path) as handle:
        for number, raw in enumerate(_raw_lines(handle, path), start=1):
            if number == 1:
                raw = raw.removeprefix(BOM)
            if not raw.strip():
                continue
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                yield Line(number, error=f"not valid UTF-8 (byte {exc.start + 1})")
                continue
            try:
                yield Line(number, json.loads(text))
            except json.JSONDecodeError as exc:
                yield Line(number, error=f"not valid JSON ({exc.msg} at column {exc.colno})")


def _raw_lines(handle: IO[bytes], path: str | Path) -> Iterator[bytes]:
    try:
        yield from handle
    except (EOFError, OSError, ValueError) as exc:  # gzip/lzma/bz2/zstd on a truncated file
        raise InputError(f"{path}: the compressed data is cut off or damaged ({exc})") from exc


def count_lines(path: str | Path) -> int:
    """Non-blank lines, for a progress total; reads in blocks, never the whole file at once."""
    count = 0
    pending = b""
    with open_input(path) as handle:
        while block := handle.read(1 << 20):
            lines = (pending + block).split(b"\n")
            pending = lines.pop()
            count += sum(1 for line in lines if line.strip())
    return count + (1 if pending.strip() else 0)


class JsonlWriter:
    """Appends one JSON object per line and flushes it, so a crash loses no written row."""

    def __init__(self, path: str | Path, mode: str = "w", handle: IO[str] | None = None):
        """`handle`: write there (stdout, a device) instead of opening `path`; not closed."""
        self.path = Path(path).expanduser()
        self._owned = handle is None
        if handle is not None:
            self._handle = handle
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._handle = open_write(self.path, mode)
        except OSError as exc:
            raise InputError(f"{path}: cannot write output ({exc.strerror})") from exc

    def write(self, row: dict[str, Any]) -> None:
        try:
            self._handle.write(json.dumps(row, ensure_ascii=False) + "\n")
        except UnicodeEncodeError:
            # A lone surrogate ("\\ud800", valid JSON) has no UTF-8 form: write the line with
            # escapes, so the row goes out as it came in. Nothing was written: the text is
            # encoded whole before it reaches the file.
            self._handle.write(json.dumps(row) + "\n")
        self._handle.flush()

    def close(self) -> None:
        if self._owned:
            self._handle.close()
        else:
            self._handle.flush()

    def __enter__(self) -> JsonlWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LazyJsonlWriter:
    """A JsonlWriter opened (in append mode) only when the first line comes, so a run with no
    failed row leaves no errors file."""

    def __init__(self, path: Path | None):
        self.path = path  # None: lines are dropped (streamed output has no side files)
        self._writer: JsonlWriter | None = None

    def write(self, row: dict[str, Any]) -> None:
        if self.path is None:
            return
        if self._writer is None:
            self._writer = JsonlWriter(self.path, mode="a")
        self._writer.write(row)

    def __enter__(self) -> LazyJsonlWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._writer is not None:
            self._writer.close()
