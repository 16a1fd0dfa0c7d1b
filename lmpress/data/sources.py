"""Where a batch job's rows come from: JSONL, Parquet, CSV/TSV or a Hugging Face dataset, each
read as a stream, so memory stays flat whatever the input's size.

Every reader yields the `Line`s that `data.jsonl.read_lines` yields (a 1-based number, the
row as a dict, or why it cannot be read), so the batch runner, the resume scan and the dry
run read every format the same way:
- JSONL: one line at a time (plain or compressed); the number is the line's.
- Parquet: a record batch at a time (pyarrow), never the whole file; the number is the row's.
- CSV/TSV: the standard library's reader, every value a string; the number is the line the
  row ends on, header included, as an editor shows it.
- A Hugging Face dataset: a `save_to_disk` directory (memory-mapped Arrow), a data directory
  of JSON/CSV/Parquet files, or a hub name (`hf:org/name`, or `org/name` with
  `--input-format hf`), streamed; `--split` picks the split.

Values JSON cannot hold (timestamps, dates, decimals, bytes) are turned into text as they are
read, so that every row can be journaled as JSON; a Parquet output casts them back to the
input's types where it can (`data.parquet_out`).
"""

from __future__ import annotations

import base64
import csv
import datetime
import decimal
import io
import json
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmpress.data.file_formats import (
    AUTO,
    INPUT_FORMATS,
    INPUT_SUFFIXES,
    Auto,
    FileFormat,
    choices,
)
from lmpress.data.file_kinds import SNIFF_BYTES, check_head, check_rows
from lmpress.data.jsonl import Line, open_input, read_lines
from lmpress.data.targets import COMPRESSED, STDIO
from lmpress.vocabulary.errors import InputError

HUB_PREFIX = "hf:"
BATCH_ROWS = 1024  # rows decoded at a time from Parquet and Arrow: flat memory, fast enough
# What a save_to_disk directory holds: a Dataset's state, or a DatasetDict's split list.
SAVED_DATASET = ("state.json", "dataset_dict.json")
DATA_FILES = (".jsonl", ".json", ".csv", ".tsv", ".parquet", ".arrow", ".txt")
TEXT_FORMATS = (FileFormat.JSONL, FileFormat.CSV, FileFormat.TSV)  # read as a stream of lines


@dataclass(frozen=True)
class Source:
    """An input and how to read it."""

    path: str  # what is read
    format: FileFormat
    split: str | None = None  # a Hugging Face dataset's split
    stream: bool = False  # a pipe, a FIFO or stdin: read once, so a job spools it (`data.spool`)
    shown_as: str | None = None  # what messages call it, where that is not `path` (a spool)

    @property
    def name(self) -> str:
        """The input as the user named it, for messages."""
        return self.shown_as or self.path

    @property
    def unit(self) -> str:
        """What a Line's number counts, for messages: 'line' or 'row'."""
        return "line" if self.format in TEXT_FORMATS else "row"

    def where(self, number: int) -> str:
        """A row's place for a message: `data.jsonl:12`, or `data.parquet row 12`."""
        if self.unit == "line":
            return f"{self.name}:{number}"
        return f"{self.name} row {number}"

    def lines(self) -> Iterator[Line]:
        """Every row, in order."""
        if self.format is FileFormat.JSONL:
            return read_lines(self.path, self.name)
        if self.format is FileFormat.PARQUET:
            return _parquet_rows(self.path)
        if self.format in (FileFormat.CSV, FileFormat.TSV):
            delimiter = "\t" if self.format is FileFormat.TSV else ","
            return _csv_rows(self.path, delimiter, self.name)
        return _dataset_rows(self.path, self.split)

    def check(self) -> None:
        """Refuse a text input that is not what it claims (`data.file_kinds`): binary data, or
        rows none of which can be read. Reads the start of the file only."""
        if self.format not in TEXT_FORMATS:
            return
        try:
            with open_input(self.path) as handle:
                head = handle.read(SNIFF_BYTES)
        except (OSError, EOFError, ValueError):
            return  # damaged compressed data: reading it says so, after the rows it can read
        check_head(self.name, head, self.format)
        lines = self.lines()
        try:
            check_rows(self.name, lines, self.format, self.unit)
        finally:
            lines.close()  # type: ignore[attr-defined]

    def arrow_schema(self) -> Any | None:
        """The input's column types where the input has them (Parquet, a saved dataset), for a
        Parquet output to keep; None otherwise."""
        if self.format is FileFormat.PARQUET:
            import pyarrow.parquet as pq

            return pq.read_schema(self.path)
        return None


def open_source(
    path: str, input_format: FileFormat | Auto | str = AUTO, split: str | None = None
) -> Source:
    """The input checked (it exists, its file format is known) before any model loads."""
    forced = input_file_format(input_format)
    if is_stream(path):
        return _stream_source(path, forced)
    if path.startswith(HUB_PREFIX):
        return Source(path.removeprefix(HUB_PREFIX), FileFormat.HF, split)
    p = Path(path).expanduser()
    if forced is FileFormat.HF:
        return Source(path, FileFormat.HF, split)
    if p.is_dir():
        if forced is not None:
            raise InputError(f"{path}: is a directory, expected a {forced} file")
        if not any((p / name).exists() for name in SAVED_DATASET) and not _data_files(p):
            raise InputError(
                f"{path}: is a directory with neither a saved dataset (save_to_disk) nor data "
                f"files ({', '.join(DATA_FILES)}); give a file or a dataset directory"
            )
        return Source(path, FileFormat.HF, split)
    if not p.exists():
        raise InputError(f"{path}: no such input file")
    if split is not None:
        raise InputError(f"--split {split}: only a Hugging Face dataset has splits ({path})")
    fmt = forced or format_of(path, "input")
    if fmt is FileFormat.PARQUET and is_compressed_name(path):
        raise InputError(f"{path}: Parquet compresses inside the file; give the .parquet itself")
    source = Source(path, fmt)
    source.check()
    return source


def is_stream(path: str) -> bool:
    """Whether the input can be read only once: `-` (stdin), a pipe, a FIFO, a device
    (`/dev/stdin`, `<(cmd)`'s /dev/fd/N)."""
    if path == STDIO:
        return True
    try:
        mode = os.stat(Path(path).expanduser()).st_mode
    except (OSError, ValueError):
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def _stream_source(path: str, forced: FileFormat | None) -> Source:
    """A stream of rows, by `--input-format` or its name (a FIFO named rows.csv), else JSONL;
    compression is told by its first bytes when it is read."""
    fmt = forced or (FileFormat.JSONL if path == STDIO else format_of(path, "input"))
    if fmt not in TEXT_FORMATS:
        raise InputError(
            f"{path}: {fmt} input is read from a file, not a stream (a pipe, a FIFO or "
            f"stdin); save it to a file and give its path, or pipe JSONL or CSV"
        )
    return Source(path, fmt, stream=True)


def input_file_format(name: FileFormat | Auto | str) -> FileFormat | None:
    """`--input-format`'s word as a file format; None for auto (by the suffix)."""
    if name == AUTO:
        return None
    try:
        return FileFormat(name)
    except ValueError:
        raise InputError(f"--input-format {name}: use {choices(INPUT_FORMATS)}") from None


def format_of(path: str, role: str) -> FileFormat:
    """The file format a file's suffix names (past a compression suffix); a suffix lmpress does
    not read is refused by name, a file with none is taken as JSONL."""
    name = Path(path).name.lower()
    for suffix in COMPRESSED:
        name = name.removesuffix(suffix)
    suffix = Path(name).suffix
    if suffix in INPUT_SUFFIXES:
        return INPUT_SUFFIXES[suffix]
    if suffix in NOT_READ:
        raise InputError(
            f"{path}: {NOT_READ[suffix]} files are not supported as {role}; lmpress reads "
            f"JSONL, Parquet, CSV/TSV and Hugging Face datasets: convert to one of those"
        )
    return FileFormat.JSONL


NOT_READ = {
    ".arrow": "Arrow", ".feather": "Feather", ".xlsx": "Excel", ".xls": "Excel", ".avro": "Avro",
    ".orc": "ORC", ".zip": "ZIP", ".tar": "tar", ".7z": "7-Zip", ".lz4": "LZ4",
}  # fmt: skip


def is_compressed_name(path: str) -> bool:
    return path.lower().endswith(COMPRESSED)


# --- Parquet -------------------------------------------------------------------------------


def _parquet_rows(path: str) -> Iterator[Line]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
    except (OSError, pa.ArrowException) as exc:
        raise InputError(f"{path}: not a readable Parquet file ({exc})") from exc
    with parquet:
        plain = _json_native(parquet.schema_arrow)
        number = 0
        try:
            for batch in parquet.iter_batches(batch_size=BATCH_ROWS):
                for row in batch.to_pylist():
                    number += 1
                    yield Line(number, row if plain else _json_safe(row))
        except (OSError, pa.ArrowException) as exc:
            raise InputError(f"{path}: row {number + 1} cannot be read ({exc})") from exc


# --- CSV and TSV ---------------------------------------------------------------------------


def _csv_rows(path: str, delimiter: str, name: str) -> Iterator[Line]:
    with open_input(path) as raw:
        text = io.TextIOWrapper(raw, encoding="utf-8-sig", errors="strict", newline="")
        reader = csv.reader(text, delimiter=delimiter)
        try:
            header = next(reader, None)
        except (UnicodeDecodeError, csv.Error) as exc:
            raise InputError(f"{name}:1: the header cannot be read ({exc})") from exc
        if not header:
            return
        _check_header(name, header)
        while True:
            try:
                fields = next(reader)
            except StopIteration:
                return
            except UnicodeDecodeError as exc:
                # The decoder reads ahead, so the line is the last one read: report and stop.
                raise InputError(
                    f"{name}: not valid UTF-8 after line {reader.line_num} ({exc.reason}); "
                    f"save the file as UTF-8"
                ) from exc
            except csv.Error as exc:
                yield Line(reader.line_num, error=f"not valid {_csv_name(delimiter)} ({exc})")
                continue
            if not fields or fields == [""]:
                continue
            if len(fields) != len(header):
                yield Line(
                    reader.line_num,
                    error=f"has {len(fields)} fields, the header has {len(header)}",
                )
                continue
            yield Line(reader.line_num, dict(zip(header, fields, strict=True)))


def _check_header(path: str, header: list[str]) -> None:
    seen: set[str] = set()
    for name in header:
        if not name:
            raise InputError(f"{path}:1: the header has an empty column name; name every column")
        if name in seen:
            raise InputError(f"{path}:1: the header names column '{name}' twice")
        seen.add(name)


def _csv_name(delimiter: str) -> str:
    return "TSV" if delimiter == "\t" else "CSV"


# --- Hugging Face datasets -----------------------------------------------------------------


def _dataset_rows(path: str, split: str | None) -> Iterator[Line]:
    if _saved_without_rows(Path(path).expanduser()):
        return
    dataset = _open_dataset(path, split)
    number = 0
    if hasattr(dataset, "with_format") and hasattr(dataset, "data"):  # an in-place Dataset
        for table in dataset.with_format("arrow").iter(batch_size=BATCH_ROWS):
            plain = _json_native(table.schema)
            for row in table.to_pylist():
                number += 1
                yield Line(number, row if plain else _json_safe(row))
        return
    for row in dataset:  # an IterableDataset: rows come as they are streamed
        number += 1
        yield Line(number, _json_safe(dict(row)))


def _open_dataset(path: str, split: str | None) -> Any:
    try:
        import datasets
    except ImportError as exc:
        raise InputError(
            f"{path}: reading a Hugging Face dataset needs the datasets package: "
            f"pip install 'lmpress[datasets]'"
        ) from exc
    datasets.disable_progress_bars()
    p = Path(path).expanduser()
    try:
        if p.is_dir() and any((p / name).exists() for name in SAVED_DATASET):
            return _pick_split(datasets.load_from_disk(str(p)), split, path)
        if p.suffix == ".py":
            raise InputError(
                f"{path}: dataset scripts are no longer run by the datasets library (4.0 and "
                f"later); save the dataset with save_to_disk or as Parquet files, and give that"
            )
        loaded = datasets.load_dataset(str(p) if p.exists() else path, streaming=True)
        return _pick_split(loaded, split, path)
    except InputError:
        raise
    except FileNotFoundError as exc:
        raise InputError(f"{path}: no such dataset ({_first_line(exc)})") from exc
    except Exception as exc:  # the hub unreachable, a damaged directory: the library's words
        raise InputError(f"{path}: cannot open the dataset ({_first_line(exc)})") from exc


def _pick_split(loaded: Any, split: str | None, path: str) -> Any:
    """One split of a dataset dict: the one named, else the only one, else 'train'."""
    if not isinstance(loaded, dict):
        if split is not None:
            raise InputError(f"--split {split}: {path} is a single dataset with no splits")
        return loaded
    names = list(loaded)
    if split is None:
        if len(names) == 1:
            return loaded[names[0]]
        if "train" in loaded:
            return loaded["train"]
        raise InputError(f"{path}: has splits {', '.join(names)}; choose one with --split")
    if split not in loaded:
        raise InputError(f"--split {split}: {path} has splits {', '.join(names)}")
    return loaded[split]


def _saved_without_rows(directory: Path) -> bool:
    """A `save_to_disk` of a dataset with no rows (say, filtered down to none): datasets 5
    writes no data file for it, and `load_from_disk` then fails on an empty list
    (huggingface/datasets#8385); here it is read as what it is, no rows."""
    try:
        state = json.loads((directory / "state.json").read_text(encoding="utf-8"))
        return state["_data_files"] == []
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _data_files(directory: Path) -> bool:
    return any(
        child.suffix.lower() in DATA_FILES for child in directory.iterdir() if child.is_file()
    )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


# --- values JSON cannot hold ---------------------------------------------------------------


def _json_native(schema: Any) -> bool:
    """Whether every column of an Arrow schema decodes to values JSON holds as they are."""
    import pyarrow.types as t

    def native(kind: Any) -> bool:
        if t.is_list(kind) or t.is_large_list(kind) or t.is_fixed_size_list(kind):
            return native(kind.value_type)
        if t.is_struct(kind):
            return all(native(kind.field(i).type) for i in range(kind.num_fields))
        if t.is_dictionary(kind):
            return native(kind.value_type)
        return (
            t.is_integer(kind) or t.is_floating(kind) or t.is_boolean(kind) or t.is_null(kind)
            or t.is_string(kind) or t.is_large_string(kind)
        )  # fmt: skip

    return all(native(field.type) for field in schema)


def _json_safe(value: Any) -> Any:
    """A decoded value with timestamps, dates and times as ISO text, decimals as text and bytes
    as base64, recursively; everything else as it is."""
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if hasattr(value, "tolist"):  # numpy scalars and arrays, from a dataset's formatting
        return _json_safe(value.tolist())
    return value
