"""The index of a JSONL file: where each whole line starts and how long it is, and the facts
of its row (`table.Table`), so that a page of a million-row output is a few reads at known
offsets and a filter is arithmetic on arrays, not a parse of every line.

It is built in two passes (lines.py). Where the lines are is found first, at once, no line
parsed (under a second for a million rows), so the page shows the true row count and any row
straight away. The rows' facts (status, model, tokens: what filters, the overview and compare
read) need every line parsed, seconds for a million rows: a few thousand rows are read at once,
more by a thread behind the page (`_fill`), a block at a time, in order, and past PROCESS_ROWS
by reader processes it feeds (lines.Reader: the page's requests keep this process's interpreter
lock, and both cores work). Rows not read yet are
Status.PENDING in the table and `known` counts the others, so an answer over the facts can say
how far it got.

Once every row's facts are in, the index is kept beside the file as `FILE.view-index` (or,
where that folder cannot be written, under lmpress's cache directory) and read back in one go
when the file is opened again. A file that grew (a job still writing it) is indexed from where
the index ends, whole lines only: a line being written is taken once its newline is there. A
file that was replaced (smaller than what was indexed, its first bytes or its inode changed) is
indexed again from the start, and facts read from it as it was are dropped (`generation`). The
viewer only reads the file. A compressed file is indexed as its plain copy (plain_copy.py),
brought up to date first at each refresh.

Threads: requests refresh and read the index (under their source's lock, sources.py) while the
facts thread fills it in; both change it under the index's own lock. A table handed out
never changes: rows past it are written in place (the columns keep room), and facts with rows
still pending are copied, by `table` or by the source while it holds `facts`.

The index file: MAGIC, the header's length (8 bytes, little-endian), the header (JSON: what
was indexed, the labels, where each array lies), then the arrays, each 8-byte aligned.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from lmpress.data.targets import is_compressed
from lmpress.view.lines import CHUNK, Reader, decode_line, find_lines, read_facts
from lmpress.view.plain_copy import HEAD_BYTES, PlainCopy, path_digest
from lmpress.view.records import RowKind
from lmpress.view.table import LABELLED, PENDING_VALUES, Table, recode

MAGIC = b"LMPVIEW1"
VERSION = 1  # raised whenever what a row's facts are changes (records.facts)
SAVE_EVERY_S = 10.0  # a growing file's index is written back at most this often
INLINE_ROWS = 20_000  # new rows whose facts are read at once (a tenth of a second); more: behind
BLOCK_ROWS = 1 << 16  # rows the facts thread reads at a time (CHUNK bytes' worth at most)
PROCESS_ROWS = 100_000  # pending rows past which processes read them (a second of work or so)
MOST_PROCESSES = 2  # processes reading facts at once, at most one a core
# One file's facts read by processes at a time, however many files the viewer opened (a
# --models output's parts): readers for each at once would be cores times files of processes.
PROCESSES_IN_USE = threading.Lock()


def index_paths(path: Path) -> list[Path]:
    """Where a file's index may live: beside it, else (a folder that cannot be written) in
    lmpress's cache directory."""
    from lmpress.builtin_models.tiny import cache_root

    cached = cache_root() / "view" / f"{path_digest(path)}-{path.name}.view-index"
    return [path.with_name(f"{path.name}.view-index"), cached]


class JsonlIndex:
    """The index of one JSONL file, read from disk or built, and kept up with the file."""

    def __init__(
        self,
        path: Path,
        kind: RowKind,
        step: str | None = None,
        model: str | None = None,
        keep: bool = True,
        id_column: str | None = None,
    ):
        """`keep`: read and write the index beside the file (else it lives in memory only).
        A compressed file is indexed and read through its plain copy (plain_copy.py)."""
        self.copy = PlainCopy.of(path) if is_compressed(path) else None
        self.copied = 0  # the copy's generation this index was built from
        path = self.copy.path if self.copy is not None else path
        self.path, self.kind, self.step, self.model = path, kind, step, model
        self.id_column = id_column
        self.stores = index_paths(path)
        self.keep = keep
        self._lock = threading.Condition()
        self.start = np.zeros(0, np.int64)
        self.length = np.zeros(0, np.uint32)
        self._columns = Table.empty().columns  # the facts, with room past `rows`
        self.labels: dict[str, list[str]] = {name: [] for name in LABELLED}
        self.known = 0  # rows 0:known have their facts; the others are pending
        self._next = 0  # the first row no reader of facts has taken yet
        self._filling = False  # the facts thread runs
        self._closed = False
        self._table: Table | None = None  # the whole table handed out, while it is still so
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

    @property
    def table(self) -> Table:
        """Every row's facts as they are now (pending rows as Status.PENDING)."""
        with self.facts() as found:
            if self.known == self.rows:
                self._table = self._table or found
                return self._table
            # The facts thread writes into these rows: a copy (not kept, it is soon old).
            return Table({name: c.copy() for name, c in found.columns.items()}, found.labels)

    @contextmanager
    def facts(self) -> Iterator[Table]:
        """The facts as they are, the facts thread held meanwhile: while rows are pending,
        their columns are the index's own, to be copied, not kept (sources.py)."""
        with self._lock:
            yield Table({name: c[: self.rows] for name, c in self._columns.items()}, self.labels)

    # --- keeping up with the file ------------------------------------------------------------

    def refresh(self, ended: bool = False) -> bool:
        """Index what the file gained since; start over when it was replaced. Whether rows
        changed. `ended`: no job writes the file, so a last line without its newline is
        whole (else it waits for its newline)."""
        if self.copy is not None:
            self.copy.update()
            if self.copy.generation != self.copied:  # a copy made anew: no index of it holds
                self.copied = self.copy.generation
                self._reset()
                self._saved_rows = max(self._saved_rows, 0)  # (none is read back)
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
            self._read_facts()  # where the facts thread stopped on an error
            return False
        before = self.rows
        self._extend(stat.st_size, ended)
        self._maybe_save()
        return self.rows != before

    def _reset(self) -> None:
        with self._lock:
            self.generation += 1
            self.size, self.head, self.head_length = 0, b"", 0
            self.start, self.length = np.zeros(0, np.int64), np.zeros(0, np.uint32)
            self._columns, self.labels = Table.empty().columns, {name: [] for name in LABELLED}
            self.known = self._next = 0
            self._table = None

    def _head(self, length: int) -> bytes:
        with open(self.path, "rb") as handle:
            return hashlib.sha256(handle.read(length)).digest()

    def _extend(self, end: int, ended: bool = False) -> None:
        starts, lengths, offset = find_lines(self.path, self.size, end, ended)
        if self.head_length < HEAD_BYTES:  # a small file's first bytes, as far as they go now
            self.head_length = min(HEAD_BYTES, offset)
            self.head = self._head(self.head_length)
        if not len(starts):
            self.size = offset
            return
        with self._lock:
            rows = self.rows + len(starts)
            self._make_room(rows)
            for name, column in self._columns.items():
                column[self.rows : rows] = PENDING_VALUES[name]
            # Lengths before starts, and the size last: a reader on another thread (a search)
            # that reads starts, lengths and size in that order sees no row past the lengths.
            self.length = np.concatenate([self.length, lengths])
            self.start = np.concatenate([self.start, starts])
            self.size = offset
            self._table = None
        self._read_facts()

    def _read_facts(self) -> None:
        """The pending rows' facts: read here where they are few, else by the facts thread
        (started where it does not run)."""
        with self._lock:
            if self._filling or self._closed or self._next >= self.rows:
                return
            here = self.rows - self._next <= INLINE_ROWS
            if not here:
                self._filling = True
                threading.Thread(target=self._fill, name="lmpress-view-facts", daemon=True).start()
        while here and self._read_block(INLINE_ROWS):
            pass

    def _make_room(self, rows: int) -> None:
        """Columns that hold `rows` rows and may be written (those read from disk may not)."""
        room = len(self._columns["status"])
        if rows <= room and self._columns["status"].flags.writeable:
            return
        size = rows if room == 0 else max(rows, room + room // 2)
        for name, column in self._columns.items():
            grown = np.empty(size, column.dtype)
            grown[: self.rows] = column[: self.rows]
            self._columns[name] = grown

    # --- the rows' facts ---------------------------------------------------------------------

    def _fill(self) -> None:
        """The facts thread: blocks of rows read in order until none is pending (the file may
        grow or be replaced meanwhile), then the index saved. A file that cannot be read stops
        it (the next refresh starts it again, or finds the file gone)."""
        try:
            while True:
                with self._lock:
                    many = self.rows - self._next > PROCESS_ROWS
                if many:
                    with PROCESSES_IN_USE:
                        self._read_in_processes()
                while self._read_block(BLOCK_ROWS):
                    pass
                self.save()
                with self._lock:
                    if self._next >= self.rows or self._closed:
                        return
        except OSError:
            return
        finally:
            with self._lock:
                self._filling = False
                self._lock.notify_all()

    def _read_in_processes(self) -> None:
        """The pending rows' facts read by a process a core (lines.Reader), blocks handed out
        in turn and put in in order. Where a reader cannot start or dies, the rest is left to
        this thread (which says why, if the file cannot be read)."""
        readers: list[Reader] = []
        ahead: deque = deque()  # (low, high, generation, reader), in the order sent
        try:
            readers = [Reader() for _ in range(min(MOST_PROCESSES, os.cpu_count() or 1))]
            idle = list(readers)
            while True:
                while idle and (taken := self._take(BLOCK_ROWS)):
                    low, high, generation, starts, lengths = taken
                    reader = idle.pop(0)
                    ahead.append((low, high, generation, reader))
                    reader.send(self.path, *self._read_as_args(), starts, lengths, low)
                if not ahead:
                    return
                low, high, generation, reader = ahead[0]
                self._put(low, high, generation, reader.receive())
                ahead.popleft()
                idle.append(reader)
        except (OSError, EOFError, pickle.PickleError, ValueError):  # a reader gone or garbled
            for low, high, generation, _ in ahead:  # to be read again, from the first
                self._put(low, high, generation, None)
        finally:
            for reader in readers:
                reader.close()

    def _take(self, most: int) -> tuple | None:
        """The next rows to read facts of (at most `most`, and CHUNK bytes): (low, high,
        generation, starts, lengths); None when none is pending."""
        with self._lock:
            low = self._next
            if low >= self.rows or self._closed:
                return None
            high = max(low + 1, int(np.searchsorted(self.start, self.start[low] + CHUNK)))
            high = min(high, self.rows, low + most)
            self._next = high
            return low, high, self.generation, self.start[low:high], self.length[low:high]

    def _put(self, low: int, high: int, generation: int, block: Table | None) -> None:
        """Rows low:high's facts into the table; None: they could not be read, and are to be
        read again. Nothing of a file replaced since (another generation)."""
        with self._lock:
            if generation != self.generation:
                return
            if block is None:
                self._next = min(self._next, low)
                return
            labels = {name: list(found) for name, found in self.labels.items()}
            for name, column in block.columns.items():
                if name in LABELLED:
                    column = recode(column, block.labels[name], labels[name])
                self._columns[name][low:high] = column
            self.labels, self.known, self._table = labels, high, None

    def _read_block(self, most: int) -> bool:
        """The facts of the next rows, read here; False when none is pending."""
        taken = self._take(most)
        if taken is None:
            return False
        low, high, generation, starts, lengths = taken
        try:
            block = read_facts(self.path, *self._read_as_args(), starts, lengths, low)
        except OSError:
            self._put(low, high, generation, None)
            raise
        self._put(low, high, generation, block)
        return True

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until every row's facts are in (and the index saved); whether they are."""
        with self._lock:
            return self._lock.wait_for(lambda: not self._filling, timeout)

    def close(self) -> None:
        """Stop the facts thread (after its block); the index is saved where it is whole."""
        with self._lock:
            self._closed = True
        self.save()

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
        with self._lock:
            self.start, self.length = arrays.pop("start"), arrays.pop("length")
            self._columns, self.labels = arrays, header["labels"]
            self.known = self._next = self.rows
            self._table = None
            self.size, self.inode = header["size"], header["inode"]
            self.head, self.head_length = bytes.fromhex(header["head"]), header["head_length"]
        self._saved_rows, self._saved_at = self.rows, time.monotonic()

    def _read_as(self) -> list[str | None]:
        """What the facts were read as: an index read otherwise is not this one."""
        return [self.kind.value, self.step, self.model, self.id_column]

    def _read_as_args(self) -> tuple:
        return self.kind, self.step, self.model, self.id_column

    def _maybe_save(self) -> None:
        if not self.keep:
            return
        grew = self.rows - max(self._saved_rows, 0)
        if self._saved_rows < 0 or (grew and time.monotonic() - self._saved_at > SAVE_EVERY_S):
            self.save()

    def save(self) -> None:
        """Write the index beside the file, or in lmpress's cache where that folder refuses
        it; where neither takes it, the next open indexes the file again. Only a whole index
        is written: one with facts still pending waits for them."""
        with self._lock:
            if not self.keep or not self.rows or self.known < self.rows:
                return
            table, rows, size, head = self.table, self.rows, self.size, self.head
            arrays = {"start": self.start, "length": self.length, **table.columns}
        layout, offset = {}, 0
        for name, column in arrays.items():
            layout[name] = (column.dtype.str, offset, len(column))
            offset += -(-column.nbytes // 8) * 8
        header = {
            "version": VERSION,
            "read_as": self._read_as(),
            "file": self.path.name,
            "size": size,
            "inode": self.inode,
            "head": head.hex(),
            "head_length": self.head_length,
            "labels": table.labels,
            "arrays": layout,  # offsets from the end of the header
        }
        text = json.dumps(header).encode()
        text += b" " * (-len(text) % 8)
        for store in self.stores:
            if _write(store, MAGIC + len(text).to_bytes(8, "little") + text, arrays.values()):
                break
        else:
            return
        self._saved_rows, self._saved_at = rows, time.monotonic()


def _write(store: Path, head: bytes, arrays) -> bool:
    """The index file, through a scratch file renamed over it; False where it cannot be."""
    # Named for the thread too: the facts thread and a request may both write an index.
    scratch = store.with_name(f".{store.name}.{os.getpid()}.{threading.get_ident()}")
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
