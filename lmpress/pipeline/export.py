"""STAND-IN (branch core only) for the `card` helper's pipeline/export.py, same names and
shapes: the final dataset written from a stream of rows as JSONL, Parquet or a save_to_disk
directory. The lead merges theirs over this file."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from lmpress.data.file_formats import FileFormat
from lmpress.vocabulary.errors import ConfigError

DATASET_FORMATS = (FileFormat.JSONL, FileFormat.PARQUET, FileFormat.HF)
DATASET_NAMES = {
    FileFormat.JSONL: "data.jsonl",
    FileFormat.PARQUET: "data.parquet",
    FileFormat.HF: "data",
}


def dataset_format(fmt: str | FileFormat) -> FileFormat:
    try:
        chosen = FileFormat(fmt)
    except ValueError:
        chosen = None
    if chosen not in DATASET_FORMATS:
        names = ", ".join(f.value for f in DATASET_FORMATS)
        raise ConfigError(f"dataset format '{fmt}': a pipeline writes one of {names}")
    return chosen


def write_dataset(rows: Iterable[dict], out_dir: Path, fmt: str | FileFormat) -> Path:
    chosen = dataset_format(fmt)
    target = Path(out_dir) / DATASET_NAMES[chosen]
    spool = target.with_name(f".{target.name}.spool.jsonl")
    with spool.open("w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    if chosen is FileFormat.JSONL:
        spool.replace(target)
        return target
    try:
        if chosen is FileFormat.PARQUET:
            import pyarrow as pa
            import pyarrow.json as pj
            import pyarrow.parquet as pq

            table = pj.read_json(spool) if spool.stat().st_size else pa.table({})
            pq.write_table(table, target)
        else:
            import datasets

            datasets.Dataset.from_json(str(spool)).save_to_disk(str(target))
    finally:
        spool.unlink(missing_ok=True)
    return target
