"""Exact repeats: a row whose compared columns (names and normalised values) hash to the digest
of a kept row's is dropped. Only the 128-bit digests and the kept keys are remembered."""

from __future__ import annotations

import hashlib

from lmpress.pipeline.dedupe.base import RowDeduplicator
from lmpress.pipeline.dedupe.settings import DedupeSettings


class ExactDeduplicator(RowDeduplicator):
    def __init__(self, settings: DedupeSettings) -> None:
        from lmpress.pipeline.dedupe.digest_index import DigestIndex

        super().__init__(settings)
        self._seen = DigestIndex()

    def digest(self, row: dict) -> bytes:
        """BLAKE2b-128 of each name, type and value, each after its length: ("ab", "c") and
        ("a", "bc") differ, as do a value moved to another column and 7 and "7"."""
        digest = hashlib.blake2b(digest_size=16)
        for name, value in self.values(row):
            kind = "str" if isinstance(value, str) else "json"
            for part in (name, kind, self.as_text(value)):
                encoded = part.encode()
                digest.update(len(encoded).to_bytes(8, "little"))
                digest.update(encoded)
        return digest.digest()

    async def duplicate_of(self, key: str, row: dict) -> str | None:
        digest = self.digest(row)
        kept = self._seen.get(digest)
        if kept is None:
            self._seen.add(digest, key)
            return None
        return f"duplicate of {kept} (exact match)"
