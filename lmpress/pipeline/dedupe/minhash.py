"""Near-duplicates by MinHash: the Jaccard similarity of two texts' shingle sets, estimated from
signatures of `num_perm` hashes (seeded, so every run agrees), with datasketch's LSH index
proposing the kept rows worth comparing, so a row costs about the same at any count."""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

import numpy as np

from lmpress.pipeline.dedupe.base import RowDeduplicator
from lmpress.pipeline.dedupe.settings import DedupeSettings

if TYPE_CHECKING:
    from datasketch import MinHash


def _band_digest(band: bytes) -> bytes:
    """What the LSH index stores for a band: 8 bytes rather than the band's r x 8 (a band
    collision that the digest adds is checked away by the Jaccard estimate after)."""
    return hashlib.blake2b(band, digest_size=8).digest()


class MinHashDeduplicator(RowDeduplicator):
    """A row is a near-duplicate of the kept row whose estimated Jaccard similarity is highest,
    when that is at or above the threshold. LSH proposes the candidates; each is then estimated
    from the kept signatures, so the reason gives the figure."""

    def __init__(self, settings: DedupeSettings) -> None:
        from datasketch import MinHash, MinHashLSH

        super().__init__(settings)
        assert settings.threshold is not None
        self._lsh = MinHashLSH(
            threshold=settings.threshold, num_perm=settings.num_perm, hashfunc=_band_digest
        )
        # Copied for each row: a new MinHash draws the seed's permutations again, half its cost.
        self._empty = MinHash(num_perm=settings.num_perm, seed=settings.seed)
        # datasketch's hash values fit 32 bits; kept as uint32 they take half the memory.
        self._signatures: dict[str, np.ndarray] = {}

    def shingles(self, text: str) -> set[str]:
        size = self.settings.shingle_size or 1
        units: list[str] | str = text.split() if self.settings.shingle == "words" else text
        joiner = " " if self.settings.shingle == "words" else ""
        if len(units) <= size:  # a text shorter than a shingle is one shingle, not none
            return {joiner.join(units)}
        return {joiner.join(units[i : i + size]) for i in range(len(units) - size + 1)}

    def signature(self, row: dict) -> MinHash:
        minhash = self._empty.copy()
        minhash.update_batch([s.encode() for s in sorted(self.shingles(self.text(row)))])
        return minhash

    async def duplicate_of(self, key: str, row: dict) -> str | None:
        minhash = self.signature(row)
        values = minhash.hashvalues.astype(np.uint32)
        # The most similar candidate, the earliest kept among equals, so a rerun names the same.
        best: tuple[float, str] | None = None
        for candidate in sorted(self._lsh.query(minhash)):
            similarity = float(np.count_nonzero(self._signatures[candidate] == values))
            similarity /= len(values)
            if best is None or similarity > best[0]:
                best = (similarity, candidate)
        threshold = self.settings.threshold
        assert threshold is not None
        if best is not None and best[0] >= threshold:
            return f"near-duplicate of {best[1]} (minhash jaccard ~{best[0]:.2f} >= {threshold:g})"
        self._lsh.insert(key, minhash, check_duplication=False)
        self._signatures[key] = values
        return None
