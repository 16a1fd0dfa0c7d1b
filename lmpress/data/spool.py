"""A piped input (`-i -`, `/dev/stdin`, `<(cmd)`, a FIFO) copied once to a scratch file, so a job
reads it as often as it needs: the scan that counts rows, checks ids and draws a sample, then
the run.

A pipe can be read only once. A job used to read its input twice (the scan, then the run), so
a piped input came to the run empty and the job said it had succeeded with nothing written.
Now the stream is copied as it is read, in blocks, to a hidden file beside the output (in the
system's temporary folder when the output is itself a stream), and the job reads that; the
copy is removed when the job ends. Its compression is told by its first bytes, a pipe having
no name to say it. Since a piped job's rows keep their ids, the same rows piped again resume
a job that was stopped.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from lmpress.data.file_kinds import compression_suffix
from lmpress.data.sources import Source
from lmpress.data.targets import STDIO
from lmpress.vocabulary.errors import DISK_ERRNOS, InputError, OutputWriteError

BLOCK = 1 << 20


@contextmanager
def spooled(source: Source, folder: Path | None = None, label: str = "") -> Iterator[Source]:
    """The source itself when it is a file; a stream's copy in `folder` (None: the system's
    temporary folder), checked as a file is, and removed on leaving. `label` goes into the
    copy's name (the output's), so that a user who sees it knows whose it is."""
    if not source.stream:
        yield source
        return
    with _stream(source.path) as stream:
        head = _read(stream, source)
        fd, spool = tempfile.mkstemp(
            dir=folder, prefix=f".{label}.input-" if label else ".lmpress-input-",
            suffix=compression_suffix(head),
        )  # fmt: skip
        try:
            with os.fdopen(fd, "wb") as copy:
                _copy(stream, copy, head, source, spool)
            copied = dataclasses.replace(source, path=spool, stream=False, shown_as=source.name)
            copied.check()
            yield copied
        finally:
            Path(spool).unlink(missing_ok=True)


def remove_stale(folder: Path, label: str, keep: str) -> None:
    """Remove the copies a killed job (kill -9) left of its piped input; the job writing the
    output calls this once it holds the output's lock, so no live job's copy is among them."""
    kept = Path(keep).resolve()
    for stale in folder.glob(f".{glob.escape(label)}.input-*"):
        if stale.resolve() != kept:  # the live copy's path is absolute, the folder may not be
            stale.unlink(missing_ok=True)


@contextmanager
def _stream(path: str) -> Iterator[IO[bytes]]:
    if path == STDIO:
        yield sys.stdin.buffer  # not closed: it is the process's
        return
    try:
        handle = open(Path(path).expanduser(), "rb")  # noqa: SIM115 - closed below
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror})") from exc
    with handle:
        yield handle


def _read(stream: IO[bytes], source: Source) -> bytes:
    try:
        return stream.read(BLOCK)
    except OSError as exc:
        raise InputError(f"{source.name}: cannot read ({exc.strerror})") from exc


def _copy(stream: IO[bytes], copy: IO[bytes], head: bytes, source: Source, spool: str) -> None:
    try:
        copy.write(head)
        while block := _read(stream, source):
            copy.write(block)
    except OSError as exc:
        if exc.errno in DISK_ERRNOS:
            raise OutputWriteError(spool, exc, started=False) from exc
        raise InputError(f"{spool}: cannot write the copy of {source.name} ({exc})") from exc
