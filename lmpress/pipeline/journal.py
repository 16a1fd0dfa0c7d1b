"""What each step has done, in SQLite (WAL) in the output directory, so a rerun of a killed or
edited pipeline costs only what is unfinished or changed.

Per step and input key: `done` (the input row's digest and the tokens spent), the rows it
`emitted` and its `rejects` (dropped, or failed), each row's record written in one transaction:
kill -9 loses only rows in flight, never half a row, and a row is never journaled twice (keys
are primary keys). A step commits a row before it hands the results on, so no later step ever
holds a row an earlier step has not journaled.

On a rerun a row whose key is done with the same input digest is re-emitted from here without
calling the model; a row that failed is tried again. Each step's fingerprint (its settings, its
model, the previous step's fingerprint) is kept: a changed one clears that step and every later
one, as `--from STEP` does by force. `reached` records which keys reached each step in this run,
so the outputs hold this run's rows only (a smaller `--limit`, an input that lost rows).
A barrier step (dedupe) decides again each run, in key order, from its journaled input.
"""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lmpress.vocabulary.types import Usage

SCHEMA = """
CREATE TABLE IF NOT EXISTS steps (name TEXT PRIMARY KEY, position INTEGER, fingerprint TEXT);
CREATE TABLE IF NOT EXISTS done (step TEXT, key TEXT, digest TEXT, prompt_tokens INTEGER,
    completion_tokens INTEGER, PRIMARY KEY (step, key));
CREATE TABLE IF NOT EXISTS emitted (step TEXT, key TEXT, in_key TEXT, row TEXT,
    PRIMARY KEY (step, key));
CREATE INDEX IF NOT EXISTS emitted_by_input ON emitted (step, in_key, key);
CREATE TABLE IF NOT EXISTS rejects (step TEXT, key TEXT, kind TEXT, reason TEXT, row TEXT,
    PRIMARY KEY (step, key));
CREATE TEMP TABLE reached (step TEXT, key TEXT, PRIMARY KEY (step, key));
"""


def digest(row: dict[str, Any]) -> str:
    return hashlib.sha256(dumps(row).encode()).hexdigest()[:24]


def dumps(row: dict[str, Any]) -> str:
    """A row as the journal keeps it; TypeError for a value JSON cannot hold."""
    return json.dumps(row, ensure_ascii=False, sort_keys=True)


class Journal:
    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(path, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")  # WAL: a crash loses no committed row
        self.db.executescript(SCHEMA)

    def start(self, fingerprints: list[tuple[str, str]], rerun_from: int | None,
              barriers: set[str]) -> list[str]:  # fmt: skip
        """Keep what each step did while its fingerprint holds; clear from the first step
        that changed (or `rerun_from`) on. Returns the names of the steps cleared."""
        kept = dict(self.db.execute("SELECT name, fingerprint FROM steps"))
        cleared: list[str] = []
        with self._transaction():
            for position, (name, fingerprint) in enumerate(fingerprints):
                changed = kept.get(name) != fingerprint
                if cleared or changed or (rerun_from is not None and position >= rerun_from):
                    if name in kept:
                        cleared.append(name)
                    self._clear(name)
                elif name in barriers:
                    self._clear(name)  # decided again each run, in key order
                self.db.execute(
                    "INSERT OR REPLACE INTO steps VALUES (?, ?, ?)", (name, position, fingerprint)
                )
            names = [name for name, _ in fingerprints]
            for gone in set(kept) - set(names):
                self._clear(gone)
                self.db.execute("DELETE FROM steps WHERE name = ?", (gone,))
            self.db.execute("DELETE FROM rejects WHERE step = ?", ("input",))
        return cleared

    def _clear(self, step: str) -> None:
        for table in ("done", "emitted", "rejects"):
            self.db.execute(f"DELETE FROM {table} WHERE step = ?", (step,))

    def replay(self, step: str, key: str, row_digest: str) -> list[tuple[str, dict]] | None:
        """The rows `step` emitted for input `key`, if it finished that row from the same
        input; None when it must run (new, failed, or its input changed)."""
        found = self.db.execute(
            "SELECT digest FROM done WHERE step = ? AND key = ?", (step, key)
        ).fetchone()
        if found is None or found[0] != row_digest:
            return None
        # Replays share a transaction (a commit each took a millisecond: 300 rows/s on a
        # rerun); the next row journaled, or `settle`, commits them. Lost in a kill, they are
        # only this run's record of what reached a step, rebuilt by the next run.
        if not self.db.in_transaction:
            self.db.execute("BEGIN")
        self.db.execute("INSERT OR IGNORE INTO reached VALUES (?, ?)", (step, key))
        rows = self.db.execute(
            "SELECT key, row FROM emitted WHERE step = ? AND in_key = ? ORDER BY key", (step, key)
        )
        return [(out_key, json.loads(text)) for out_key, text in rows]

    def finish(self, step: str, key: str, row_digest: str, rows: list[tuple[str, str]],
               reject: tuple[str, str, str] | None, usage: Usage | None) -> None:  # fmt: skip
        """Record one row's outcome at once: its emitted rows (key, JSON), or the reject
        (kind, reason, JSON row). A failed row is not done: a rerun tries it again."""
        with self._transaction():
            self.db.execute("DELETE FROM emitted WHERE step = ? AND in_key = ?", (step, key))
            self.db.execute("DELETE FROM rejects WHERE step = ? AND key = ?", (step, key))
            self.db.execute("DELETE FROM done WHERE step = ? AND key = ?", (step, key))
            self.db.executemany(
                "INSERT INTO emitted VALUES (?, ?, ?, ?)",
                [(step, out_key, key, text) for out_key, text in rows],
            )
            if reject is not None:
                self.db.execute("INSERT INTO rejects VALUES (?, ?, ?, ?, ?)", (step, key, *reject))
            if reject is None or reject[0] == "dropped":
                usage = usage or Usage()
                self.db.execute(
                    "INSERT INTO done VALUES (?, ?, ?, ?, ?)",
                    (step, key, row_digest, usage.prompt_tokens, usage.completion_tokens),
                )
            self.db.execute("INSERT OR IGNORE INTO reached VALUES (?, ?)", (step, key))

    def settle(self) -> None:
        """Commit what replays left open, before the outputs are read."""
        if self.db.in_transaction:
            self.db.execute("COMMIT")

    def _transaction(self) -> Any:
        journal = self

        class _Tx:
            def __enter__(self) -> None:
                journal.settle()  # replays' records first: a rollback here keeps them
                journal.db.execute("BEGIN")

            def __exit__(self, kind: object, *rest: object) -> None:
                journal.db.execute("ROLLBACK" if kind is not None else "COMMIT")

        return _Tx()

    # --- what this run's outputs read --------------------------------------------------------

    def rows(self, step: str) -> Iterator[dict[str, Any]]:
        """The rows `step` emitted in this run, in key order (= input order), streamed."""
        cursor = self.db.execute(
            "SELECT e.row FROM emitted e JOIN reached r ON r.step = e.step AND r.key = e.in_key "
            "WHERE e.step = ? ORDER BY e.key",
            (step,),
        )
        for (text,) in cursor:
            yield json.loads(text)

    def keyed_rows(self, step: str, page: int = 1000) -> Iterator[tuple[str, dict[str, Any]]]:
        """As `rows`, with each row's key, read a page at a time: no statement stays open
        while the reader journals rows of its own (a barrier step reading its input)."""
        after = ""
        while True:
            found = self.db.execute(
                "SELECT e.key, e.row FROM emitted e JOIN reached r ON r.step = e.step "
                "AND r.key = e.in_key WHERE e.step = ? AND e.key > ? ORDER BY e.key LIMIT ?",
                (step, after, page),
            ).fetchall()
            for key, text in found:
                yield key, json.loads(text)
            if len(found) < page:
                return
            after = found[-1][0]

    def rejects(self, steps: list[str]) -> Iterator[dict[str, Any]]:
        """This run's rejects, step by step in pipeline order, each in key order."""
        for step in steps:
            cursor = self.db.execute(
                "SELECT j.key, j.kind, j.reason, j.row FROM rejects j JOIN reached r "
                "ON r.step = j.step AND r.key = j.key WHERE j.step = ? ORDER BY j.key",
                (step,),
            )
            for key, kind, reason, text in cursor:
                yield {"key": key, "step": step, kind: reason, "row": json.loads(text)}

    def tally(self, step: str) -> dict[str, Any]:
        """This run's counts for one step: rows in and out, dropped by reason, failed, tokens."""

        def one(sql: str) -> Any:
            return self.db.execute(sql, (step,)).fetchone()

        join = "JOIN reached r ON r.step = t.step AND r.key = t.key WHERE t.step = ?"
        dropped = _reasons(
            self.db.execute(
                f"SELECT t.reason, COUNT(*) FROM rejects t {join} AND t.kind = 'dropped' "
                "GROUP BY t.reason",
                (step,),
            )
        )
        tokens = one(f"SELECT SUM(prompt_tokens), SUM(completion_tokens) FROM done t {join}")
        return {
            "rows_in": one("SELECT COUNT(*) FROM reached WHERE step = ?")[0],
            "rows_out": one(
                "SELECT COUNT(*) FROM emitted e JOIN reached r ON r.step = e.step "
                "AND r.key = e.in_key WHERE e.step = ?"
            )[0],
            "dropped": dropped,
            "failed": one(f"SELECT COUNT(*) FROM rejects t {join} AND t.kind = 'failed'")[0],
            "prompt_tokens": tokens[0] or 0,
            "completion_tokens": tokens[1] or 0,
        }

    def close(self) -> None:
        self.settle()
        self.db.close()


ROW_KEY = re.compile(r"\b\d{9}(?:/\d{4})*\b")
MOST_REASONS = 20  # the card lists this many reasons a step dropped rows for, then the rest


def _reasons(counts: Iterator[tuple[str, int]]) -> dict[str, int]:
    """Drops counted by reason, a row key in a reason read as "a kept row": a dedupe's
    reasons each name the row kept, and a dict (and a card line) per dropped row would grow
    with the input. The most common `MOST_REASONS`, then the rest as one."""
    merged: dict[str, int] = {}
    for reason, count in counts:
        reason = ROW_KEY.sub("a kept row", reason)
        merged[reason] = merged.get(reason, 0) + count
    ranked = sorted(merged.items(), key=lambda item: (-item[1], item[0]))
    kept = dict(ranked[:MOST_REASONS])
    rest = sum(count for _, count in ranked[MOST_REASONS:])
    if rest:
        kept["other reasons"] = rest
    return kept
