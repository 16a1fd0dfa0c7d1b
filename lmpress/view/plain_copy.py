"""A compressed output (OUT.jsonl.gz, .zst, .bz2, .xz, as data/targets.py writes them) as the
viewer reads it: through a plain JSONL copy in lmpress's cache directory, which index.py indexes
and reads at byte offsets like any JSONL file. Compressed data has no offset a row can be read
at, and decompressing the file again for each page would cost seconds a page.

The copy is made streaming, READ_BYTES of compressed data at a time written out as they
decompress, so memory stays flat whatever the file's size. The decompressor is kept open
between looks, so a file a running job still appends to is followed: each of these formats
decompresses as its bytes come, and a resumed job's new gzip member or zstd frame is read on
with a fresh decompressor.

The copy is named for the source's path and kept with a record of what it was made from (the
source's inode and first bytes, the compressed bytes read, where the last whole member ended in
both files). Opened again, a source that did not change is not read at all; one that grew is
decompressed on from its last whole member (a decompressor's state is not kept); one that was
replaced is decompressed again from the start (`generation` counts those restarts, so that the
copy's index starts over too). Nothing is written beside the user's file.

One copy per source per process (`PlainCopy.of`): two views of one file share it. A second
process viewing the file while the first holds its copy (a lock held for the first's life)
makes a copy of its own, named for its pid and removed when it exits: two processes appending
to one copy would interleave.

Copies are not kept for ever: the first copy a process opens first removes (`prune`) those whose
source is gone, those no viewer opened for KEEP_DAYS days, and private ones whose process died
without removing its own; a copy some viewer holds is left alone. A removed copy is only made
again, should its source be opened after all.
"""

from __future__ import annotations

import atexit
import bz2
import fcntl
import hashlib
import json
import lzma
import os
import threading
import time
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from lmpress.data.targets import COMPRESSED, write_text_atomically

READ_BYTES = 1 << 16  # compressed bytes read at a time: a few MB out, even at 80:1
HEAD_BYTES = 4096  # a source whose first bytes changed was replaced, not appended to
FORMAT = 2  # raised whenever what the record holds changes
KEEP_DAYS = 14  # a copy no viewer opened for this long is removed
# What each copy keeps beside itself in the cache: its lock (shared copies only), its record and
# its index (index.py's, beside the file it indexes).
BESIDE = ("", ".lock", ".made.json", ".view-index")

_COPIES: dict[Path, PlainCopy] = {}
_COPIES_LOCK = threading.Lock()


class Decompressor(Protocol):
    eof: bool
    unused_data: bytes

    def decompress(self, data: bytes) -> bytes: ...


def path_digest(path: Path) -> str:
    """A short name for a file's resolved path, for what the viewer keeps of it in lmpress's
    cache (its index, its plain copy)."""
    return hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:16]


def decompressor(source: Path) -> Decompressor:
    """A decompressor of one gzip member, bz2 or xz stream, or zstd frame, by the suffix."""
    name = source.name.lower()
    if name.endswith(".gz"):
        return zlib.decompressobj(wbits=31)  # type: ignore[return-value]
    if name.endswith(".bz2"):
        return bz2.BZ2Decompressor()  # type: ignore[return-value]
    if name.endswith(".xz"):
        return lzma.LZMADecompressor()  # type: ignore[return-value]
    import zstandard

    return zstandard.ZstdDecompressor().decompressobj()  # type: ignore[return-value]


def copy_path(source: Path, private: bool = False) -> Path:
    """Where a compressed file's plain copy lives: lmpress's cache, named for the source's path
    (and its name, without the compression suffix, for a person looking there); `private`: a
    copy of this process's own (another holds the shared one)."""
    from lmpress.builtin_models.tiny import cache_root

    digest = path_digest(source)
    plain = source.name
    for suffix in COMPRESSED:
        plain = plain.removesuffix(suffix)
    own = f"{os.getpid()}-" if private else ""
    return cache_root() / "view" / "plain" / f"{digest}-{own}{plain}"


@dataclass
class Made:
    """What a copy was made from, as far as it got."""

    inode: int = 0
    head: str = ""  # digest of the source's first head_length bytes
    head_length: int = 0
    read: int = 0  # compressed bytes decompressed into the copy
    written: int = 0  # the copy's size
    member_read: int = 0  # where the last whole member (or frame) ended in the source
    member_written: int = 0  # ... and in the copy
    source: str = ""  # the compressed file's path, for `prune`
    format: int = FORMAT


class PlainCopy:
    """The plain copy of one compressed file, kept up with it by `update`."""

    def __init__(self, source: Path):
        self.source = source
        self.path = copy_path(source)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._held = _hold(self.path.with_name(f"{self.path.name}.lock"))
        if self._held is None:  # another process's copy: one of this process's own
            self.path = copy_path(source, private=True)
            atexit.register(_remove, self.path)
        _prune_once(self.path.parent)
        self.record = self.path.with_name(f"{self.path.name}.made.json")
        self.generation = 0
        self.problem: str | None = None  # why the source stopped decompressing, where it did
        self._made = Made()
        self._open: Decompressor | None = None
        self._loaded = False
        self._lock = threading.Lock()

    @classmethod
    def of(cls, source: Path) -> PlainCopy:
        source = Path(os.path.abspath(source))
        key = copy_path(source)  # (where the cache is, too)
        with _COPIES_LOCK:
            if key not in _COPIES:
                _COPIES[key] = cls(source)
            return _COPIES[key]

    def update(self) -> None:
        """Decompress what the source gained since the last look onto the copy's end; start
        over where the source was replaced. A source gone leaves the copy as it was."""
        with self._lock:
            try:
                stat = os.stat(self.source)
            except FileNotFoundError:
                return
            if not self._loaded:
                self._loaded = True
                self._load()
            made = self._made
            if made.read and (
                stat.st_ino != made.inode
                or stat.st_size < made.read
                or self._head(made.head_length) != made.head
            ):
                self._start_over()
            made = self._made
            if stat.st_size == made.read or (self.problem and self._open is None):
                return
            if self._open is None and made.read:  # opened again: on from the last whole member
                made.read, made.written = made.member_read, made.member_written
                self._truncate(made.written)
            made.inode, made.source = stat.st_ino, str(self.source)
            self._feed(stat.st_size)
            if made.head_length < HEAD_BYTES:
                made.head_length = min(HEAD_BYTES, made.read)
                made.head = self._head(made.head_length)
            write_text_atomically(self.record, json.dumps(asdict(made)))

    def close(self) -> None:
        """Let another process take the copy (the registry's copies live as long as their
        process: this is for a copy made outside it)."""
        if self._held is not None and not self._held.closed:
            self._held.close()

    def _feed(self, end: int) -> None:
        made = self._made
        with open(self.source, "rb") as source, open(self.path, "ab") as copy:
            source.seek(made.read)
            while made.read < end:
                data = source.read(min(READ_BYTES, end - made.read))
                if not data:
                    break
                start = made.read
                try:
                    self._decompress(data, copy, start)
                except (OSError, EOFError, ValueError, zlib.error, lzma.LZMAError) as exc:
                    self._stop(exc)
                    return
                except Exception as exc:  # zstandard.ZstdError, not imported for other formats
                    if type(exc).__name__ != "ZstdError":
                        raise
                    self._stop(exc)
                    return
                made.read = start + len(data)

    def _decompress(self, data: bytes, copy: Any, start: int) -> None:
        """Decompress one read's bytes onto the copy; a member's end noted, and the next
        member's bytes read by a new decompressor."""
        made, offset = self._made, start
        while data:
            if self._open is None:
                self._open = decompressor(self.source)
            out = self._open.decompress(data)
            copy.write(out)
            made.written += len(out)
            if not self._open.eof:
                return
            rest = self._open.unused_data
            offset += len(data) - len(rest)
            made.member_read, made.member_written = offset, made.written
            self._open, data = None, rest

    def _stop(self, exc: Exception) -> None:
        """Damaged data: the copy keeps what came before it, and is not read on."""
        self.problem = (
            f"{self.source.name}: the compressed data is damaged after byte {self._made.read}; "
            f"the rows before it are shown ({exc})"
        )
        self._open = None

    def _start_over(self) -> None:
        self._made, self._open, self.problem = Made(), None, None
        self.generation += 1
        self._truncate(0)

    def _truncate(self, size: int) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "ab") as copy:
            copy.truncate(size)

    def _head(self, length: int) -> str:
        with open(self.source, "rb") as handle:
            return hashlib.sha256(handle.read(length)).hexdigest()

    def _load(self) -> None:
        """The record of a copy made before, where the copy is still as it says."""
        try:
            made = Made(**json.loads(self.record.read_text()))
            size = self.path.stat().st_size
        except (OSError, ValueError, TypeError):
            self._start_over()
            return
        if made.format != FORMAT or size < made.written:
            self._start_over()
            return
        if size > made.written:  # a write the record never saw
            self._truncate(made.written)
        self._made = made


def _hold(lock: Path, opening: bool = True) -> Any:
    """The lock file `lock`, open and locked by this process, and its time set to now where
    this is a viewer `opening` the copy; None where another process holds it. A lock file
    `prune` removed while this process waited to open it is not held: the one at the path is
    taken instead."""
    while True:
        held = open(lock, "a")  # noqa: SIM115
        try:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            held.close()
            return None
        try:
            same = os.stat(lock).st_ino == os.fstat(held.fileno()).st_ino
        except FileNotFoundError:
            same = False
        if same:
            if opening:
                os.utime(lock)  # what `prune` ages copies by
            return held
        held.close()


_PRUNED: set[Path] = set()
_PRUNED_LOCK = threading.Lock()  # not _COPIES_LOCK: `PlainCopy.of` holds it making a copy


def _prune_once(folder: Path) -> None:
    with _PRUNED_LOCK:
        if folder in _PRUNED:
            return
        _PRUNED.add(folder)
    prune(folder)


def prune(folder: Path, now: float | None = None) -> list[str]:
    """Remove from `folder` (the cache's plain copies) the copies whose source is gone, those
    whose lock says no viewer opened them for KEEP_DAYS days, and private copies whose process
    is gone, each with what it kept beside it; a copy a viewer holds stays. The removed copies'
    names."""
    now = time.time() if now is None else now
    removed = []
    for record in folder.glob("*.made.json"):
        copy = folder / record.name.removesuffix(".made.json")
        lock = copy.with_name(f"{copy.name}.lock")
        if not lock.exists():  # a private copy: "<digest>-<pid>-<name>"
            pid = copy.name.split("-")[1]
            dead = pid.isdigit() and not _alive(int(pid))
            if dead or _age(record, now) > KEEP_DAYS * 86400:
                _remove(copy)
                removed.append(copy.name)
            continue
        age = _age(lock, now)
        held = _hold(lock, opening=False)
        if held is None:  # a viewer has it open
            continue
        with held:
            try:
                source = json.loads(record.read_text()).get("source", "")
            except (OSError, ValueError, AttributeError):
                source = ""
            if age > KEEP_DAYS * 86400 or (source and not os.path.exists(source)):
                _remove(copy)
                removed.append(copy.name)
    return removed


def _age(path: Path, now: float) -> float:
    try:
        return now - path.stat().st_mtime
    except FileNotFoundError:
        return 0.0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove(copy: Path) -> None:
    """A copy and what was kept beside it (its lock, its record, its index)."""
    for suffix in BESIDE:
        copy.with_name(f"{copy.name}{suffix}").unlink(missing_ok=True)
