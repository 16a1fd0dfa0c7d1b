"""The lock one job holds on its output (`lmpress/data/output_lock.py`): a second taker is refused
with the holder's pid and host, the lock goes with its holder, a forked child does not keep
it, starting over keeps its file, and a filesystem that cannot lock is named, not passed."""

from __future__ import annotations

import errno
import fcntl
import os
import socket

import pytest

from lmpress.data.output_lock import NO_LOCK_ENV, OutputLock
from lmpress.data.resume import JobFiles
from lmpress.vocabulary.errors import InputError


def test_a_second_taker_is_refused_with_the_holders_pid_and_host(tmp_path):
    files = JobFiles.beside(tmp_path / "out.parquet", "parquet")
    assert files.lock == tmp_path / "out.parquet.lock" and files.lock in files.side_files
    with OutputLock.take(files.lock, files.output), pytest.raises(InputError) as refused:
        OutputLock.take(files.lock, files.output)
    message = str(refused.value)
    assert message.startswith(f"{files.output}: the lmpress job pid {os.getpid()} on ")
    assert socket.gethostname() in message and "run this command again" in message
    with OutputLock.take(files.lock, files.output):  # released: the next one takes it
        pass
    assert files.lock.exists()  # and its file stays (see the module's docstring)


def test_starting_over_removes_every_side_file_but_the_lock(tmp_path):
    files = JobFiles.beside(tmp_path / "out.parquet", "parquet")
    for path in (files.output, *files.side_files):
        path.write_text("x")
    with OutputLock.take(files.lock, files.output):
        inode = files.lock.stat().st_ino
        files.remove_all()
        assert [p.name for p in tmp_path.iterdir()] == ["out.parquet.lock"]
        assert files.lock.stat().st_ino == inode
        with pytest.raises(InputError, match="is writing this output"):
            OutputLock.take(files.lock, files.output)


def test_a_forked_child_does_not_keep_the_lock(tmp_path):
    path = tmp_path / "out.lock"
    held = OutputLock.take(path, "out.jsonl")
    release_child, child_end = os.pipe()
    started, child_started = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child (an engine's worker) lives on past its parent's lock
        os.write(child_started, b"x")  # past the fork and its hooks
        os.read(release_child, 1)
        os._exit(0)
    try:
        assert os.read(started, 1) == b"x"
        held.release()
        with OutputLock.take(path, "out.jsonl"):  # the child's copy did not keep it
            pass
    finally:
        os.write(child_end, b"x")
        os.waitpid(pid, 0)
        for fd in (release_child, child_end, started, child_started):
            os.close(fd)


def test_a_filesystem_that_cannot_lock_is_named_and_can_be_run_without(tmp_path, monkeypatch):
    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", no_locks)  # as an NFS mount without a lock service
    path = tmp_path / "out.lock"
    with pytest.raises(InputError) as refused:
        OutputLock.take(path, "out.jsonl")
    message = str(refused.value)
    assert message.startswith("out.jsonl: cannot lock out.lock (No locks available)")
    assert f"{NO_LOCK_ENV}=1" in message
    monkeypatch.setenv(NO_LOCK_ENV, "1")
    with OutputLock.take(path, "out.jsonl"):
        pass
