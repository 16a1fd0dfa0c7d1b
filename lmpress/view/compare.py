"""Two outputs side by side by row id (/api/compare, /api/compare_row): two sources, or two
models of one --models output (`a:MODEL`).

The rows are paired on the index's id digests and told apart by the digests of their texts (the
reply, or why the row failed), so listing what differs in a million rows reads no line; only
the page shown is read. One row's two replies are diffed word by word (difflib). While a
side's facts are still being read (index.py), only its rows read so far are paired.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from lmpress.view.records import Status, reply, summary
from lmpress.view.rows import one_row, rows_with_id, shown_id
from lmpress.view.sources import OpenSource, Snapshot

ONLY = ("all", "differs", "same", "only_a", "only_b")
WORDS = re.compile(r"\s+|\w+|[^\w\s]")
MOST_WORDS = 20_000  # longer replies are compared whole, not word by word (difflib is quadratic)


@dataclass
class Side:
    """One side of a comparison: a source, the rows it offers (all, or one model's)."""

    source: OpenSource
    snapshot: Snapshot
    rows: np.ndarray

    @property
    def hashes(self) -> np.ndarray:
        return self.snapshot.table.columns["id_hash"][self.rows]


def side(source: OpenSource, model: str | None) -> Side:
    snapshot = source.refresh()
    table = snapshot.table
    if model is None:
        chosen = np.arange(table.rows)
        if snapshot.indexing is not None:
            chosen = np.flatnonzero(table.columns["status"] != Status.PENDING)
        return Side(source, snapshot, chosen)
    code = table.code("model", model)
    chosen = np.flatnonzero(table.columns["model"] == code) if code is not None else []
    return Side(source, snapshot, np.asarray(chosen, np.int64))


def pairs(a: Side, b: Side, only: str) -> tuple[np.ndarray, np.ndarray]:
    """Row numbers paired by id, A's order then the rows only B has: (in A, in B), -1 where a
    side lacks the row; the first row of an id where a side holds it twice."""
    ids_a, first_a = np.unique(a.hashes, return_index=True)
    ids_b, first_b = np.unique(b.hashes, return_index=True)
    _, in_a, in_b = np.intersect1d(ids_a, ids_b, assume_unique=True, return_indices=True)
    partner = np.full(len(ids_a), -1, np.int64)
    partner[in_a] = b.rows[first_b[in_b]]
    mine = a.rows[first_a]
    order = np.argsort(mine, kind="stable")
    left, right = mine[order], partner[order]
    only_b = np.setdiff1d(np.arange(len(ids_b)), in_b, assume_unique=True)
    extra = np.sort(b.rows[first_b[only_b]])
    left = np.concatenate([left, np.full(len(extra), -1, np.int64)])
    right = np.concatenate([right, extra])
    if only == "all":
        return left, right
    if only == "only_a":
        keep = right < 0
    elif only == "only_b":
        keep = left < 0
    else:
        both = (left >= 0) & (right >= 0)
        texts_a = a.snapshot.table.columns["text_hash"][np.maximum(left, 0)]
        texts_b = b.snapshot.table.columns["text_hash"][np.maximum(right, 0)]
        keep = both & ((texts_a == texts_b) if only == "same" else (texts_a != texts_b))
    return left[keep], right[keep]


def listing(a: Side, b: Side, only: str, offset: int, limit: int) -> dict[str, Any]:
    left, right = pairs(a, b, only)
    page_a, page_b = left[offset : offset + limit], right[offset : offset + limit]
    read_a = _texts(a, [int(n) for n in page_a if n >= 0])
    read_b = _texts(b, [int(n) for n in page_b if n >= 0])
    rows = []
    for n_a, n_b in zip(page_a.tolist(), page_b.tolist(), strict=True):
        one = read_a.get(n_a)
        two = read_b.get(n_b)
        rid = (one or two or {}).get("id")
        same = (
            one is not None
            and two is not None
            and a.snapshot.table.columns["text_hash"][n_a]
            == b.snapshot.table.columns["text_hash"][n_b]
        )
        rows.append(
            {
                "id": rid,
                "a": None if one is None else {"n": n_a, "text": one["text"]},
                "b": None if two is None else {"n": n_b, "text": two["text"]},
                "same": bool(same),
            }
        )
    partial = a.snapshot.indexing is not None or b.snapshot.indexing is not None
    return {"total": int(len(left)), "offset": offset, "rows": rows, "partial": partial}


def _texts(side: Side, rows: list[int]) -> dict[int, dict[str, Any]]:
    """Each row's id and text: its reply, or why it failed."""
    out = {}
    for row in side.source.read(side.snapshot, rows):
        value = row.value if isinstance(row.value, dict) else {}
        text = reply(row.segment.kind, value)["text"]
        if text is None:
            text = summary(row.segment.kind, row.value)
        out[row.n] = {"id": shown_id(row), "text": text}
    return out


def one(a: Side, b: Side, rid: str) -> dict[str, Any]:
    """Both rows of one id, and the word diff of their replies."""
    found_a = rows_with_id(a.snapshot, rid, a.rows)
    found_b = rows_with_id(b.snapshot, rid, b.rows)
    row_a = one_row(a.source, a.snapshot, int(found_a[0])) if len(found_a) else None
    row_b = one_row(b.source, b.snapshot, int(found_b[0])) if len(found_b) else None
    return {"id": rid, "a": row_a, "b": row_b, "diff": word_diff(_said(row_a), _said(row_b))}


def _said(row: dict[str, Any] | None) -> str:
    if row is None:
        return ""
    text = row["reply"]["text"]
    if text is None and row["error"] is not None:
        text = row["error"]["message"]
    return text or ""


def word_diff(a: str, b: str) -> list[dict[str, str]]:
    """The two texts as runs of words that are equal, deleted (in A only), inserted (in B
    only) or replaced; whitespace and punctuation are words of their own."""
    words_a, words_b = WORDS.findall(a), WORDS.findall(b)
    if len(words_a) + len(words_b) > MOST_WORDS:
        return [{"op": "equal" if a == b else "replace", "a": a, "b": b}]
    matcher = difflib.SequenceMatcher(None, words_a, words_b, autojunk=False)
    return [
        {"op": op, "a": "".join(words_a[i1:i2]), "b": "".join(words_b[j1:j2])}
        for op, i1, i2, j1, j2 in matcher.get_opcodes()
    ]
