"""What `lmpress serve --state-dir DIR` keeps across restarts: the files clients upload and the
batches they run, as OpenAI's own objects (`openai.types.FileObject`, `openai.types.Batch`).

    DIR/files/ID.json         a file's FileObject, and where its bytes are (relative to DIR)
    DIR/files/ID.jsonl        an uploaded file's bytes
    DIR/batches/ID.json       a batch's Batch object, as last reported
    DIR/batches/ID/out.jsonl  the batch runner's output; beside it, as for any `lmpress batch`
                              output, its errors, summary, fingerprint and lock

Every record is replaced whole (`write_text_atomically`), so a server killed at any moment
leaves each one as it was before a change or after it, never half written. A batch's output is
the runner's, with the runner's guarantees: a restarted server resumes it from what it holds.
"""

from __future__ import annotations

import json
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from openai.types import Batch, FileObject

from lmpress.data.targets import write_text_atomically


def new_object_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


@dataclass
class StoredFile:
    """A file the server holds: its FileObject and where its bytes are."""

    file: FileObject
    path: Path


class StateStore:
    """Files and batches under one directory."""

    def __init__(self, root: str | Path):
        self.root = Path(root).expanduser().resolve()
        self.files_dir = self.root / "files"
        self.batches_dir = self.root / "batches"
        for folder in (self.files_dir, self.batches_dir):
            folder.mkdir(parents=True, exist_ok=True)

    # --- files -----------------------------------------------------------------------------

    def add_file(self, data: BinaryIO, filename: str, purpose: str) -> FileObject:
        """Keep an upload, copied from `data` a chunk at a time: its bytes first, then the
        record that makes it visible."""
        file_id = new_object_id("file")
        path = self.files_dir / f"{file_id}.jsonl"
        with path.open("wb") as out:
            shutil.copyfileobj(data, out, 1 << 20)
        return self.register_file(path, filename, purpose, file_id)

    def register_file(
        self, path: Path, filename: str, purpose: str, file_id: str | None = None
    ) -> FileObject:
        """A file already under the state directory (a batch's output) made a FileObject."""
        file = FileObject(
            id=file_id or new_object_id("file"),
            object="file",
            bytes=path.stat().st_size,
            created_at=int(time.time()),
            filename=filename,
            purpose=purpose,  # type: ignore[arg-type]  # what the client said, as OpenAI keeps it
            status="processed",
        )
        record = {"file": file.model_dump(), "path": str(path.relative_to(self.root))}
        write_text_atomically(self.files_dir / f"{file.id}.json", json.dumps(record) + "\n")
        return file

    def file(self, file_id: str) -> StoredFile | None:
        record = _read_json(self.files_dir / f"{_safe(file_id)}.json")
        if record is None:
            return None
        return StoredFile(FileObject.model_validate(record["file"]), self.root / record["path"])

    def files(self) -> list[FileObject]:
        """Every file, newest first."""
        found = [self.file(p.stem) for p in self.files_dir.glob("*.json")]
        return sorted((f.file for f in found if f), key=lambda f: f.created_at, reverse=True)

    def delete_file(self, file_id: str) -> bool:
        stored = self.file(file_id)
        if stored is None:
            return False
        (self.files_dir / f"{stored.file.id}.json").unlink(missing_ok=True)  # gone first
        if stored.path.parent == self.files_dir:  # an upload; a batch's output stays its own
            stored.path.unlink(missing_ok=True)
        return True

    # --- batches ---------------------------------------------------------------------------

    def save_batch(self, batch: Batch) -> None:
        write_text_atomically(self.batches_dir / f"{batch.id}.json", batch.model_dump_json())

    def batch(self, batch_id: str) -> Batch | None:
        record = _read_json(self.batches_dir / f"{_safe(batch_id)}.json")
        return None if record is None else Batch.model_validate(record)

    def batches(self) -> list[Batch]:
        """Every batch, newest first."""
        found = [self.batch(p.stem) for p in self.batches_dir.glob("*.json")]
        return sorted((b for b in found if b), key=lambda b: (b.created_at, b.id), reverse=True)

    def batch_output(self, batch_id: str) -> Path:
        """Where the runner writes a batch's output (its errors file beside it)."""
        folder = self.batches_dir / _safe(batch_id)
        folder.mkdir(exist_ok=True)
        return folder / "out.jsonl"


def _safe(object_id: str) -> str:
    """An id as a file name: one that could name another path names nothing."""
    return object_id if object_id.replace("-", "").replace("_", "").isalnum() else "-"


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
