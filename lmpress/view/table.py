"""The per-row columns the viewer filters and plots on, held as numpy arrays: one `Table` for
each file of a source (its index), and one for the source, their concatenation.

Text facts (error kind, model, step, finish reason) are small integer codes into a list of
labels, so a filter is a comparison of integers and a million rows cost two bytes each.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from lmpress.view.records import Status

# Each fact's column and its type; `id` is kept as a 64-bit digest (compare joins on it).
DTYPES: dict[str, type] = {
    "id_hash": np.uint64,
    "text_hash": np.uint64,
    "status": np.uint8,
    "cached": np.bool_,
    "error_kind": np.int16,
    "model": np.int16,
    "step": np.int16,
    "finish_reason": np.int16,
    "prompt_tokens": np.int32,
    "completion_tokens": np.int32,
    "latency_s": np.float32,
    "cost_usd": np.float64,
}
LABELLED = ("error_kind", "model", "step", "finish_reason")
NONE = -1  # the code of a fact the row does not state
PENDING_VALUES = {
    **dict.fromkeys(DTYPES, 0), **dict.fromkeys(LABELLED, NONE),
    "status": Status.PENDING.value, "cached": False, "prompt_tokens": -1,
    "completion_tokens": -1, "latency_s": np.nan, "cost_usd": np.nan,
}  # fmt: skip
MOST_LABELS = 30_000  # distinct labels a column keeps (its codes are 16 bits); others: NONE
CHUNK_ROWS = 1 << 16  # rows gathered as Python objects before they become arrays


def id_hash(rid: str | None, position: int) -> int:
    """A row's id as 64 bits; a row without one is known by its position."""
    return _digest(rid if rid is not None else f"\x00#{position}")


def text_hash(text: str | None) -> int:
    """What compare tells two replies apart by (0: the row has no text)."""
    return _digest(text) if text else 0


def _digest(text: str) -> int:
    data = text.encode("utf-8", "replace")
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


@dataclass
class Table:
    columns: dict[str, np.ndarray]
    labels: dict[str, list[str]] = field(default_factory=lambda: {k: [] for k in LABELLED})

    @classmethod
    def empty(cls) -> Table:
        return cls({name: np.zeros(0, dtype) for name, dtype in DTYPES.items()})

    @classmethod
    def pending(cls, rows: int) -> Table:
        """Rows whose facts are not read yet: Status.PENDING, and nothing known, so that no
        filter but none at all takes them."""
        return cls(
            {name: np.full(rows, PENDING_VALUES[name], dtype) for name, dtype in DTYPES.items()}
        )

    @property
    def rows(self) -> int:
        return len(self.columns["status"])

    def label(self, name: str, code: int) -> str | None:
        return None if code < 0 else self.labels[name][code]

    def code(self, name: str, value: str) -> int | None:
        """The code of a label; None where no row has it."""
        try:
            return self.labels[name].index(value)
        except ValueError:
            return None

    def counts(self, name: str, mask: np.ndarray | None = None) -> dict[str, int]:
        """How many rows (of `mask`) have each label of a labelled column."""
        codes = self.columns[name] if mask is None else self.columns[name][mask]
        found = np.bincount(codes[codes >= 0].astype(np.int64), minlength=len(self.labels[name]))
        return {self.labels[name][i]: int(n) for i, n in enumerate(found) if n}


def concat(tables: Sequence[Table]) -> Table:
    """The tables one after the other, their labels merged into one list per column."""
    if len(tables) == 1:
        return tables[0]
    if not tables:
        return Table.empty()
    labels: dict[str, list[str]] = {name: [] for name in LABELLED}
    columns: dict[str, list[np.ndarray]] = {name: [] for name in DTYPES}
    for table in tables:
        for name in DTYPES:
            column = table.columns[name]
            if name in LABELLED:
                column = recode(column, table.labels[name], labels[name])
            columns[name].append(column)
    return Table({name: np.concatenate(parts) for name, parts in columns.items()}, labels)


def recode(codes: np.ndarray, labels: list[str], into: list[str]) -> np.ndarray:
    """Codes into `labels` as codes into `into`, where labels it lacks are added (up to
    MOST_LABELS; a label past those is NONE)."""
    mapping = np.array([_code_in(into, label) for label in labels] or [0], dtype=np.int16)
    return np.where(codes >= 0, mapping[np.maximum(codes, 0)], NONE).astype(np.int16)


def _code_in(labels: list[str], label: str) -> int:
    try:
        return labels.index(label)
    except ValueError:
        if len(labels) >= MOST_LABELS:
            return NONE
        labels.append(label)
        return len(labels) - 1


class TableBuilder:
    """Rows' facts gathered one at a time (`add`), then made into a Table."""

    def __init__(self, labels: dict[str, list[str]] | None = None, first: int = 0):
        self.labels = {name: list((labels or {}).get(name, [])) for name in LABELLED}
        self._codes = {name: {v: i for i, v in enumerate(self.labels[name])} for name in LABELLED}
        self.values: dict[str, list] = {name: [] for name in DTYPES}
        self.chunks: dict[str, list[np.ndarray]] = {name: [] for name in DTYPES}
        self.position = first  # the row number of the next row, for an id-less row's digest

    def _code(self, name: str, value: str | None) -> int:
        if not isinstance(value, str):
            return NONE
        codes = self._codes[name]
        code = codes.get(value)
        if code is None:
            if len(codes) >= MOST_LABELS:
                return NONE
            code = codes[value] = len(self.labels[name])
            self.labels[name].append(value)
        return code

    def _flush(self) -> None:
        """The rows gathered so far as arrays: a row's Python objects live only until then."""
        for name, dtype in DTYPES.items():
            self.chunks[name].append(np.array(self.values[name], dtype))
            self.values[name] = []

    def add(self, facts: tuple) -> None:
        """One row's facts, in `records.FACTS` order."""
        rid, status, cached, error_kind, model, step, finish, prompt, completion, latency, cost = (
            facts[:11]
        )
        values, code = self.values, self._code
        values["id_hash"].append(id_hash(rid, self.position))
        values["text_hash"].append(text_hash(facts[11]))
        values["status"].append(int(status))
        values["cached"].append(cached)
        values["error_kind"].append(code("error_kind", error_kind))
        values["model"].append(code("model", model))
        values["step"].append(code("step", step))
        values["finish_reason"].append(code("finish_reason", finish))
        values["prompt_tokens"].append(prompt if -1 <= prompt < 2**31 else -1)
        values["completion_tokens"].append(completion if -1 <= completion < 2**31 else -1)
        values["latency_s"].append(latency)
        values["cost_usd"].append(cost)
        self.position += 1
        if len(values["status"]) >= CHUNK_ROWS:
            self._flush()

    def table(self) -> Table:
        self._flush()
        columns = {name: np.concatenate(self.chunks[name]) for name in DTYPES}
        self.chunks = {name: [] for name in DTYPES}
        return Table(columns, self.labels)


def finite(values: np.ndarray) -> np.ndarray:
    """The values that are known: not NaN for floats, not -1 for counts."""
    if values.dtype.kind == "f":
        return values[~np.isnan(values)]
    return values[values >= 0]


def total(values: np.ndarray) -> float | None:
    """The sum of the known values; None where none is known."""
    known = finite(values)
    return float(known.sum(dtype=np.float64)) if len(known) else None
