"""Where a `--models` job keeps each model's rows, and how they become one output.

Each model runs as an ordinary batch job writing a part of its own, OUT.models/NN-NAME.SUFFIX
beside the output, with that part's own side files: so resume (every (row, model) pair once,
after any crash), the lock, the response cache, budgets and Parquet hold per model with no
new bookkeeping. When the models have run, the parts are copied in model order, a line at a
time (a Parquet part a record batch at a time), into OUT, each row marked with its model: a
`model` column, or on an OpenAI Batch line the body's `model`. OUT is written to a scratch
file and renamed, so it is whole or absent; the parts stay the record a re-run resumes from.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmpress.data.file_formats import FileFormat
from lmpress.data.jsonl import JsonlWriter, read_lines
from lmpress.data.resume import JobFiles
from lmpress.vocabulary.errors import OutputWriteError


@dataclass(frozen=True)
class ModelPart:
    """One model of a --models job: its name as given, and the files it writes."""

    label: str
    files: JobFiles

    @property
    def output(self) -> Path:
        return self.files.output


def parts_folder(output: str | Path) -> Path:
    out = Path(output).expanduser()
    return out.with_name(f"{out.name}.models")


def part_suffix(output: str | Path) -> str:
    """How each part's name ends: as the output's does (.jsonl.gz for OUT.jsonl.gz)."""
    return "".join(Path(output).suffixes[-2:]) or ".jsonl"


def model_parts(output: str | Path, labels: list[str], file_format: FileFormat) -> list[ModelPart]:
    """Each model's part, named by its place and its label (made safe for a file name)."""
    folder = parts_folder(output)
    suffix = part_suffix(output)
    parts = []
    for place, label in enumerate(labels, 1):
        name = Path(label).stem if Path(label).suffix in (".yaml", ".yml") else label
        slug = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.") or "model"
        path = folder / f"{place:02d}-{slug}{suffix}"
        parts.append(ModelPart(label, JobFiles.found(path, file_format)))
    return parts


def mark(line: dict[str, Any], model: str) -> dict[str, Any]:
    """A part's line marked with its model: an OpenAI Batch output line in its body's `model`
    (custom_id unchanged), any other line in a `model` column."""
    response = line.get("response")
    body = response.get("body") if isinstance(response, dict) else None
    if "custom_id" in line and isinstance(body, dict):
        return {**line, "response": {**response, "body": {**body, "model": model}}}
    return {**line, "model": model}


def part_lines(path: Path) -> Iterator[dict[str, Any]]:
    """A JSONL part's lines (a torn last line, cut by the part's next run, is left out)."""
    if not path.exists():
        return
    for line in read_lines(path):
        if not line.error and isinstance(line.value, dict):
            yield line.value


def merge_jsonl(parts: list[ModelPart], target: Path, errors: Path) -> int:
    """OUT and OUT.errors.jsonl from the parts; the rows written to OUT."""
    rows = _replace(target, lambda out: _copy(parts, lambda p: p.output, out))
    _replace(errors, lambda out: _copy(parts, lambda p: p.files.errors, out), keep_empty=False)
    return rows


def merge_parquet(parts: list[ModelPart], target: Path, errors: Path) -> int:
    """OUT.parquet from the parts' Parquet files, a record batch at a time, with a `model`
    column; the columns a part lacks are null in its rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    present = [p for p in parts if p.output.exists()]
    schemas = [pq.read_schema(p.output) for p in present]
    schema = pa.unify_schemas([*schemas, pa.schema([("model", pa.string())])])

    def write(scratch: Path) -> int:
        rows = 0
        with pq.ParquetWriter(scratch, schema) as writer:
            for part in present:
                for batch in pq.ParquetFile(part.output).iter_batches():
                    columns = {name: batch.column(name) for name in batch.schema.names}
                    columns["model"] = pa.array([part.label] * batch.num_rows, pa.string())
                    arrays = [
                        columns[f.name].cast(f.type)
                        if f.name in columns
                        else pa.nulls(batch.num_rows, f.type)
                        for f in schema
                    ]
                    writer.write_batch(pa.RecordBatch.from_arrays(arrays, schema=schema))
                    rows += batch.num_rows
        return rows

    rows = _replace(target, write, keep_empty=True, text=False)
    _replace(errors, lambda out: _copy(parts, lambda p: p.files.errors, out), keep_empty=False)
    return rows


def _copy(parts: list[ModelPart], path_of: Any, out: JsonlWriter) -> int:
    rows = 0
    for part in parts:
        for line in part_lines(path_of(part)):
            out.write(mark(line, part.label))
            rows += 1
    return rows


def _replace(target: Path, write: Any, keep_empty: bool = True, text: bool = True) -> int:
    """Write `target` through a scratch file renamed over it: whole or as it was."""
    scratch = target.with_name(f".merging.{target.name}")  # the suffix kept: compressed alike
    try:
        if text:
            with JsonlWriter(scratch) as out:
                rows = write(out)
        else:
            rows = write(scratch)
        if rows or keep_empty:
            os.replace(scratch, target)
        else:
            scratch.unlink(missing_ok=True)
            target.unlink(missing_ok=True)
    except OSError as exc:
        scratch.unlink(missing_ok=True)
        raise OutputWriteError(target, exc) from exc
    return rows
