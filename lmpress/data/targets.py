"""Where a batch job reads and writes, checked before anything is opened for writing.

A batch job owns its output file and the side files beside it, and nothing else: it must never
write over the file it reads (`-i X -o X`, or `-o ./X`), and never replace something that is not
a regular file (`/dev/stdout`, a FIFO, a directory). Those are streamed to, as `-o -` is: rows go
out as they finish, with no side files and no resume, since there is nothing to resume from.

An output file's suffix says its file format (`data.file_formats`): JSONL, optionally compressed
(.gz .bz2 .xz with the standard library, .zst with `zstandard`), or Parquet. File formats
lmpress does not write are refused by name before any model loads. Inputs are checked by `data.sources`.
"""

from __future__ import annotations

import io
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from lmpress.data.file_formats import OUTPUT_SUFFIXES, FileFormat
from lmpress.vocabulary.errors import InputError

STDIO = "-"
COMPRESSED = (".gz", ".bz2", ".xz", ".zst")
# Suffixes naming a file format lmpress does not write, refused by name.
NOT_WRITTEN = {
    ".csv": "CSV", ".tsv": "TSV", ".arrow": "Arrow", ".feather": "Feather", ".xlsx": "Excel",
    ".xls": "Excel", ".avro": "Avro", ".orc": "ORC", ".zip": "ZIP", ".tar": "tar",
}  # fmt: skip


@dataclass(frozen=True)
class OutputTarget:
    """Where results go. `stream`: stdout, a device or a FIFO, written to as it is."""

    path: str
    stream: bool = False

    @property
    def label(self) -> str:
        return "stdout" if self.path == STDIO else self.path


def output_file_format(path: str, forced: FileFormat | None = None) -> FileFormat:
    """How an output file is stored: JSONL (plain or compressed) or Parquet, by its suffix or
    as forced; `-` is always JSONL."""
    if path == STDIO:
        if forced is FileFormat.PARQUET:
            raise InputError("-o - streams JSONL; Parquet needs a file: give -o OUT.parquet")
        return FileFormat.JSONL
    name = Path(path).name.lower()
    plain = name
    for suffix in COMPRESSED:
        plain = plain.removesuffix(suffix)
    suffix = Path(plain).suffix
    fmt = forced or OUTPUT_SUFFIXES.get(suffix, FileFormat.JSONL)
    if forced is None and suffix in NOT_WRITTEN:
        raise InputError(
            f"{path}: lmpress does not write {NOT_WRITTEN[suffix]} files; write .jsonl "
            f"(optionally .gz, .zst, .bz2, .xz) or .parquet"
        )
    if fmt is FileFormat.PARQUET and plain != name:
        raise InputError(f"{path}: Parquet compresses inside the file; name it OUT.parquet")
    return fmt


def resolve_output(output: str, input_path: str | None, side_files: list[Path]) -> OutputTarget:
    """The output checked: not the input (nor are its side files), not a directory, and a
    device, FIFO or `-` streamed to. Nothing is created or opened here."""
    if output == STDIO:
        return OutputTarget(output, stream=True)
    p = Path(output).expanduser()
    if p.is_dir():
        raise InputError(f"{output}: is a directory; give an output file path, or - for stdout")
    if p.exists() and (_is_special(p) or not stat.S_ISREG(p.stat().st_mode)):
        mode = p.stat().st_mode if p.exists() else 0
        if not (stat.S_ISCHR(mode) or stat.S_ISFIFO(mode) or stat.S_ISREG(mode)):
            raise InputError(f"{output}: not a regular file; give an output file path, or -")
        return OutputTarget(output, stream=True)
    source = Path(input_path).expanduser() if input_path and input_path != STDIO else None
    if source is not None and source.is_dir():
        for path in (p, *side_files):
            if path.resolve().is_relative_to(source.resolve()):
                raise InputError(
                    f"{output}: is inside the input dataset directory ({input_path}); lmpress "
                    f"never writes into what it reads: choose an output path outside it"
                )
    if input_path and input_path != STDIO:
        for path in (p, *side_files):
            if path.exists() and os.path.samefile(path, Path(input_path).expanduser()):
                what = "is" if path == p else f"would replace {path.name}, which is"
                raise InputError(
                    f"{output}: {what} the input file ({input_path}); lmpress never writes over "
                    f"what it reads: choose another output path"
                )
    return OutputTarget(output)


def _is_special(path: Path) -> bool:
    """/dev/stdout and its kind: a path under /dev or resolving into /proc is never replaced."""
    resolved = os.path.realpath(path)
    return str(path).startswith("/dev/") or resolved.startswith(("/dev/", "/proc/"))


def open_read(path: str | Path) -> IO[bytes]:
    """A binary reader of the file, decompressed by its suffix."""
    name = str(path).lower()
    if name.endswith(".gz"):
        import gzip

        return gzip.open(path, "rb")
    if name.endswith(".bz2"):
        import bz2

        return bz2.open(path, "rb")
    if name.endswith(".xz"):
        import lzma

        return lzma.open(path, "rb")
    if name.endswith(".zst"):
        import zstandard

        raw = open(path, "rb")  # noqa: SIM115 - closed with the reader
        reader = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)
        return io.BufferedReader(reader)  # type: ignore[arg-type]
    return open(path, "rb")


def open_write(path: str | Path, mode: str) -> IO[str]:
    """A text writer ("w" or "a") compressing by the suffix. Appending to a compressed file adds
    a new member or frame, which every reader of these formats reads on."""
    name = str(path).lower()
    if name.endswith((".gz", ".bz2", ".xz")):
        import bz2
        import gzip
        import lzma

        opener = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}[name[name.rfind(".") :]]
        return opener(path, mode + "t", encoding="utf-8")  # type: ignore[operator]
    if name.endswith(".zst"):
        import zstandard

        return zstandard.open(path, mode + "t", encoding="utf-8")  # type: ignore[return-value]
    return open(path, mode, encoding="utf-8")


def is_compressed(path: str | Path) -> bool:
    return str(path).lower().endswith(COMPRESSED)


def write_text_atomically(path: Path, text: str) -> None:
    """Replace `path` with `text` whole or not at all: written to a scratch file beside it,
    then renamed over it, so a full disk or a kill leaves the old file (or none), never an
    empty or half-written one. The scratch file is removed when the write fails."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with tmp.open("w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
