"""What a provider-batch job keeps beside its output, so that a crash at any moment loses no
batch and submits no row twice: OUT.batches/, holding

- state.jsonl     an append-only log, each line written and fsynced before the next step:
                  a chunk sealed (its files complete), its file uploaded, its submission begun,
                  the batch id the provider gave it, and its results collected;
- chunk-NNNNN.rows.jsonl      the chunk's rows as read ({custom_id, line, raw, attempt}), so
                              results are matched to rows by custom_id, never by order;
- chunk-NNNNN.requests.jsonl  the provider's request lines, uploaded as they are (OpenAI) or
                              sent as the batch's requests (Anthropic).

A chunk is sealed before anything is sent, and its batch id recorded the moment the provider
answers. A run that finds a chunk uploaded or submitting but with no batch id looks for the
batch the provider made before submitting again (`apis`).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmpress.vocabulary.errors import InputError


@dataclass
class Chunk:
    name: str  # chunk-00001
    endpoint: str  # /v1/chat/completions, /v1/completions, /v1/embeddings or /v1/messages
    count: int
    sealed_at: float
    file_id: str | None = None
    submitting_at: float | None = None
    batch_id: str | None = None
    collected: bool = False

    @property
    def waiting(self) -> bool:
        """Submitted, its results not yet written."""
        return self.batch_id is not None and not self.collected


class BatchState:
    def __init__(self, directory: Path):
        self.dir = directory
        self.log = directory / "state.jsonl"
        self.chunks: dict[str, Chunk] = {}

    def load(self, tidy: bool = True) -> BatchState:
        """Replay the log; with `tidy` (the job, holding the output's lock), chunk files that
        were never sealed (a crash while writing them) are removed, their rows read again from
        the input. `--status` does not tidy: a live job may be writing those files."""
        lines = self.log.read_bytes().splitlines() if self.log.exists() else []
        for number, raw in enumerate(lines, start=1):
            if not raw.strip():
                continue
            try:
                self._apply(json.loads(raw))
            except (ValueError, KeyError) as exc:
                if number == len(lines):
                    break  # a torn last line: that step did not happen
                raise InputError(f"{self.log}:{number}: unreadable ({exc})") from exc
        if tidy and self.dir.exists():
            for path in self.dir.glob("chunk-*"):
                if path.name.split(".")[0] not in self.chunks:
                    path.unlink()
        return self

    def _apply(self, event: dict[str, Any]) -> None:
        name = event["chunk"]
        kind = event["event"]
        if kind == "sealed":
            self.chunks[name] = Chunk(name, event["endpoint"], event["count"], event["at"])
            return
        chunk = self.chunks[name]
        if kind == "uploaded":
            chunk.file_id = event["file_id"]
        elif kind == "submitting":
            chunk.submitting_at = event["at"]
        elif kind == "submitted":
            chunk.batch_id = event["batch_id"]
        elif kind == "collected":
            chunk.collected = True

    def record(self, chunk: Chunk, event: str, **fields: Any) -> None:
        """Append one step to the log, on disk before the caller goes on."""
        line = {"event": event, "chunk": chunk.name, **fields}
        self.dir.mkdir(parents=True, exist_ok=True)
        with self.log.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(line) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        self._apply(line)

    def new_name(self) -> str:
        taken = {int(name.split("-")[1]) for name in self.chunks}
        return f"chunk-{max(taken, default=0) + 1:05d}"

    def rows_path(self, name: str) -> Path:
        return self.dir / f"{name}.rows.jsonl"

    def requests_path(self, name: str) -> Path:
        return self.dir / f"{name}.requests.jsonl"

    def waiting(self) -> list[Chunk]:
        return [c for c in self.chunks.values() if not c.collected]

    def rows(self, chunk: Chunk) -> Iterator[dict[str, Any]]:
        with self.rows_path(chunk.name).open("rb") as handle:
            for raw in handle:
                yield json.loads(raw)


class ChunkWriter:
    """A chunk being filled: its rows and request lines written to temporary files, sealed
    (renamed and logged) when full or when the input ends."""

    def __init__(self, state: BatchState, endpoint: str, max_requests: int, max_bytes: int):
        self.state = state
        self.endpoint = endpoint
        self.max_requests, self.max_bytes = max_requests, max_bytes
        self.name = state.new_name()
        state.dir.mkdir(parents=True, exist_ok=True)
        self._rows = state.rows_path(self.name).with_suffix(".tmp")
        self._requests = state.requests_path(self.name).with_suffix(".tmp")
        self._rows_out = self._rows.open("w", encoding="utf-8")
        self._requests_out = self._requests.open("w", encoding="utf-8")
        self.count = 0
        self.bytes = 0
        # Reserve the name: a second writer (the other endpoint) must not take it.
        state.chunks.setdefault(self.name, Chunk(self.name, endpoint, 0, 0.0))

    def fits(self, request_line: str) -> bool:
        size = len(request_line.encode()) + 1
        return self.count < self.max_requests and self.bytes + size <= self.max_bytes

    def add(self, request_line: str, row: dict[str, Any]) -> None:
        self._requests_out.write(request_line + "\n")
        self._rows_out.write(json.dumps(row, ensure_ascii=False) + "\n")
        self.count += 1
        self.bytes += len(request_line.encode()) + 1

    def seal(self) -> Chunk | None:
        """The chunk's files complete and logged; None for an empty chunk."""
        for handle in (self._rows_out, self._requests_out):
            handle.flush()
            os.fsync(handle.fileno())
            handle.close()
        del self.state.chunks[self.name]
        if self.count == 0:
            self._rows.unlink()
            self._requests.unlink()
            return None
        os.replace(self._rows, self.state.rows_path(self.name))
        os.replace(self._requests, self.state.requests_path(self.name))
        chunk = Chunk(self.name, self.endpoint, self.count, time.time())
        self.state.chunks[self.name] = chunk
        self.state.record(chunk, "sealed", endpoint=self.endpoint, count=self.count,
                          at=chunk.sealed_at)  # fmt: skip
        return self.state.chunks[self.name]
