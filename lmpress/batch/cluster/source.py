"""The job's input as Ray Data reads it.

Ray's own readers (`read_json`, `read_parquet`) infer one Arrow schema for the whole file and
fail the job on one malformed line or on rows of mixed shapes, and number no lines. So this
datasource reads with lmpress's own readers (`data.sources`): the same rows, line numbers, ids
and selection as a local run, a bad line becoming that row's error. It runs as one read task,
pinned to the driver's node, so the input need only be where `lmpress batch` runs; rows
already done are skipped there, and each row travels as its pickled `Line`.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from ray.data import Datasource, ReadTask
from ray.data.block import BlockMetadata

from lmpress.batch.rows import line_row_id
from lmpress.data.idkeys import IdKeys
from lmpress.data.resume import id_key
from lmpress.data.selection import RowSelection
from lmpress.data.sources import Source

# One block's columns: the row's place among the rows sent (-1: none, the block's last entry
# only carries a count), how many done rows were skipped just before it, and its Line.
SCHEMA = pa.schema([("seq", pa.int64()), ("skipped", pa.int64()), ("line", pa.binary())])


@dataclass
class InputRows(Datasource):
    source: Source  # a piped input's copy, where it was piped (`data.spool`)
    selection: RowSelection
    skip: tuple[IdKeys, ...]  # rows done, and rows set aside, by earlier runs
    id_column: str | None
    block_rows: int

    @property
    def supports_distributed_reads(self) -> bool:
        return False  # Ray Data runs the read on the driver's node, where the input is

    def estimate_inmemory_data_size(self) -> int | None:
        return None

    def get_read_tasks(
        self, parallelism: int, per_task_row_limit: int | None = None, data_context: Any = None
    ) -> list[ReadTask]:
        metadata = BlockMetadata(
            num_rows=None, size_bytes=None, exec_stats=None, input_files=[self.source.path]
        )
        return [ReadTask(self._blocks, metadata, SCHEMA)]

    def _blocks(self) -> Iterator[pa.Table]:
        source = self.source
        seqs: list[int] = []
        skips: list[int] = []
        lines: list[bytes | None] = []
        seq = skipped = 0
        for ordinal, line in enumerate(source.lines()):
            if not self.selection.picks(ordinal):
                continue
            key = id_key(line_row_id(line, self.id_column))
            if any(key in keys for keys in self.skip):
                skipped += 1
                continue
            seqs.append(seq)
            skips.append(skipped)
            lines.append(pickle.dumps(line, pickle.HIGHEST_PROTOCOL))
            seq += 1
            skipped = 0
            if len(lines) >= self.block_rows:
                yield _block(seqs, skips, lines)
                seqs, skips, lines = [], [], []
        if skipped:
            seqs.append(-1)
            skips.append(skipped)
            lines.append(None)
        if lines:
            yield _block(seqs, skips, lines)


def _block(seqs: list[int], skips: list[int], lines: list[bytes | None]) -> pa.Table:
    return pa.Table.from_arrays(
        [pa.array(seqs, pa.int64()), pa.array(skips, pa.int64()), pa.array(lines, pa.binary())],
        schema=SCHEMA,
    )
