"""The index of a Parquet output, or of a pipeline's Hugging Face dataset (a `save_to_disk`
folder of Arrow files): its row groups' bounds (a Parquet file's from its footer; an Arrow
file's record batches, memory-mapped, so only their headers are read), and the facts of each
row, read from the few columns that hold them (never the text). A page of rows is read from the
row groups it falls in, one group at a time, and kept while the next page asks for the same
group.

Both are written whole (a batch job writes OUT.parquet from its journal at the end; a pipeline
swaps its dataset folder into place), so one that changed (size, time or inode) is read again
from the start.
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
        self._groups: ParquetGroups | ArrowGroups | None = None  # the file, as last opened
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
            stamp = self._stamp()
            if stamp == self.stamp:
                return False
            self.stamp, self._group = stamp, None
            self._groups = self._open()
        except FileNotFoundError:
            changed = self.rows > 0
            self.table, self.bounds, self.stamp = Table.empty(), np.zeros(1, np.int64), None
            self._groups = None
            return changed
        groups = self._groups
        self.bounds = np.concatenate([[0], np.cumsum(groups.sizes, dtype=np.int64)])
        wanted = (*FACT_COLUMNS, self.id_column) if self.id_column else FACT_COLUMNS
        present = [c for c in wanted if c in groups.names]
        builder = TableBuilder()
        for group in range(len(groups.sizes)):
            for row in groups.read(group, present).to_pylist():
                builder.add(facts(self.kind, row, self.step, self.model, self.id_column))
        self.table = builder.table()
        return True

    def _stamp(self) -> tuple:
        return stamp_of(self.path)

    def _open(self) -> ParquetGroups | ArrowGroups:
        return ParquetGroups(self.path)

    def group_rows(self, group: int) -> list[dict[str, Any]]:
        """Every row of one row group, as dicts (the last group read is kept)."""
        if self._group is None or self._group[0] != group:
            groups = self._groups if self._groups is not None else self._open()
            self._group = (group, groups.read(group).to_pylist())
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


class ArrowIndex(ParquetIndex):
    """A `save_to_disk` folder (pipeline/export.py writes one for --format hf): its Arrow
    files' record batches are the row groups."""

    def _stamp(self) -> tuple:
        return tuple(stamp_of(path) for path in [self.path / STATE, *_arrow_files(self.path)])

    def _open(self) -> ArrowGroups:
        return ArrowGroups(self.path)


class ParquetGroups:
    """A Parquet file's row groups."""

    def __init__(self, path: Path):
        import pyarrow.parquet as pq

        self.handle = pq.ParquetFile(path)
        metadata = self.handle.metadata
        self.sizes = [metadata.row_group(i).num_rows for i in range(self.handle.num_row_groups)]
        self.names = self.handle.schema_arrow.names

    def read(self, group: int, columns: list[str] | None = None) -> Any:
        return self.handle.read_row_group(group, columns=columns)


class ArrowGroups:
    """A `save_to_disk` folder's record batches, in its files' order, memory-mapped (Hugging
    Face writes Arrow streams, which have no footer to seek by: the batches' headers are
    read once, their data only when a page asks)."""

    def __init__(self, folder: Path):
        import pyarrow as pa

        self.batches: list[Any] = []
        schema = pa.schema([])
        for path in _arrow_files(folder):
            with pa.ipc.open_stream(pa.memory_map(str(path))) as reader:
                schema = reader.schema
                self.batches += list(reader)
        self.sizes = [batch.num_rows for batch in self.batches]
        self.names = schema.names

    def read(self, group: int, columns: list[str] | None = None) -> Any:
        import pyarrow as pa

        table = pa.Table.from_batches([self.batches[group]])
        return table.select(columns) if columns is not None else table


STATE = "state.json"  # what save_to_disk writes beside its Arrow files, naming them


def stamp_of(path: Path) -> tuple:
    """What tells a file that changed (FileNotFoundError where it is gone)."""
    stat = os.stat(path)
    return (path.name, stat.st_size, stat.st_mtime_ns, stat.st_ino)


def is_arrow_dataset(folder: Path) -> bool:
    return (folder / STATE).is_file() and bool(_arrow_files(folder))


def _arrow_files(folder: Path) -> list[Path]:
    """The dataset's Arrow files, as its state.json lists them (else by name)."""
    try:
        state = json.loads((folder / STATE).read_text(encoding="utf-8"))
        named = [folder / entry["filename"] for entry in state["_data_files"]]
    except (OSError, ValueError, KeyError, TypeError):
        named = sorted(folder.glob("data-*.arrow"))
    return [path for path in named if path.is_file()]
