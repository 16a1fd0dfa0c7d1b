"""One job per output: an exclusive lock beside the output, held while a job writes it.

Two jobs on one output (a command re-run from a second terminal, a scheduler's retry, an
overlapping cron entry) each resume from what the other has not written yet, redo it, and
both append: rows are written twice. So a job locks OUT.lock before it reads anything an
earlier run left, and a second job on that output, whatever its flags, is refused at once
with the first job's pid and host.

The lock is `flock`, which the kernel drops when the process ends however it ends (kill -9
too), so a dead job never leaves a stale lock. The file stays: it is never removed, since a
job removing it while a second one waits on it would let a third lock a new file of the same
name beside the second. What the file holds (the holder's pid and host) is only for the
message. A process forked from the job (an engine's workers) drops its copy of the lock at
the fork, so a worker that outlives a killed job does not keep the output locked.

A filesystem that cannot lock (a network mount without a lock service answers ENOLCK) is
refused in one line: LMPRESS_NO_LOCK=1 runs without the lock, the user then keeping to one
job per output.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import time
from pathlib import Path

from lmpress.vocabulary.errors import InputError

NO_LOCK_ENV = "LMPRESS_NO_LOCK"
AGAIN = (
    "wait for it to end (or stop it), then run this command again: two jobs on one output "
    "would write rows twice"
)

_held: set[int] = set()  # descriptors this process holds locks through


def _drop_in_child() -> None:
    for fd in _held:
        try:
            os.close(fd)  # the parent's descriptor keeps the lock; the child's copy goes
        except OSError:
            pass
    _held.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_drop_in_child)


class OutputLock:
    """The lock on one output; `release()` (or leaving the `with`) gives it back."""

    def __init__(self, path: Path, fd: int | None):
        self.path = path
        self._fd = fd

    @classmethod
    def take(cls, path: Path, output: str | Path, then: str = AGAIN) -> OutputLock:
        """Lock `path` for the job writing `output`, or raise an InputError naming the job
        that holds it and saying `then` (what to do)."""
        if os.environ.get(NO_LOCK_ENV):
            return cls(path, None)
        try:
            import fcntl
        except ImportError:  # no flock on this platform (Windows): nothing to lock with
            return cls(path, None)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        except OSError as exc:
            raise InputError(f"{output}: cannot create its lock {path} ({exc.strerror})") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _holder(fd) if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK) else None
            os.close(fd)
            if holder is None and exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
                holder = "another lmpress job"
            if holder is not None:
                raise InputError(f"{output}: {holder} is writing this output; {then}") from None
            raise InputError(
                f"{output}: cannot lock {path.name} ({exc.strerror}): this filesystem does not "
                f"lock files, so lmpress cannot keep a second job off this output; write it "
                f"on a local disk, or set {NO_LOCK_ENV}=1 to run without the lock and run one "
                f"job per output yourself"
            ) from exc
        _held.add(fd)
        _say_holder(fd)
        return cls(path, fd)

    def note(self, **facts: object) -> None:
        """Add what the job knows once it started (`rows_total`, the rows it was given) to the
        holder's record, for `lmpress view` to show a running job's progress; read only by
        others, as the pid is."""
        if self._fd is not None:
            _say_holder(self._fd, facts)

    def release(self) -> None:
        if self._fd is None:
            return
        _held.discard(self._fd)
        try:
            os.ftruncate(self._fd, 0)  # names no job once none holds it
        except OSError:
            pass
        os.close(self._fd)  # drops the lock; the file stays (see the module's docstring)
        self._fd = None

    def __enter__(self) -> OutputLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _say_holder(fd: int, facts: dict[str, object] | None = None) -> None:
    """Write who holds the lock into its file, for the message a second job gives (and what
    it noted since, for the viewer)."""
    record = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}
    if facts:
        try:
            record = {**json.loads(os.pread(fd, 4096, 0) or b"{}"), **facts}
        except (OSError, ValueError):
            record = {**record, **facts}
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
    except OSError:  # a full disk: the lock holds all the same, the message names no pid
        pass


def _holder(fd: int) -> str | None:
    """'the lmpress job pid N on HOST', from the lock file; None if it does not say (yet)."""
    for _ in range(10):  # the holder writes its pid just after it locks
        try:
            record = json.loads(os.pread(fd, 4096, 0) or b"null")
        except (OSError, ValueError):
            record = None
        if isinstance(record, dict) and "pid" in record:
            return f"the lmpress job pid {record['pid']} on {record.get('host', '?')}"
        time.sleep(0.02)
    return None
