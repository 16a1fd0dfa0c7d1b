"""A pipeline's final dataset, written as JSONL, Parquet or a Hugging Face `save_to_disk`
directory, from rows that stream in: memory holds one chunk of rows, never the dataset.

Each is written under a temporary name and renamed into place only when whole, so a run killed
while writing leaves the previous dataset (or none), never half of one that looks finished.

JSONL goes through the project's writer (data/jsonl.py), a line at a time. Parquet and the
Hugging Face directory need each column's type before the first row is written, and a row late
in the stream may widen it (an int column that later holds a float, a nested dict with a new
key). So the rows are spooled once to a JSONL file beside the output, their types settled over
the whole spool by the batch output's column plan (data/parquet_out.py), and written in a
second pass a chunk at a time. A column whose values disagree (numbers in one row, text in
another) is written as JSON text, as a batch's Parquet output writes it.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from lmpress.data.file_formats import FileFormat
from lmpress.data.jsonl import JsonlWriter
from lmpress.data.parquet_out import ColumnPlan, chunks
from lmpress.vocabulary.errors import ConfigError

DATASET_FORMATS = (FileFormat.JSONL, FileFormat.PARQUET, FileFormat.HF)
# What each format's dataset is called in the output directory (the card's data_files).
DATASET_NAMES = {
    FileFormat.JSONL: "dataset.jsonl",
    FileFormat.PARQUET: "dataset.parquet",
    FileFormat.HF: "dataset",
}


def dataset_format(fmt: str | FileFormat) -> FileFormat:
    """`fmt` as a FileFormat, or a ConfigError naming the formats a dataset can take."""
    try:
        chosen = FileFormat(fmt)
    except ValueError:
        chosen = None
    if chosen not in DATASET_FORMATS:
        names = ", ".join(f.value for f in DATASET_FORMATS)
        raise ConfigError(f"dataset format '{fmt}': a pipeline writes one of {names}")
    return chosen


def write_dataset(rows: Iterable[dict], out_dir: Path, fmt: str | FileFormat) -> Path:
    """Write `rows` to `out_dir` as `fmt` ("jsonl", "parquet" or "hf"); the path written
    (`DATASET_NAMES`): a file, or for "hf" a directory `datasets.load_from_disk` reads."""
    chosen = dataset_format(fmt)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / DATASET_NAMES[chosen]
    if chosen is FileFormat.JSONL:
        _write_jsonl(rows, target)
        return target
    spool = out_dir / f".{target.name}.spool.jsonl"
    try:
        _write_jsonl(({"columns": row} for row in rows), spool)
        plan = ColumnPlan(None, None, renamed=frozenset(), ids=False)
        for lines in chunks(spool):
            plan.observe(lines)
        if chosen is FileFormat.PARQUET:
            _write_parquet(spool, plan, target)
        else:
            _write_hf(spool, plan, target)
    finally:
        spool.unlink(missing_ok=True)
    return target


def _write_jsonl(rows: Iterable[dict], target: Path) -> None:
    tmp = target.with_name(f".{target.name}.tmp")
    try:
        with JsonlWriter(tmp) as writer:
            for row in rows:
                writer.write(row)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def _schema(plan: ColumnPlan) -> Any:
    import pyarrow as pa

    return pa.schema(plan.fields())


def _tables(spool: Path, plan: ColumnPlan, schema: Any) -> Iterator[Any]:
    """The spooled rows as Arrow tables of `schema`, a chunk at a time."""
    import pyarrow as pa

    for lines in chunks(spool):
        yield pa.Table.from_arrays(plan.column_arrays(lines, schema), schema=schema)


def _write_parquet(spool: Path, plan: ColumnPlan, target: Path) -> None:
    import pyarrow.parquet as pq

    schema = _schema(plan)
    tmp = target.with_name(f".{target.name}.tmp")
    try:
        with pq.ParquetWriter(tmp, schema, compression="zstd") as writer:
            for table in _tables(spool, plan, schema):
                writer.write_table(table)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def _write_hf(spool: Path, plan: ColumnPlan, target: Path) -> None:
    """A `save_to_disk` directory, built by `Dataset.from_generator` (which writes Arrow as the
    rows come) in a scratch cache beside the output, then saved and swapped into place."""
    try:
        import datasets
    except ImportError:
        raise ConfigError(
            f"{target}: writing a Hugging Face dataset needs the datasets package: "
            f"pip install 'lmpress[datasets]'"
        ) from None
    datasets.disable_progress_bars()
    schema = _schema(plan)
    features = datasets.Features.from_arrow_schema(schema)
    scratch = target.with_name(f".{target.name}.cache")
    tmp = target.with_name(f".{target.name}.tmp")
    try:
        if plan.observed:
            made = datasets.Dataset.from_generator(
                _hf_rows, features=features, cache_dir=str(scratch),
                gen_kwargs={"spool": spool, "plan": plan, "schema": schema},
            )  # fmt: skip
        else:  # from_generator refuses a generator with nothing in it
            made = datasets.Dataset.from_dict({}, features=features)
        made.save_to_disk(str(tmp))
        del made  # its cache files are in `scratch`, removed below
        shutil.rmtree(target, ignore_errors=True)
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(scratch, ignore_errors=True)


def _hf_rows(spool: Path, plan: ColumnPlan, schema: Any) -> Iterator[dict]:
    for table in _tables(spool, plan, schema):
        yield from table.to_pylist()
