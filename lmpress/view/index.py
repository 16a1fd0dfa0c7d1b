"""The index of a JSONL file: where each whole line starts and how long it is, and the facts
of its row (`table.Table`), so that a page of a million-row output is a few reads at known
offsets and a filter is arithmetic on arrays, not a parse of every line.

It is built once, in one pass that parses each line (orjson), and kept beside the file as
`FILE.view-index` (or, where that folder cannot be written, under lmpress's cache directory).
Reopened, it is read back in one go. A file that grew (a job still writing it) is indexed from
where the index ends, whole lines only: a line being written is taken once its newline is
there. A file that was replaced (smaller than what was indexed, its first bytes or its inode
changed) is indexed again from the start. The viewer only reads the file.

The index file: MAGIC, the header's length (8 bytes, little-endian), the header (JSON: what
was indexed, the labels, where each array lies), then the arrays, each 8-byte aligned.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from array import array
from pathlib import Path

import numpy as np
import orjson

from lmpress.view.records import RowKind, facts
from lmpress.view.table import Table, TableBuilder

MAGIC = b"LMPVIEW1"
VERSION = 1  # raised whenever what a row's facts are changes (records.facts)
HEAD_BYTES = 4096  # a file whose first bytes changed was replaced, not appended to
CHUNK = 8 << 20  # bytes read at a time while indexing
SAVE_EVERY_S = 10.0  # a growing file's index is written back at most this often


def index_paths(path: Path) -> list[Path]:
    """Where a file's index may live: beside it, else (a folder that cannot be written) in
    lmpress's cache directory."""
    from lmpress.builtin_models.tiny import cache_root

    digest = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:16]
    cached = cache_root() / "view" / f"{digest}-{path.name}.view-index"
    return [path.with_name(f"{path.name}.view-index"), cached]


def decode_line(data: bytes) -> object:
    """A line's JSON; a line with invalid UTF-8 is read with those bytes replaced; None for a
    line that is no JSON."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        pass
    try:
        return json.loads(data.decode("utf-8", "replace"))
    except ValueError:
        return None


class JsonlIndex:
    """The index of one JSONL file, read from disk or built, and kept up with the file."""

    def __init__(
        self,
        path: Path,
        kind: RowKind,
        step: str | None = None,
        model: str | None = None,
        keep: bool = True,
    ):
        """`keep`: read and write the index beside the file (else it lives in memory only)."""
        self.path, self.kind, self.step, self.model = path, kind, step, model
        self.stores = index_paths(path)
        self.keep = keep
        self.table = Table.empty()
        self.start = np.zeros(0, np.int64)
        self.length = np.zeros(0, np.uint32)
        self.size = 0  # bytes indexed: the end of the last whole line
        self.head = b""  # digest of the file's first head_length bytes
        self.head_length = 0
        self.inode = 0
        self.generation = 0  # counts restarts (a replaced file): what was found before is void
        self._saved_rows = -1
        self._saved_at = 0.0

    @property
    def rows(self) -> int:
        return len(self.start)

    # --- keeping up with the file ------------------------------------------------------------

    def refresh(self, ended: bool = False) -> bool:
        """Index what the file gained since; start over when it was replaced. Whether rows
        changed. `ended`: no job writes the file, so a last line without its newline is
        whole (else it waits for its newline)."""
        try:
            stat = os.stat(self.path)
        except FileNotFoundError:
            changed = self.rows > 0
            self._reset()
            return changed
        if self._saved_rows < 0 and self.rows == 0 and self.keep:
            self._load()
        if self.size and (
            stat.st_size < self.size
            or stat.st_ino != self.inode
            or self._head(self.head_length) != self.head
        ):
            self._reset()
        self.inode = stat.st_ino
        if stat.st_size <= self.size:
            return False
        before = self.rows
        self._extend(stat.st_size, ended)
        self._maybe_save()
        return self.rows != before

    def _reset(self) -> None:
        self.generation += 1
        self.table, self.size, self.head, self.head_length = Table.empty(), 0, b"", 0
        self.start, self.length = np.zeros(0, np.int64), np.zeros(0, np.uint32)

    def _head(self, length: int) -> bytes:
        with open(self.path, "rb") as handle:
            return hashlib.sha256(handle.read(length)).digest()

    def _extend(self, end: int, ended: bool = False) -> None:
        builder = TableBuilder(self.table.labels, self.rows)
        starts, lengths = array("q"), array("Q")
        kind, step, model = self.kind, self.step, self.model
        with open(self.path, "rb") as handle:
            handle.seek(self.size)
            offset, pending = self.size, b""
            while offset + len(pending) < end:
                block = handle.read(min(CHUNK, end - offset - len(pending)))
                if not block:
                    break
                data = pending + block
                ends = np.flatnonzero(np.frombuffer(data, np.uint8) == 10)
                first = 0
                for stop in ends.tolist():
                    line = data[first:stop]
                    if line.strip():
                        starts.append(offset + first)
                        lengths.append(stop - first)
                        builder.add(facts(kind, decode_line(line), step, model))
                    first = stop + 1
                offset += first
                pending = data[first:]
        if ended and pending.strip() and decode_line(pending) is not None:
            starts.append(offset)
            lengths.append(len(pending))
            builder.add(facts(kind, decode_line(pending), step, model))
            offset += len(pending)
        if self.head_length < HEAD_BYTES:  # a small file's first bytes, as far as they go now
            self.head_length = min(HEAD_BYTES, offset)
            self.head = self._head(self.head_length)
        # Lengths before starts, and the size last: a reader on another thread (a search) that
        # reads starts, lengths and size in that order sees no row past the lengths it has.
        added = np.frombuffer(lengths, np.uint64).astype(np.uint32)
        self.length = np.concatenate([self.length, added])
        self.start = np.concatenate([self.start, np.frombuffer(starts, np.int64)])
        # The builder started from this table's labels, so its codes mean the same.
        new = builder.table()
        columns = {k: np.concatenate([v, new.columns[k]]) for k, v in self.table.columns.items()}
        self.table = Table(columns, new.labels)
        self.size = offset

    # --- reading rows ------------------------------------------------------------------------

    def lines(self, rows: list[int]) -> list[bytes]:
        """The lines of these rows, as bytes (read at their offsets)."""
        if not rows:
            return []
        with open(self.path, "rb") as handle:
            return [
                os.pread(handle.fileno(), int(self.length[n]), int(self.start[n])) for n in rows
            ]

    def records(self, rows: list[int]) -> list[tuple[object, str]]:
        """(the row parsed, its line as text) for each row number."""
        return [(decode_line(line), line.decode("utf-8", "replace")) for line in self.lines(rows)]

    # --- the file beside ---------------------------------------------------------------------

    def _load(self) -> None:
        """The index written earlier, where there is one this version reads."""
        for store in self.stores:
            try:
                data = store.read_bytes()
            except OSError:
                continue
            if data.startswith(MAGIC):
                self._read(data)
                return

    def _read(self, data: bytes) -> None:
        try:
            size = int.from_bytes(data[8:16], "little")
            header = json.loads(data[16 : 16 + size])
            base = 16 + size
            if header.get("version") != VERSION or header.get("read_as") != self._read_as():
                return
            arrays = {}
            for name, (dtype, offset, count) in header["arrays"].items():
                arrays[name] = np.frombuffer(data, np.dtype(dtype), count, base + offset)
        except (ValueError, KeyError, TypeError):
            return
        self.start, self.length = arrays.pop("start"), arrays.pop("length")
        self.table = Table(arrays, header["labels"])
        self.size, self.inode = header["size"], header["inode"]
        self.head, self.head_length = bytes.fromhex(header["head"]), header["head_length"]
        self._saved_rows, self._saved_at = self.rows, time.monotonic()

    def _read_as(self) -> list[str | None]:
        """What the facts were read as: an index read otherwise is not this one."""
        return [self.kind.value, self.step, self.model]

    def _maybe_save(self) -> None:
        if not self.keep:
            return
        grew = self.rows - max(self._saved_rows, 0)
        if self._saved_rows < 0 or (grew and time.monotonic() - self._saved_at > SAVE_EVERY_S):
            self.save()

    def save(self) -> None:
        """Write the index beside the file, or in lmpress's cache where that folder refuses
        it; where neither takes it, the next open indexes the file again."""
        if not self.keep:
            return
        arrays = {"start": self.start, "length": self.length, **self.table.columns}
        layout, offset = {}, 0
        for name, column in arrays.items():
            layout[name] = (column.dtype.str, offset, len(column))
            offset += -(-column.nbytes // 8) * 8
        header = {
            "version": VERSION,
            "read_as": self._read_as(),
            "file": self.path.name,
            "size": self.size,
            "inode": self.inode,
            "head": self.head.hex(),
            "head_length": self.head_length,
            "labels": self.table.labels,
            "arrays": layout,  # offsets from the end of the header
        }
        text = json.dumps(header).encode()
        text += b" " * (-len(text) % 8)
        for store in self.stores:
            if _write(store, MAGIC + len(text).to_bytes(8, "little") + text, arrays.values()):
                break
        else:
            return
        self._saved_rows, self._saved_at = self.rows, time.monotonic()


def _write(store: Path, head: bytes, arrays) -> bool:
    """The index file, through a scratch file renamed over it; False where it cannot be."""
    scratch = store.with_name(f".{store.name}.{os.getpid()}")
    try:
        store.parent.mkdir(parents=True, exist_ok=True)
        with open(scratch, "wb") as handle:
            handle.write(head)
            for column in arrays:
                data = np.ascontiguousarray(column).tobytes()
                handle.write(data + b"\0" * (-len(data) % 8))
        os.replace(scratch, store)
    except OSError:
        scratch.unlink(missing_ok=True)
        return False
    return True
