"""What a model is, for the response cache: for weights on disk, the hash of their content, so
that a model replaced under the same name (a new snapshot, a re-quantized file) never answers
from the old one's replies; for a remote model, its name at its endpoint.

Hashing a model's files takes a second per gigabyte or so, once: each file's digest is kept in a
small table of its own under lmpress's cache directory (`model-digests.sqlite3`), keyed by the
file's path, size and modification time, and reused until one of them changes.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
from pathlib import Path

from lmpress.builtin_models.tiny import cache_root

DIGESTS_NAME = "model-digests.sqlite3"
CHUNK = 4 * 1024 * 1024
# Files beside the weights that say nothing about them: download bookkeeping, locks, readmes.
IGNORED_NAMES = {".gitattributes", "README.md", "LICENSE", "LICENSE.txt"}
IGNORED_DIRS = {".cache", ".git", "__pycache__"}


class FileDigests:
    """The sha256 of files, remembered by (path, size, mtime) across processes."""

    def __init__(self, directory: Path | None = None):
        path = (directory or cache_root()) / DIGESTS_NAME
        self._db: sqlite3.Connection | None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(path, timeout=30, isolation_level=None)
            self._db.execute("PRAGMA journal_mode = WAL")
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS digests (path TEXT PRIMARY KEY, size INTEGER, "
                "mtime_ns INTEGER, digest TEXT)"
            )
        except (OSError, sqlite3.Error):
            self._db = None  # hashed afresh each time: slower, never wrong

    def of_file(self, path: Path) -> str:
        path = path.resolve()
        stat = path.stat()
        if self._db is not None:
            try:
                row = self._db.execute(
                    "SELECT digest FROM digests WHERE path = ? AND size = ? AND mtime_ns = ?",
                    (str(path), stat.st_size, stat.st_mtime_ns),
                ).fetchone()
                if row:
                    return row[0]
            except sqlite3.Error:
                pass
        digest = _hash_file(path)
        if self._db is not None:
            try:
                self._db.execute(
                    "INSERT OR REPLACE INTO digests VALUES (?, ?, ?, ?)",
                    (str(path), stat.st_size, stat.st_mtime_ns, digest),
                )
            except sqlite3.Error:
                pass
        return digest

    def of_path(self, path: Path) -> str:
        """A file's digest, or a directory's: of its files' relative names and digests."""
        if path.is_file():
            return self.of_file(path)
        whole = hashlib.sha256()
        for name, file in _files_under(path):
            whole.update(f"{name}\0{self.of_file(file)}\n".encode())
        return whole.hexdigest()

    def close(self) -> None:
        if self._db is not None:
            self._db.close()


def _hash_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def _files_under(directory: Path) -> list[tuple[str, Path]]:
    found = []
    for root, dirs, files in os.walk(directory, followlinks=True):
        dirs[:] = sorted(d for d in dirs if d not in IGNORED_DIRS)
        for name in sorted(files):
            if name in IGNORED_NAMES or name.endswith(".lock"):
                continue
            file = Path(root) / name
            found.append((file.relative_to(directory).as_posix(), file))
    return found


def local_path(name: str, revision: str | None = None, hub: bool = True) -> Path | None:
    """The files behind a model name where they are on this machine: a path, one of lmpress's
    built-in names, or (`hub`: for an engine that takes hub ids) a Hugging Face id already in
    the hub's cache; None otherwise (a remote model's name)."""
    if not name:
        return None
    from lmpress.engines.common.models import local_or_hub
    from lmpress.vocabulary.errors import LmpressError

    try:
        resolved = local_or_hub(name, "model.model_name")
    except LmpressError:
        return None
    path = Path(resolved)
    if path.exists():
        return path
    if not hub or resolved.count("/") != 1:
        return None
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(resolved, revision=revision, local_files_only=True))
    except Exception:  # not installed, not cached, or not a hub id at all
        return None


def content_identity(
    name: str | None, digests: FileDigests, revision: str | None = None, hub: bool = True
) -> str:
    """`name` as the cache knows it: the digest of its files where they are here, else as
    given."""
    if not name:
        return ""
    path = local_path(name, revision, hub)
    if path is None:
        return name
    return f"sha256:{digests.of_path(path)}"
