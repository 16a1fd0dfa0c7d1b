"""How a file of rows is stored: its *file format*. What one row in it looks like is its row
shape (`data.row_shapes`), a separate matter: a JSONL or Parquet file holds rows of any shape.

Inputs are read as any of these (`data.sources`), by the file's suffix or as
`--input-format` says; outputs are written as JSONL or Parquet (`data.targets`), by the
suffix or as `--output-format jsonl|parquet` says.
"""

from __future__ import annotations

from enum import Enum
from typing import Literal


class FileFormat(str, Enum):
    JSONL = "jsonl"  # one JSON object a line, plain or compressed (.gz .bz2 .xz .zst)
    PARQUET = "parquet"
    CSV = "csv"
    TSV = "tsv"
    HF = "hf"  # a Hugging Face dataset: a save_to_disk or data directory, or a hub name

    def __str__(self) -> str:
        return self.value


AUTO = "auto"  # the format the file's suffix names
Auto = Literal["auto"]
INPUT_FORMATS: tuple[FileFormat, ...] = tuple(FileFormat)
OUTPUT_FORMATS = (FileFormat.JSONL, FileFormat.PARQUET)

# Input files by suffix (past a compression suffix); a file with none is read as JSONL.
INPUT_SUFFIXES = {
    ".jsonl": FileFormat.JSONL, ".json": FileFormat.JSONL, ".ndjson": FileFormat.JSONL,
    ".parquet": FileFormat.PARQUET, ".pq": FileFormat.PARQUET, ".csv": FileFormat.CSV,
    ".tsv": FileFormat.TSV,
}  # fmt: skip
# Output files by suffix; anything else is written as JSONL.
OUTPUT_SUFFIXES = {".parquet": FileFormat.PARQUET, ".pq": FileFormat.PARQUET}


def choices(formats: tuple[FileFormat, ...], auto: bool = True) -> str:
    """The formats as a flag's help or error lists them: `auto, jsonl, parquet`."""
    return ", ".join(([AUTO] if auto else []) + [f.value for f in formats])
