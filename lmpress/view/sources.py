"""An output as the viewer reads it: the files `layout.find` names, an index for each
(`index.JsonlIndex`, `parquet.ParquetIndex`), and their tables put end to end, so that row `n`
of the source is a row of one file and every filter runs on one set of arrays.

A source is looked at again (`refresh`) at most every REFRESH_S when the page asks: a file that
grew is indexed from where it ended, one that appeared (the errors file, a model's part, the
Parquet file a job writes at its end) is indexed and joined in. The page's requests run on
several threads at once, so a source's state changes under its lock, and what a request reads
is the state it found (`Snapshot`), never half of a refresh.

A file opened for the first time has its rows at once and their facts a little later (index.py
reads them behind the page): a snapshot counts the rows whose facts it holds (`indexed`), and
the answers built on facts say how far that got (`indexing`) until it is all of them.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lmpress.view.index import JsonlIndex
from lmpress.view.layout import Layout, Segment, find, holder, read_json
from lmpress.view.parquet import ArrowIndex, ParquetIndex
from lmpress.view.records import Status
from lmpress.view.table import Table, concat
from lmpress.vocabulary.errors import InputError

REFRESH_S = 0.2  # a source is looked at again at most this often
RATE_WINDOW_S = 30.0  # the live rate is measured over this much of the recent past
KEPT_QUERIES = 16  # filtered row lists kept, so that scrolling does not filter again

AnyIndex = JsonlIndex | ParquetIndex


@dataclass(frozen=True)
class Snapshot:
    """A source's files and rows at one moment."""

    layout: Layout
    indexes: tuple[AnyIndex, ...]
    bounds: np.ndarray  # file i holds the source's rows bounds[i]:bounds[i+1]
    table: Table
    indexed: int  # rows whose facts `table` holds; the others are Status.PENDING

    @property
    def rows(self) -> int:
        return int(self.bounds[-1])

    @property
    def indexing(self) -> dict[str, int] | None:
        """How far the rows' facts are read, while some are not: {"indexed", "rows"}."""
        if self.indexed >= self.rows:
            return None
        return {"indexed": self.indexed, "rows": self.rows}

    def locate(self, n: int) -> tuple[int, int]:
        """(the file, the row within it) of the source's row n."""
        part = int(np.searchsorted(self.bounds, n, side="right")) - 1
        return part, n - int(self.bounds[part])


@dataclass
class Row:
    """One row read back: where it is, what it says, its line."""

    n: int
    segment: Segment
    value: Any
    raw: str


@dataclass
class LiveRate:
    """Rows counted as the viewer looked, for the rate of a running job."""

    seen: list[tuple[float, int]] = field(default_factory=list)

    def observe(self, rows: int) -> None:
        now = time.monotonic()
        self.seen.append((now, rows))
        while len(self.seen) > 2 and now - self.seen[1][0] > RATE_WINDOW_S:
            self.seen.pop(0)

    def rate(self) -> float | None:
        if len(self.seen) < 2 or self.seen[-1][0] - self.seen[0][0] < 1.0:
            return None
        (t0, r0), (t1, r1) = self.seen[0], self.seen[-1]
        return max(r1 - r0, 0) / (t1 - t0)


class OpenSource:
    def __init__(self, given: str, name: str = "a", keep: bool = True):
        """`keep`: keep each file's index beside it (the viewer); else in memory (a report)."""
        self.given, self.name, self.keep = given, name, keep
        self._lock = threading.Lock()
        self._indexes: dict[Segment, AnyIndex] = {}
        self._checked = 0.0
        self.live = LiveRate()
        self.kept = threading.Lock()  # guards the kept queries and searches below
        self.queries: OrderedDict[tuple, np.ndarray] = OrderedDict()
        self.searches: dict[tuple, tuple[int, np.ndarray]] = {}
        self.snapshot = self._look(find(given))

    def refresh(self, force: bool = False) -> Snapshot:
        """The source as it is now (looked at again when REFRESH_S has passed)."""
        with self._lock:
            if force or time.monotonic() - self._checked >= REFRESH_S:
                try:
                    layout = find(self.given)
                except InputError:  # gone while viewed: what was read stays on show
                    layout = self.snapshot.layout
                self.snapshot = self._look(layout)
            return self.snapshot

    def _look(self, layout: Layout) -> Snapshot:
        self._checked = time.monotonic()
        indexes, changed = [], False
        # With no job writing, a last line without its newline (a file written by hand or by
        # another tool) is a row; while one writes, it may be half a line, and is left.
        ended = all(holder(lock) is None for lock in layout.locks)
        for segment in layout.segments:
            index = self._indexes.get(segment)
            if index is None:
                kind = (
                    ArrowIndex if segment.arrow else ParquetIndex if segment.parquet else JsonlIndex
                )
                index = kind(
                    segment.path,
                    segment.kind,
                    segment.step,
                    segment.model,
                    self.keep,
                    id_column=segment.id_column,
                )
                self._indexes[segment] = index
            changed = index.refresh(ended) or changed
            indexes.append(index)
        before: Snapshot | None = getattr(self, "snapshot", None)
        known = sum(index.known for index in indexes)
        if (
            before is not None
            and not changed
            and before.indexes == tuple(indexes)
            and before.indexed == known
        ):
            return Snapshot(layout, before.indexes, before.bounds, before.table, before.indexed)
        with self.kept:
            self.queries.clear()
        # One copy of the facts, made while no facts thread writes: a file's own columns where
        # it stands alone and whole, their concatenation where there are several.
        with ExitStack() as held:
            tables = [held.enter_context(index.facts()) for index in indexes]
            table = concat(tables)
            if len(tables) == 1 and indexes[0].known < indexes[0].rows:
                table = Table({name: c.copy() for name, c in table.columns.items()}, table.labels)
        counts = [table.rows for table in tables]
        bounds = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
        pending = int(np.count_nonzero(table.columns["status"] == Status.PENDING))
        return Snapshot(layout, tuple(indexes), bounds, table, table.rows - pending)

    def read(self, snapshot: Snapshot, rows: list[int]) -> list[Row]:
        """These rows of the snapshot, parsed, in the order asked."""
        by_part: dict[int, list[tuple[int, int]]] = {}
        for place, n in enumerate(rows):
            part, local = snapshot.locate(n)
            by_part.setdefault(part, []).append((place, local))
        out: list[Row | None] = [None] * len(rows)
        with self._lock:
            for part, wanted in by_part.items():
                index = snapshot.indexes[part]
                found = index.records([local for _, local in wanted])
                for (place, _), (value, raw) in zip(wanted, found, strict=True):
                    segment = snapshot.layout.segments[part]
                    out[place] = Row(rows[place], segment, value, raw)
        return [row for row in out if row is not None]

    def wait(self) -> Snapshot:
        """The source once every row's facts are read (what a report waits for, and a test)."""
        while True:
            with self._lock:
                indexes = list(self._indexes.values())
            for index in indexes:
                index.wait()
            snapshot = self.refresh(force=True)
            if snapshot.indexed == snapshot.rows:
                return snapshot

    def close(self) -> None:
        """Stop reading facts; write back the indexes of files that grew while viewed."""
        with self._lock:
            for index in self._indexes.values():
                index.close()

    # --- what a running job says -------------------------------------------------------------

    def running(self, snapshot: Snapshot) -> dict[str, Any] | None:
        """The lock record of the job writing this source (its pid, when it started, the rows
        it was given), where one runs now."""
        records = [r for r in (holder(lock) for lock in snapshot.layout.locks) if r is not None]
        if not records:
            return None
        totals = [r["rows_total"] for r in records if isinstance(r.get("rows_total"), int)]
        since = min(float(r.get("since", time.time())) for r in records)
        if totals and len(snapshot.layout.locks) > 1:  # a --models job: each part every row
            totals = [max(totals) * (len(snapshot.layout.locks) - 1)]
        return {"since": since, "rows_total": totals[0] if totals else None}

    def problems(self, snapshot: Snapshot) -> list[str]:
        """What stopped a file being read to its end (damaged compressed data), one line each."""
        copies = [getattr(index, "copy", None) for index in snapshot.indexes]
        return [copy.problem for copy in copies if copy is not None and copy.problem]

    def summary(self, snapshot: Snapshot) -> dict[str, Any] | None:
        found = read_json(snapshot.layout.summary)
        return found if isinstance(found, dict) else None
