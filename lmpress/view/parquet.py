"""The index of a Parquet output: its row groups' bounds, from the file's footer, and the facts
of each row, read from the few columns that hold them (never the text). A page of rows is
read from the row groups it falls in, one group at a time, and kept while the next page asks
for the same group.

Parquet files are written whole (a batch job writes OUT.parquet from its journal at the end), so
one that changed (size, time or inode) is read again from the start.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from lmpress.data.row_shapes import ID_KEYS
from lmpress.view.records import RowKind, facts
from lmpress.view.table import Table, TableBuilder

# The columns a row's facts come from (a batch output's, data/parquet_out.py).
FACT_COLUMNS = (
    *ID_KEYS, "error_kind", "cached", "model", "finish_reason", "prompt_tokens",
    "completion_tokens", "latency_s", "cost_usd", "key", "step", "failed", "dropped",
)  # fmt: skip


def row_text(row: dict[str, Any]) -> str:
    """A Parquet row as one line of JSON (its `raw`, and what search reads)."""
    return json.dumps(row, ensure_ascii=False, default=str)


class ParquetIndex:
    def __init__(
        self,
        path: Path,
        kind: RowKind,
        step: str | None = None,
        model: str | None = None,
        keep: bool = True,
        id_column: str | None = None,
    ):
        self.path, self.kind, self.step, self.model = path, kind, step, model
        self.id_column = id_column
        self.table = Table.empty()
        self.bounds = np.zeros(1, np.int64)  # row group i holds rows bounds[i]:bounds[i+1]
        self.stamp: tuple | None = None
        self._group: tuple[int, list[dict[str, Any]]] | None = None

    @property
    def rows(self) -> int:
        return int(self.bounds[-1])

    @property
    def known(self) -> int:
        """Rows whose facts are read: all of them (a footer's few columns are read at once)."""
        return self.rows

    @property
    def groups(self) -> int:
        return len(self.bounds) - 1

    def refresh(self, ended: bool = False) -> bool:
        """As JsonlIndex.refresh; a Parquet file is read by its footer, whole (`ended` unused)."""
        try:
            stat = os.stat(self.path)
        except FileNotFoundError:
            changed = self.rows > 0
            self.table, self.bounds, self.stamp = Table.empty(), np.zeros(1, np.int64), None
            return changed
        stamp = (stat.st_size, stat.st_mtime_ns, stat.st_ino)
        if stamp == self.stamp:
            return False
        import pyarrow.parquet as pq

        self.stamp, self._group = stamp, None
        handle = pq.ParquetFile(self.path)
        sizes = [handle.metadata.row_group(i).num_rows for i in range(handle.num_row_groups)]
        self.bounds = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
        wanted = (*FACT_COLUMNS, self.id_column) if self.id_column else FACT_COLUMNS
        present = [c for c in wanted if c in handle.schema_arrow.names]
        builder = TableBuilder()
        for group in range(handle.num_row_groups):
            for row in handle.read_row_group(group, columns=present).to_pylist():
                builder.add(facts(self.kind, row, self.step, self.model, self.id_column))
        self.table = builder.table()
        return True

    def group_rows(self, group: int) -> list[dict[str, Any]]:
        """Every row of one row group, as dicts (the last group read is kept)."""
        if self._group is None or self._group[0] != group:
            import pyarrow.parquet as pq

            rows = pq.ParquetFile(self.path).read_row_group(group).to_pylist()
            self._group = (group, rows)
        return self._group[1]

    def records(self, rows: list[int]) -> list[tuple[Any, str]]:
        """(the row, its text) for each row number."""
        out = []
        for n in rows:
            group = int(np.searchsorted(self.bounds, n, side="right")) - 1
            row = self.group_rows(group)[n - int(self.bounds[group])]
            out.append((row, row_text(row)))
        return out

    @contextmanager
    def facts(self) -> Iterator[Table]:
        """As JsonlIndex.facts: the table, read whole."""
        yield self.table

    def wait(self, timeout: float | None = None) -> bool:
        """As JsonlIndex.wait: nothing is read behind."""
        return True

    def close(self) -> None:
        """Nothing to keep: a Parquet file's footer is its index."""
