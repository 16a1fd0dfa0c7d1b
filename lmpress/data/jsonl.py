"""JSONL read and written as a stream: one line in memory at a time, each output line flushed.

The `jsonlines` package decodes and encodes each line, with orjson's `loads` and `dumps` doing
the JSON: on a 470-byte output row, 1.0 µs to read against json's 3.8, and 0.4 µs to write
against 6.3. Around it lmpress keeps its own guarantees:

- Reading goes on after a bad line, which comes back with its line number and why. Iterating a
  `jsonlines.Reader` stops at the first invalid line (or, with `skip_invalid`, drops it without
  a word), so `read_lines` calls `Reader.read()` once a line and turns each `InvalidLineError`
  into a `Line` with `error` set, the reason taken from the UTF-8 or JSON error behind it.
- Line numbers count blank lines too. `Reader.read()` returns the value alone, so the lines it
  is given come numbered from `_Lines`, which also skips blank lines and a BOM on line 1.
- `Reader.read()` signals the end of the file with EOFError, which gzip also raises for a file
  cut short: that would end a truncated file as if it were whole. `_Lines` turns decompression
  errors into an InputError before the Reader sees them.
- As `jsonlines.Reader` does, a BOM (or the RFC 7464 record separator) is skipped at the start
  of any line, not only the first: files each saved with a BOM, then concatenated, read whole.
  And since it reports any ValueError as an invalid line, an integer past Python's digit limit
  (4,300) is a bad line, where it used to stop the run.

orjson and the standard library differ at the edges; where orjson refuses what `json` accepts,
or would answer otherwise, the line goes to `json` instead, so every line reads and writes as
it did with `json` alone: NaN and Infinity (orjson writes them as null), integers beyond 64
bits (orjson reads them as floats), lone surrogate escapes ("\\ud800"), keys that are not
strings.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import jsonlines
import orjson

from lmpress.data.targets import open_read, open_write
from lmpress.vocabulary.errors import DISK_ERRNOS, InputError, OutputWriteError

BOM = b"\xef\xbb\xbf"  # Excel and Notepad start UTF-8 files with it

# A run of 19 digits may be an integer orjson cannot hold in 64 bits (it would return a float);
# digits mapped to b"0" and all else to b"." find one with a bytes search.
_DIGITS = bytes(0x30 if 0x30 <= b <= 0x39 else 0x2E for b in range(256))
_LONG_NUMBER = b"0" * 19


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


def read_lines(path: str | Path, name: str | Path | None = None) -> Iterator[Line]:
    """Every non-blank line of a JSONL file, decoded, with its line number; `name`: what
    messages call the file, where that is not its path (a piped input's spool).

    A line that is not UTF-8 or not JSON comes back with `error` set; reading goes on. A
    byte-order mark before the first line is skipped. A compressed file that ends early (a
    copy cut short) is one clear InputError after the lines that could be read.
    """
    with open_input(path) as handle:
        lines = _Lines(handle, name or path)
        reader = jsonlines.Reader(lines, loads=_loads)
        while True:
            try:
                value = reader.read(allow_none=True)
            except EOFError:
                return
            except jsonlines.InvalidLineError as exc:
                yield Line(lines.number, error=_reason(exc))
            else:
                yield Line(lines.number, value)


class _Lines:
    """The non-blank lines of a file as bytes; `number` is the last one's, blank lines counted."""

    def __init__(self, handle: IO[bytes], path: str | Path):
        self.number = 0
        self._handle = iter(handle)
        self._path = path

    def __iter__(self) -> _Lines:
        return self

    def __next__(self) -> bytes:
        try:
            for raw in self._handle:
                self.number += 1
                if self.number == 1:
                    raw = raw.removeprefix(BOM)
                if raw.strip():
                    return raw
        except (EOFError, OSError, ValueError) as exc:  # gzip/lzma/bz2/zstd on a truncated file
            raise InputError(
                f"{self._path}: the compressed data is cut off or damaged ({exc})"
            ) from exc
        raise StopIteration


def _loads(text: str) -> Any:
    data = text.encode()
    if _LONG_NUMBER in data.translate(_DIGITS):
        return json.loads(text)
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        # NaN, Infinity, 1e400, lone surrogate escapes: json reads them. A line that is not
        # JSON fails again here, with json's message, as before.
        return json.loads(text)


def _reason(exc: jsonlines.InvalidLineError) -> str:
    cause = exc.__cause__
    if isinstance(cause, UnicodeDecodeError):
        return f"not valid UTF-8 (byte {cause.start + 1})"
    if isinstance(cause, json.JSONDecodeError):
        # Some of json's messages end in "at" ("Unterminated string starting at").
        at = "" if cause.msg.endswith(" at") else " at"
        return f"not valid JSON ({cause.msg}{at} column {cause.colno})"
    return f"not valid JSON ({cause})"  # an integer past Python's digit limit


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


def _dumps(row: Any) -> str:
    try:
        data = orjson.dumps(row)
    except TypeError:  # integers beyond 64 bits, keys that are not strings, lone surrogates
        return json.dumps(row, ensure_ascii=False)
    if b"null" in data and _has_nonfinite(row):  # orjson writes NaN and Infinity as null
        return json.dumps(row, ensure_ascii=False)
    return data.decode()


def _has_nonfinite(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(_has_nonfinite(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_has_nonfinite(v) for v in value)
    return False


class JsonlWriter:
    """Appends one JSON object per line and flushes it, so a crash loses no written row.

    A write the file system refuses (a full disk, a read-only one) is an OutputWriteError
    naming the file: the lines before it are whole, and at most the last one is torn, which
    the next run cuts off (`data.resume`)."""

    def __init__(
        self,
        path: str | Path,
        mode: str = "w",
        handle: IO[str] | None = None,
        started: bool = False,
    ):
        """`handle`: write there (stdout, a device) instead of opening `path`; not closed.
        `started`: the job has written rows before opening this file (for the exit code)."""
        self.path = Path(path).expanduser()
        self._owned = handle is None
        if handle is None:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                handle = open_write(self.path, mode)
            except OSError as exc:
                if exc.errno in DISK_ERRNOS:
                    raise OutputWriteError(path, exc, started) from exc
                raise InputError(f"{path}: cannot write output ({exc.strerror})") from exc
        self._handle = handle
        self._lines = jsonlines.Writer(handle, dumps=_dumps, flush=True)
        self._escaped = jsonlines.Writer(handle, dumps=json.dumps, flush=True)

    def write(self, row: dict[str, Any]) -> None:
        try:
            self._lines.write(row)
        except UnicodeEncodeError:
            # A lone surrogate ("\\ud800", valid JSON) has no UTF-8 form: write the line with
            # escapes, so the row goes out as it came in. Nothing was written: the text is
            # encoded whole before it reaches the file.
            self._write_escaped(row)
        except BrokenPipeError:  # `-o - | head`: the CLI ends quietly
            raise
        except OSError as exc:
            raise OutputWriteError(self.path, exc) from exc

    def _write_escaped(self, row: dict[str, Any]) -> None:
        try:
            self._escaped.write(row)
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise OutputWriteError(self.path, exc) from exc

    def close(self) -> None:
        try:
            if self._owned:
                self._handle.close()
            else:
                self._handle.flush()
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise OutputWriteError(self.path, exc) from exc

    def __enter__(self) -> JsonlWriter:
        return self

    def __exit__(self, kind: object, *exc: object) -> None:
        try:
            self.close()
        except (OSError, OutputWriteError):
            if kind is None:
                raise
            # A write already failed and is on its way up; the buffer it left cannot be
            # written either, and that error says nothing more.


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
            self._writer = JsonlWriter(self.path, mode="a", started=True)
        self._writer.write(row)

    def __enter__(self) -> LazyJsonlWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._writer is not None:
            self._writer.__exit__(*exc)
