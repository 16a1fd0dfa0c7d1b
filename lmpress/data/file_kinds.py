"""What an input file is, judged by its first bytes and first lines, so that a file that is not
what its name (or `--input-format`) claims stops the job before any work, in one line.

Without this check a file of random bytes given as `-i data.jsonl` failed every line alone:
200 KB printed 799 `not valid UTF-8` lines, a `.so` 3,359, and every re-run printed them again.
Now the job stops at once, exit 2, with nothing written, when
- the first bytes are a known binary format's signature (Parquet, ELF, ZIP, a compression
  the name does not say, UTF-16 text, ...), or are not text at all (NUL bytes, or mostly
  bytes that are not UTF-8); or
- the first `BAD_RUN` rows in a row cannot be read (text, but not JSON lines, or CSV rows
  that do not match their header).
A good file with a few bad lines is read as before: each bad line fails alone.

The same signatures tell which compression a piped input has (`compression_suffix`), since
a pipe has no name to say it.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable

from lmpress.data.file_formats import FileFormat
from lmpress.data.jsonl import Line
from lmpress.vocabulary.errors import InputError

SNIFF_BYTES = 8192  # enough to see a signature and a few lines of text
BAD_RUN = 20  # rows that cannot be read, in a row from the first, before a file is refused
# Of the first bytes, the share that may be neither UTF-8 nor printable before the file is
# taken as binary: a Latin-1 word or two in text stays far below it, random bytes far above.
NOT_TEXT_SHARE = 0.1

# Signatures at the start of a file, and what they say it is.
COMPRESSIONS = {
    b"\x1f\x8b": ".gz",
    b"BZh": ".bz2",
    b"\xfd7zXZ\x00": ".xz",
    b"\x28\xb5\x2f\xfd": ".zst",
}
SIGNATURES = {
    b"PAR1": "a Parquet file (give it a .parquet name, or --input-format parquet)",
    b"\x7fELF": "an executable or shared library (.so)",
    b"PK\x03\x04": "a ZIP archive",
    b"ARROW1": "an Arrow file",
    b"SQLite format 3\x00": "an SQLite database",
    b"\x89PNG": "a PNG image",
    b"\xff\xd8\xff": "a JPEG image",
    b"%PDF": "a PDF document",
    b"\xff\xfe": "UTF-16 text (save it as UTF-8)",
    b"\xfe\xff": "UTF-16 text (save it as UTF-8)",
    **{
        magic: f"{suffix.lstrip('.')}-compressed data (name it with a {suffix} suffix)"
        for magic, suffix in COMPRESSIONS.items()
    },
}


def compression_suffix(head: bytes) -> str:
    """The suffix of the compression whose signature `head` starts with; '' for none."""
    for magic, suffix in COMPRESSIONS.items():
        if head.startswith(magic):
            return suffix
    return ""


def check_head(name: str, head: bytes, file_format: FileFormat) -> None:
    """Refuse a file whose first (decompressed) bytes are not text of that format."""
    what = _looks_like(head)
    if what is not None:
        raise InputError(
            f"{name}: looks like {what}, not {_format_name(file_format)}; nothing was run"
        )


def check_rows(name: str, lines: Iterable[Line], file_format: FileFormat, unit: str) -> None:
    """Refuse a file whose first `BAD_RUN` rows all fail to read; reads no further."""
    first: Line | None = None
    for bad, line in enumerate(lines, 1):
        if line.error is None:
            return
        first = first or line
        if bad >= BAD_RUN:
            raise InputError(
                f"{name}: the first {BAD_RUN} {unit}s cannot be read ({unit} {first.number}: "
                f"{first.error}); it does not look like {_format_name(file_format)}: check "
                f"the file, or name its format with --input-format; nothing was run"
            )


def _looks_like(head: bytes) -> str | None:
    for magic, what in SIGNATURES.items():
        if head.startswith(magic):
            return what
    if not head:
        return None
    if b"\x00" in head:
        return "binary data (it holds NUL bytes)"
    decoded = codecs.getincrementaldecoder("utf-8")(errors="replace").decode(head, final=False)
    odd = sum(1 for ch in decoded if ch == "\ufffd" or (ch < " " and ch not in "\t\n\r\f"))
    if odd > max(1, NOT_TEXT_SHARE * len(decoded)):
        return "binary data (not UTF-8 text)"
    return None


def _format_name(file_format: FileFormat) -> str:
    return {
        FileFormat.JSONL: "JSON lines",
        FileFormat.CSV: "CSV text",
        FileFormat.TSV: "TSV text",
    }.get(file_format, str(file_format))
