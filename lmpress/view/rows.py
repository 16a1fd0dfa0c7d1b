"""Rows as the API hands them to the page: a line of the rows table (/api/rows) and the whole
row (/api/row). The table's facts come from the index; the id, the preview and the row itself
from the line, read at its offset. A row whose facts the index has not read yet (a file opened
moments ago) has them read from its line here, so the first pages show every fact at once.
Everything is text for the page to set as text.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

import lmpress.view.records as records
from lmpress.view.records import Status
from lmpress.view.sources import OpenSource, Row, Snapshot
from lmpress.view.table import LABELLED, Table, id_hash


def shown_id(row: Row) -> str:
    """The row's id; `#n` for a row that has none (a dataset's row)."""
    found = records.facts(*_read_as(row))[0]
    return found if found is not None else f"#{row.n}"


def _read_as(row: Row) -> tuple:
    """records.facts's arguments for the row, as its file's index read it."""
    segment = row.segment
    return segment.kind, row.value, segment.step, segment.model, segment.id_column


def _facts(table: Table, row: Row) -> dict[str, Any]:
    """The facts the rows table shows: the index's, or the line's where it has not read them."""
    columns, n = table.columns, row.n
    if columns["status"][n] == Status.PENDING:
        found = records.facts(*_read_as(row))
        _, status, cached, error_kind, model, step, finish, prompt, completion, latency = found[:10]
    else:
        status, cached = Status(int(columns["status"][n])), bool(columns["cached"][n])
        error_kind, model, step, finish = (
            table.label(name, int(columns[name][n])) for name in LABELLED
        )
        prompt, completion = int(columns["prompt_tokens"][n]), int(columns["completion_tokens"][n])
        latency = float(columns["latency_s"][n])
    return {
        "status": status.word,
        "cached": cached,
        "model": model,
        "step": step,
        "finish_reason": finish,
        "error_kind": error_kind,
        "prompt_tokens": prompt if prompt >= 0 else None,
        "completion_tokens": completion if completion >= 0 else None,
        "latency_s": None if math.isnan(latency) else round(float(np.float32(latency)), 4),
    }


def table_rows(
    source: OpenSource, snapshot: Snapshot, chosen: np.ndarray, offset: int, limit: int
) -> list[dict[str, Any]]:
    """The rows table's lines for rows chosen[offset:offset+limit]."""
    page = [int(n) for n in chosen[offset : offset + limit]]
    out = []
    for row in source.read(snapshot, page):
        out.append(
            {
                "n": row.n,
                "id": shown_id(row),
                **_facts(snapshot.table, row),
                "preview": records.summary(row.segment.kind, row.value),
            }
        )
    return out


def one_row(source: OpenSource, snapshot: Snapshot, n: int) -> dict[str, Any] | None:
    """The whole row n as /api/row gives it; None where the source has no such row."""
    if not 0 <= n < snapshot.rows:
        return None
    (row,) = source.read(snapshot, [n])
    kind = row.segment.kind
    facts = _facts(snapshot.table, row)
    return {
        "n": n,
        "id": shown_id(row),
        **facts,
        "part": row.segment.part,
        **records.detail(kind, row.value),
        "raw": row.raw,
    }


def rows_with_id(snapshot: Snapshot, rid: str, among: np.ndarray | None = None) -> np.ndarray:
    """The row numbers whose id is `rid` (of `among`, where given)."""
    wanted = np.uint64(id_hash(rid, 0))
    hashes = snapshot.table.columns["id_hash"]
    found = np.flatnonzero(hashes == wanted)
    return found if among is None else np.intersect1d(found, among)
