"""The response cache's SQLite file: entries survive, several processes write at once without
losing or garbling one, a damaged entry reads as a miss and a damaged file is refused, and the
size cap evicts the least recently used."""

from __future__ import annotations

import base64
import multiprocessing
import random
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from lmpress.cache import store as store_module
from lmpress.cache.store import DB_NAME, CacheDamaged, Entry, ResponseStore


def entry(i: int, size: int = 20) -> Entry:
    """Entry `i`, its value about `size` bytes that do not deflate (as replies hardly do)."""
    key = i.to_bytes(32, "big")
    pad = base64.b64encode(random.Random(i).randbytes(size * 3 // 4)).decode()
    value = (f'{{"n":{i},"pad":"' + pad + '"}').encode()
    return Entry(key, value, "REMOTE", "test-model")


def test_entries_are_kept_across_opens(tmp_path: Path):
    store = ResponseStore(tmp_path)
    for i in range(300):  # past one flush's worth, and one left pending at close
        store.put(entry(i, size=i * 10))
    store.close()
    again = ResponseStore(tmp_path)
    assert all(again.get(entry(i).key) == entry(i, size=i * 10).value for i in range(300))
    assert again.get((999).to_bytes(32, "big")) is None
    assert again.stats().entries == 300
    again.close()


def _writer(directory: str, start: int, count: int, waits: multiprocessing.Queue) -> None:
    store = ResponseStore(Path(directory))
    for i in range(start, start + count):
        store.put(entry(i, size=i % 700))
        if i % 97 == 0:
            store.flush()
    store.close()
    waits.put(store.longest_lock_wait_s)


def test_two_processes_writing_at_once_lose_and_garble_nothing(tmp_path: Path):
    context = multiprocessing.get_context("spawn")
    waits = context.Queue()
    writers = [
        context.Process(target=_writer, args=(str(tmp_path), start, 3000, waits))
        for start in (0, 2000)  # 1,000 keys written by both, as two jobs on the same rows
    ]
    for process in writers:
        process.start()
    for process in writers:
        process.join(120)
        assert process.exitcode == 0
    store = ResponseStore(tmp_path)
    for i in range(5000):
        assert store.get(entry(i).key) == entry(i, size=i % 700).value, i
    assert store.stats().entries == 5000
    assert store.damaged_reads == 0
    store.close()
    assert [waits.get(timeout=5) for _ in writers]  # each writer finished and said so


def _opener(directories: list[str], barrier: Any, failures: Any) -> None:
    for directory in directories:
        barrier.wait()  # every process opens the same new store at the same moment
        try:
            ResponseStore(Path(directory)).close()
        except CacheDamaged as exc:
            failures.put(str(exc))


def test_jobs_opening_a_new_store_at_the_same_moment_all_open_it(tmp_path: Path):
    """Four jobs starting together on a cache no one has made yet: each opens it, none is told
    it is locked (SQLite's switch to WAL answered "database is locked" at once, and the job
    would have run without its cache; about 1 open in 13 here before it was retried)."""
    context = multiprocessing.get_context("spawn")
    directories = [str(tmp_path / str(i)) for i in range(40)]
    barrier, failures = context.Barrier(4), context.Queue()
    openers = [
        context.Process(target=_opener, args=(directories, barrier, failures)) for _ in range(4)
    ]
    for process in openers:
        process.start()
    for process in openers:
        process.join(120)
        assert process.exitcode == 0
    assert failures.empty(), failures.get()


def test_a_damaged_entry_reads_as_a_miss_not_as_another_reply(tmp_path: Path):
    store = ResponseStore(tmp_path)
    store.put(entry(1, size=2000))  # stored deflated
    store.put(entry(2))
    store.close()
    db = sqlite3.connect(tmp_path / DB_NAME)
    db.execute("UPDATE responses SET value = ? WHERE key = ?", (b'{"n":7}', entry(2).key))
    value = db.execute("SELECT value FROM responses WHERE key = ?", (entry(1).key,)).fetchone()
    flipped = value[0][:40] + bytes([value[0][40] ^ 0xFF]) + value[0][41:]
    db.execute("UPDATE responses SET value = ? WHERE key = ?", (flipped, entry(1).key))
    db.commit()
    db.close()
    store = ResponseStore(tmp_path)
    assert store.get(entry(1).key) is None
    assert store.get(entry(2).key) is None
    assert store.damaged_reads == 2
    store.close()


def test_a_file_that_is_not_a_database_is_refused(tmp_path: Path):
    (tmp_path / DB_NAME).write_bytes(b"this is not SQLite" * 100)
    with pytest.raises(CacheDamaged, match=DB_NAME):
        ResponseStore(tmp_path)


def test_past_the_cap_the_least_recently_used_go(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(store_module, "TOUCH_S", 0.0)  # every hit refreshes its entry's use
    store = ResponseStore(tmp_path)
    store.set_max_bytes(600 * 1024)
    for i in range(100):
        store.put(entry(i, size=3000))
        store.flush()
        time.sleep(0.002)
    # The oldest ten are used again, so they are the most recent now.
    for i in range(10):
        assert store.get(entry(i).key) is not None
    store.flush()
    for i in range(100, 200):
        store.put(entry(i, size=3000))
        store.flush()
    assert store.stats().bytes <= 600 * 1024
    kept = [i for i in range(200) if store.get(entry(i).key) is not None]
    # Gone: the oldest of the entries not used again, and only those.
    gone = sorted(set(range(200)) - set(kept))
    assert gone and gone == list(range(10, 10 + len(gone)))
    assert set(range(10)) <= set(kept) and set(range(100, 200)) <= set(kept)
    store.close()
