"""Where a batch job reads and writes, checked before anything is opened for writing.

A batch job owns its output file and the side files beside it, and nothing else: it must never
write over the file it reads (`-i X -o X`, or `-o ./X`), and never replace something that is not
a regular file (`/dev/stdout`, a FIFO, a directory). Those are streamed to, as `-o -` is: rows go
out as they finish, with no side files and no resume, since there is nothing to resume from.

The file's suffix says how it is stored: JSONL, optionally compressed (.gz .bz2 .xz with the
standard library, .zst with `zstandard`). Formats lmpress does not read yet are refused by name
before any model loads, instead of failing every line.
"""

from __future__ import annotations

import io
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from lmpress.errors import InputError

STDIO = "-"
COMPRESSED = (".gz", ".bz2", ".xz", ".zst")
# Suffixes of formats a later version may read; named so the refusal says what the file is.
NOT_YET = {
    ".csv": "CSV", ".tsv": "TSV", ".parquet": "Parquet", ".pq": "Parquet", ".arrow": "Arrow",
    ".feather": "Feather", ".xlsx": "Excel", ".xls": "Excel", ".avro": "Avro", ".orc": "ORC",
    ".zip": "ZIP", ".tar": "tar", ".7z": "7-Zip", ".lz4": "LZ4",
}  # fmt: skip
SUPPORTED = "JSONL (optionally compressed: .gz, .zst, .bz2, .xz)"


@dataclass(frozen=True)
class OutputTarget:
    """Where results go. `stream`: stdout, a device or a FIFO, written to as it is."""

    path: str
    stream: bool = False

    @property
    def label(self) -> str:
        return "stdout" if self.path == STDIO else self.path


def check_format(path: str, role: str) -> None:
    """Refuse a file whose suffix names a format lmpress cannot read or write yet."""
    name = Path(path).name.lower()
    for suffix in COMPRESSED:
        name = name.removesuffix(suffix)
    kind = NOT_YET.get(Path(name).suffix)
    if kind:
        raise InputError(
            f"{path}: {kind} files are not supported yet as {role}; lmpress reads and writes "
            f"{SUPPORTED}. CSV/Parquet support is planned: convert to JSONL for now"
        )


def check_input(path: str) -> None:
    """The input exists, is a file and is in a format lmpress reads."""
    p = Path(path).expanduser()
    if p.is_dir():
        raise InputError(f"{path}: is a directory, expected a JSONL file")
    if not p.exists():
        raise InputError(f"{path}: no such input file")
    check_format(path, "input")


def resolve_output(output: str, input_path: str | None, side_files: list[Path]) -> OutputTarget:
    """The output checked: not the input (nor are its side files), not a directory, and a
    device, FIFO or `-` streamed to. Nothing is created or opened here."""
    if output == STDIO:
        return OutputTarget(output, stream=True)
    check_format(output, "output")
    p = Path(output).expanduser()
    if p.is_dir():
        raise InputError(f"{output}: is a directory; give an output file path, or - for stdout")
    if p.exists() and (_is_special(p) or not stat.S_ISREG(p.stat().st_mode)):
        mode = p.stat().st_mode if p.exists() else 0
        if not (stat.S_ISCHR(mode) or stat.S_ISFIFO(mode) or stat.S_ISREG(mode)):
            raise InputError(f"{output}: not a regular file; give an output file path, or -")
        return OutputTarget(output, stream=True)
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
