"""The response cache's file: one SQLite database in WAL mode, shared by every lmpress process on
the machine (or on a shared filesystem that honours SQLite's locks).

Readers never wait for a writer in WAL mode, and writers queue for a lock that SQLite grants in
turn (`busy_timeout`). So that a job at full speed does not take the lock once per row, new
entries are buffered (and read from memory) and written in one transaction every FLUSH_S or
FLUSH_ENTRIES, and when the cache is closed; an entry lost to a crash costs only its
regeneration next time, since the job's output already holds the row. Lookups share a read
transaction for a quarter of a second rather than open one each. (A writer thread was tried:
on two cores it fought the event loop for the GIL and cost more than writing in line.)

Each entry carries a checksum of its key and value: a page damaged on disk reads as a miss,
never as another request's reply. A file that is not a database at all is refused when opened
(`CacheDamaged`), and the caller runs without a cache.

The size cap evicts the least recently used entries: an entry's last use is refreshed on a hit at
most once every TOUCH_S, so that hits stay reads.
"""

from __future__ import annotations

import hashlib
import sqlite3
import threading
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

DB_NAME = "responses.sqlite3"
SCHEMA_VERSION = 1
DEFAULT_MAX_BYTES = 5 * 1024**3
FLUSH_S = 1.0
FLUSH_ENTRIES = 1024
READ_SNAPSHOT_S = 0.25
TOUCH_S = 3600.0
BUSY_TIMEOUT_MS = 30_000  # a writer waits this long for another's transaction before failing
COMPRESS_FROM = 512  # values this long or longer are stored deflated

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    id INTEGER PRIMARY KEY,  -- new rows append to the table; keys (random) go to their index
    key BLOB NOT NULL UNIQUE,
    value BLOB NOT NULL,
    checksum BLOB NOT NULL,
    size INTEGER NOT NULL,
    engine TEXT NOT NULL,
    model TEXT NOT NULL,
    created REAL NOT NULL,
    used REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS responses_by_use ON responses (used);
CREATE TABLE IF NOT EXISTS settings (name TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


class CacheDamaged(Exception):
    """The cache file cannot be used: not a database, or one of another layout."""


@dataclass
class Entry:
    key: bytes
    value: bytes  # the reply as JSON
    engine: str
    model: str


@dataclass
class StoreStats:
    entries: int
    bytes: int  # the file's pages in use
    max_bytes: int
    oldest_use: float | None
    newest_use: float | None
    by_model: list[tuple[str, str, int]]  # (engine, model, entries)


def _checksum(key: bytes, stored: bytes) -> bytes:
    return hashlib.blake2b(key + stored, digest_size=8).digest()


class ResponseStore:
    def __init__(self, directory: Path, *, readonly: bool = False):
        self.path = directory / DB_NAME
        self.readonly = readonly
        self._lock = threading.Lock()  # the connection and the buffers below
        self._pending: dict[bytes, Entry] = {}  # kept, not written yet
        self._touched: dict[bytes, float] = {}
        self._last_flush = time.monotonic()
        self._reading_since: float | None = None  # the read transaction lookups share
        self.damaged_reads = 0
        self.longest_lock_wait_s = 0.0  # the longest a write waited for another's
        try:
            if readonly and not self.path.exists():
                self._db: sqlite3.Connection | None = None
                return
            directory.mkdir(parents=True, exist_ok=True)
            self._db = self._connect()
        except sqlite3.DatabaseError as exc:
            raise CacheDamaged(f"{self.path}: {exc}") from exc

    def _connect(self) -> sqlite3.Connection:
        uri = f"file:{self.path}{'?mode=ro' if self.readonly else ''}"
        db = sqlite3.connect(
            uri, uri=True, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None,
            check_same_thread=False,
        )  # fmt: skip
        db.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        if not self.readonly:
            _switch_to_wal(db)
            db.execute("PRAGMA synchronous = NORMAL")
            db.executescript(_SCHEMA)
            found = db.execute("SELECT value FROM settings WHERE name = 'schema'").fetchone()
            if found is None:
                db.execute(
                    "INSERT OR IGNORE INTO settings VALUES ('schema', ?)", (str(SCHEMA_VERSION),)
                )
            elif found[0] != str(SCHEMA_VERSION):
                raise sqlite3.DatabaseError(f"cache layout {found[0]}, not {SCHEMA_VERSION}")
        else:
            db.execute("SELECT 1 FROM responses LIMIT 1").fetchall()
        return db

    # --- reading and writing ---------------------------------------------------------------

    def get(self, key: bytes) -> bytes | None:
        """The value stored for `key`, or None: absent, or damaged (counted)."""
        if self._db is None:
            return None
        with self._lock:
            kept = self._pending.get(key)
            if kept is not None:
                return kept.value
            self._read_snapshot()
            row = self._db.execute(
                "SELECT value, checksum, used FROM responses WHERE key = ?", (key,)
            ).fetchone()
        if row is None:
            return None
        stored, checksum, used = row
        if _checksum(key, stored) != checksum:
            self.damaged_reads += 1
            return None
        now = time.time()
        if not self.readonly and now - used > TOUCH_S:
            with self._lock:
                self._touched[key] = now
        try:
            return zlib.decompress(stored) if stored[:1] == b"\x78" else stored
        except zlib.error:
            self.damaged_reads += 1
            return None

    def _read_snapshot(self) -> None:
        """Lookups share one read transaction for READ_SNAPSHOT_S (each on its own would pay
        for opening one: most of a lookup's time while the write-ahead log holds pages); what
        other processes write since shows in the next one."""
        assert self._db is not None
        now = time.monotonic()
        if self._reading_since is not None and now - self._reading_since < READ_SNAPSHOT_S:
            return
        self._end_read()
        self._db.execute("BEGIN")
        self._reading_since = now

    def _end_read(self) -> None:
        if self._reading_since is not None:
            assert self._db is not None
            self._reading_since = None
            self._db.execute("COMMIT")

    def contains(self, key: bytes) -> bool:
        return self.get(key) is not None

    def put(self, entry: Entry) -> None:
        """Keep `entry`; written with the next flush, which a put makes every FLUSH_S or
        FLUSH_ENTRIES. Any thread may put, get and flush."""
        with self._lock:
            self._pending[entry.key] = entry
            due = len(self._pending) >= FLUSH_ENTRIES
        if due or time.monotonic() - self._last_flush >= FLUSH_S:
            self.flush()

    def flush(self) -> None:
        """Write what is pending in one transaction. Entries a failed write loses cost a
        regeneration, no more."""
        self._last_flush = time.monotonic()
        if self._db is None or self.readonly:
            return
        with self._lock:
            self._end_read()
            pending, self._pending = self._pending, {}
            touched, self._touched = self._touched, {}
            if pending or touched:
                wait = self._write(self._db, pending, touched)
                self.longest_lock_wait_s = max(self.longest_lock_wait_s, wait)

    def _write(
        self, db: sqlite3.Connection, pending: dict[bytes, Entry], touched: dict[bytes, float]
    ) -> float:
        """One transaction: new entries, refreshed uses, and eviction past the cap; how long
        it waited for the lock."""
        now = time.time()
        rows = []
        for entry in pending.values():
            stored = entry.value
            if len(stored) >= COMPRESS_FROM:
                stored = zlib.compress(stored, 1)
            checksum = _checksum(entry.key, stored)
            rows.append((entry.key, stored, checksum, len(stored), entry.engine, entry.model,
                         now, now))  # fmt: skip
        uses = [(used, key) for key, used in touched.items()]
        waited = time.monotonic()
        db.execute("BEGIN IMMEDIATE")
        wait = time.monotonic() - waited
        try:
            db.executemany(
                "INSERT OR REPLACE INTO responses (key, value, checksum, size, engine, model, "
                "created, used) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                rows,
            )
            db.executemany("UPDATE responses SET used = ? WHERE key = ?", uses)
            _evict_past_cap(db)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        return wait

    # --- settings and upkeep ---------------------------------------------------------------

    def max_bytes(self) -> int:
        return DEFAULT_MAX_BYTES if self._db is None else _max_bytes(self._db)

    def set_max_bytes(self, value: int) -> None:
        assert self._db is not None
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO settings VALUES ('max_bytes', ?)", (str(value),)
            )

    def prune(self, *, older_than_s: float | None = None) -> int:
        """Drop entries unused for `older_than_s`, and any past the size cap; how many went."""
        assert self._db is not None
        self.flush()
        with self._lock:
            before = self._count()
            self._db.execute("BEGIN IMMEDIATE")
            if older_than_s is not None:
                self._db.execute(
                    "DELETE FROM responses WHERE used < ?", (time.time() - older_than_s,)
                )
            _evict_past_cap(self._db)
            self._db.execute("COMMIT")
            gone = before - self._count()
            self._db.execute("VACUUM")
        return gone

    def clear(self, *, model: str | None = None) -> int:
        """Drop every entry (or those of one model); how many went."""
        assert self._db is not None
        self.flush()
        with self._lock:
            if model is None:
                gone = self._db.execute("DELETE FROM responses").rowcount
            else:
                gone = self._db.execute("DELETE FROM responses WHERE model = ?", (model,)).rowcount
            self._db.execute("VACUUM")
        return gone

    def _count(self) -> int:
        assert self._db is not None
        return self._db.execute("SELECT count(*) FROM responses").fetchone()[0]

    def stats(self) -> StoreStats:
        if self._db is None:
            return StoreStats(0, 0, DEFAULT_MAX_BYTES, None, None, [])
        with self._lock:
            oldest, newest = self._db.execute(
                "SELECT min(used), max(used) FROM responses"
            ).fetchone()
            by_model = self._db.execute(
                "SELECT engine, model, count(*) FROM responses GROUP BY engine, model "
                "ORDER BY count(*) DESC"
            ).fetchall()
            return StoreStats(
                self._count(), _used_bytes(self._db), self.max_bytes(), oldest, newest,
                [tuple(row) for row in by_model],
            )  # fmt: skip

    def close(self) -> None:
        if self._db is None:
            return
        try:
            if not self.readonly:
                self.flush()
            with self._lock:
                self._end_read()
        finally:
            self._db.close()
            self._db = None


def _max_bytes(db: sqlite3.Connection) -> int:
    row = db.execute("SELECT value FROM settings WHERE name = 'max_bytes'").fetchone()
    return int(row[0]) if row else DEFAULT_MAX_BYTES


def _used_bytes(db: sqlite3.Connection) -> int:
    pages = db.execute("PRAGMA page_count").fetchone()[0]
    free = db.execute("PRAGMA freelist_count").fetchone()[0]
    size = db.execute("PRAGMA page_size").fetchone()[0]
    return (pages - free) * size


def _evict_past_cap(db: sqlite3.Connection) -> None:
    """Inside a write transaction: the least recently used entries go until the file's pages
    in use are under 90% of the cap (so that eviction is not paid again at the next write)."""
    cap, used = _max_bytes(db), _used_bytes(db)
    if used <= cap:
        return
    excess = used - int(cap * 0.9)
    freed = 0
    doomed = []
    for key, size in db.execute("SELECT key, size FROM responses ORDER BY used"):
        doomed.append((key,))
        freed += size + 64  # the row's own bookkeeping, roughly
        if freed >= excess:
            break
    db.executemany("DELETE FROM responses WHERE key = ?", doomed)


def _switch_to_wal(db: sqlite3.Connection) -> None:
    """Put the store in WAL mode (it stays so). The switch takes the file's exclusive lock, and
    SQLite answers "database is locked" at once, without its busy handler, while another
    process is opening or creating the same store: two jobs starting together on a new cache
    hit this. It is retried until BUSY_TIMEOUT_MS, as any other wait for a lock."""
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            db.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)
