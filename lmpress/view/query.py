"""Which rows of a source a request asks for: filters on the index's columns (arrays compared,
no line read), full-text search and a column's value.

Search reads the file's bytes, not its rows: each window of whole rows is mapped (mmap),
lowered (ASCII) and searched for the text as JSON writes it, hit by hit while few rows hold it
and line by line once many do (`scan`); hits are turned into their rows by the line offsets
(searchsorted), so a row is found once and a row that does not match is never parsed. What
was searched is kept: a file that grew is searched from where the last search ended. A column's value is searched the same way, and
only the rows that hold its text are parsed to compare the value itself.
"""

from __future__ import annotations

import json
import mmap
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from lmpress.view.index import JsonlIndex
from lmpress.view.lines import decode_line
from lmpress.view.parquet import ParquetIndex, row_text
from lmpress.view.records import RowKind, Status
from lmpress.view.sources import KEPT_QUERIES, OpenSource, Snapshot

WINDOW = 8 << 20  # bytes mapped and searched at a time: bounds the memory a search takes
ONE_PAGE_MOST = 1000  # rows one request may ask for
# A window's rows are searched hit by hit until a FEW-th of them matched, then line by line.
FEW = 32
KEPT_SEARCHES = 64  # searches whose rows are kept (per file), to page and to resume them
STATUSES = {"ok": Status.OK, "failed": Status.FAILED, "dropped": Status.DROPPED}
FACT_FILTERS = ("status", "error_kind", "model", "step", "finish_reason")


@dataclass(frozen=True)
class Filters:
    """The filters of /api/rows, each None when not asked."""

    status: str | None = None  # ok, failed, dropped, or cached
    error_kind: str | None = None
    model: str | None = None
    step: str | None = None
    finish_reason: str | None = None
    column: str | None = None
    value: str | None = None
    q: str | None = None

    @classmethod
    def of(cls, params: dict[str, Any]) -> Filters:
        return cls(**{f.name: params.get(f.name) or None for f in fields(cls)})

    @property
    def on_facts(self) -> bool:
        """Whether a filter reads the rows' facts (the index's columns): while those are being
        read, it finds only the rows read so far. Search and a column's value read the lines,
        and find every row at once."""
        return any(getattr(self, name) is not None for name in FACT_FILTERS)


class QueryError(ValueError):
    """A filter that cannot be applied, said in one line."""


def select(source: OpenSource, snapshot: Snapshot, filters: Filters) -> np.ndarray:
    """The row numbers that pass every filter, in order (kept for the next page). A row whose
    facts are not read yet (Status.PENDING) passes no filter on facts."""
    key = (filters, snapshot.rows, snapshot.indexed)
    with source.kept:
        found = source.queries.get(key)
        if found is not None:
            source.queries.move_to_end(key)
            return found
    table = snapshot.table
    mask = np.ones(table.rows, bool)
    if filters.status == "cached":
        mask &= table.columns["cached"]
    elif filters.status is not None:
        if filters.status not in STATUSES:
            raise QueryError(f"status={filters.status}: use ok, failed, dropped or cached")
        mask &= table.columns["status"] == STATUSES[filters.status]
    for name in FACT_FILTERS[1:]:
        value = getattr(filters, name)
        if value is not None:
            code = table.code(name, value)
            mask &= table.columns[name] == (code if code is not None else -2)
    if filters.q:
        mask &= _member(search(source, snapshot, filters.q), table.rows)
    if filters.column:
        if filters.value is None:
            raise QueryError(f"column={filters.column}: give the value to match as value=V")
        mask &= _member(column_equals(source, snapshot, filters.column, filters.value), table.rows)
    found = np.flatnonzero(mask)
    with source.kept:
        source.queries[key] = found
        while len(source.queries) > KEPT_QUERIES:
            source.queries.popitem(last=False)
    return found


def _member(rows: np.ndarray, count: int) -> np.ndarray:
    mask = np.zeros(count, bool)
    mask[rows[rows < count]] = True
    return mask


# --- search ---------------------------------------------------------------------------------


def needles(text: str) -> list[bytes]:
    """The text as it stands in a JSON line (escaped as JSON escapes it), its ASCII letters
    lowered as the file's bytes are (`bytes.lower`): "École" finds "École" and "école"."""
    forms = {json.dumps(text, ensure_ascii=False)[1:-1], json.dumps(text)[1:-1]}
    return sorted({form.encode().lower() for form in forms if form})


def search(source: OpenSource, snapshot: Snapshot, text: str) -> np.ndarray:
    """The source's rows whose line holds `text` (ASCII letters in any case), among the rows
    the snapshot holds. What a file was searched for is kept, with how far, and a file that
    grew is searched from there; one replaced since (a new generation) is searched anew."""
    found = []
    for part, index in enumerate(snapshot.indexes):
        first, count = int(snapshot.bounds[part]), int(np.diff(snapshot.bounds)[part])
        key = (text, id(index), getattr(index, "generation", 0))
        scanned, rows = source.searches.get(key, (0, np.zeros(0, np.int64)))
        if isinstance(index, JsonlIndex):
            if scanned < index.size:
                more, scanned = scan(index, needles(text), scanned)
                rows = np.concatenate([rows, more])
        elif scanned != index.rows:
            rows, scanned = scan_rows(index, text), index.rows
        with source.kept:
            source.searches[key] = (scanned, rows)
            while len(source.searches) > KEPT_SEARCHES:
                source.searches.pop(next(iter(source.searches)))
        found.append(rows[rows < count] + first)
    return np.concatenate(found) if found else np.zeros(0, np.int64)


def scan(index: JsonlIndex, words: list[bytes], begin: int = 0) -> tuple[np.ndarray, int]:
    """The rows of a JSONL file whose line holds any of `words` (lowered), from byte `begin`
    to the end of what is indexed, and the byte it searched to. The index may grow on another
    thread meanwhile (a live job): the rows it had when read, and no byte past them.

    A window is whole rows (WINDOW bytes of them, or one longer row). Each hit is found and the
    rows between skipped while the word is in few of them; once a FEW-th of the window's rows
    matched, the rest is split at its newlines and each line tested with `in`, one test a row.
    One round a hit took 2.6 s over a million rows for a word most rows hold; splitting every
    window made a rare word's search three times as slow."""
    lengths, starts = index.length, index.start  # in the order _extend writes them
    n = min(len(starts), len(lengths))
    starts, lengths = starts[:n], lengths[:n]
    size = int(starts[-1]) + int(lengths[-1]) if n else 0
    if size <= begin:
        return np.zeros(0, np.int64), begin
    found = []
    row = int(np.searchsorted(starts, begin))
    with open(index.path, "rb") as handle:
        while row < n:
            low = int(starts[row])
            last = min(n, max(row + 1, int(np.searchsorted(starts, low + WINDOW))))
            high = int(starts[last - 1]) + int(lengths[last - 1])
            base = low - low % mmap.ALLOCATIONGRANULARITY
            with mmap.mmap(
                handle.fileno(), high - base, offset=base, access=mmap.ACCESS_READ
            ) as view:
                data = view[low - base :].lower()
            # Hit by hit while the word is in few rows; past that, line by line.
            rows, at = _rows_of_hits(data, low, words, starts, lengths, (last - row) // FEW)
            found.append(rows)
            if at is not None:
                found.append(_rows_of_lines(data[at:], low + at, words, starts, lengths))
            row = last
    return (np.concatenate(found) if found else np.zeros(0, np.int64)).astype(np.int64), size


def _rows_of_hits(
    data: bytes, low: int, words: list[bytes], starts, lengths, most: int
) -> tuple[np.ndarray, int | None]:
    """The rows of window `data` (whole rows from byte `low`) holding any of `words`, found
    hit by hit: each hit's row, and on from that row's end. Past `most` rows it stops: the
    rows so far, and the offset in `data` of the next row (None where it finished)."""
    rows: list[int] = []
    at = 0
    while True:
        hits = [h for h in (data.find(w, at) for w in words) if h >= 0]
        if not hits:
            return np.array(rows, np.int64), None
        if len(rows) >= most:
            return np.array(rows, np.int64), at
        hit = low + min(hits)
        row = int(np.searchsorted(starts, hit, side="right")) - 1
        if row >= 0 and hit < starts[row] + lengths[row]:
            rows.append(row)
            at = int(starts[row] + lengths[row]) - low
        else:  # between lines (a blank line): not a row
            at = hit - low + 1


def _rows_of_lines(data: bytes, low: int, words: list[bytes], starts, lengths) -> np.ndarray:
    """The same, line by line: one `in` a line, for a word most rows hold."""
    first, second = words[0], words[-1]  # (needles gives one or two)
    lines = data.split(b"\n")
    hit = [i for i, line in enumerate(lines) if first in line or second in line]
    newlines = np.flatnonzero(np.frombuffer(data, np.uint8) == ord("\n"))
    line_starts = low + np.concatenate([[0], newlines + 1])[hit]
    rows = np.searchsorted(starts, line_starts, side="right") - 1
    inside = (rows >= 0) & (line_starts < starts[rows] + lengths[rows])
    return rows[inside]  # (a line that is no row: not one)


def scan_rows(index: ParquetIndex, text: str) -> np.ndarray:
    """The rows of a Parquet file whose JSON text holds `text` (a row group at a time)."""
    wanted = text.lower()
    rows = []
    for group in range(index.groups):
        first = int(index.bounds[group])
        for i, row in enumerate(index.group_rows(group)):
            if wanted in row_text(row).lower():
                rows.append(first + i)
    return np.array(rows, np.int64)


# --- a column's value -----------------------------------------------------------------------


def column_equals(source: OpenSource, snapshot: Snapshot, column: str, value: str) -> np.ndarray:
    """The rows whose `column` (dotted for a nested key: metadata.topic) is `value` (as text,
    or as the JSON value it spells: 3, true, null)."""
    try:
        wanted: Any = json.loads(value)
    except ValueError:
        wanted = value
    candidates = search(source, snapshot, value) if value else None
    if candidates is None:
        candidates = np.arange(snapshot.rows)
    rows = []
    for batch in range(0, len(candidates), 512):
        chunk = candidates[batch : batch + 512].tolist()
        for row in source.read(snapshot, chunk):
            held = _lookup(row.value, row.segment.kind, column)
            if held is not _MISSING and (held == wanted or _as_text(held) == value):
                rows.append(row.n)
    return np.array(rows, np.int64)


_MISSING = object()


def _lookup(value: Any, kind: RowKind, column: str) -> Any:
    if kind is RowKind.JOURNAL and isinstance(value, dict):
        value = {**(value.get("columns") or {}), **value}
    if kind is RowKind.REJECTS and isinstance(value, dict):
        value = {**(value.get("row") or {}), **value}
    for key in column.split("."):
        if isinstance(value, str) and kind is RowKind.PARQUET:
            value = decode_line(value.encode())  # a column Parquet holds as JSON text
        if not isinstance(value, dict) or key not in value:
            return _MISSING
        value = value[key]
    return value


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
