"""Near-duplicates by embedding: the cosine similarity of the step model's vectors. The kept
rows' unit vectors are held in float32 blocks; a batch of rows is compared with all of them by
one matrix product a block, then with the rows kept earlier in the same batch."""

from __future__ import annotations

from collections.abc import AsyncIterator

import numpy as np

from lmpress.pipeline.dedupe.base import Embed, RowDeduplicator
from lmpress.pipeline.dedupe.settings import DedupeSettings

# Kept vectors are held in blocks of this many rows: appending never copies the whole matrix,
# and one block's products with a batch stay small (64 x 4096 floats).
CHUNK_ROWS = 4096


class EmbeddingDeduplicator(RowDeduplicator):
    """A row is a near-duplicate of the kept row its vector is closest to, when their cosine
    similarity is at or above the threshold."""

    def __init__(self, settings: DedupeSettings, embed: Embed) -> None:
        super().__init__(settings)
        self._embed = embed
        self._blocks: list[np.ndarray] = []  # each CHUNK_ROWS x dim; the last one filling
        self._kept_keys: list[str] = []

    async def duplicate_of(self, key: str, row: dict) -> str | None:
        return (await self._decide_batch([(key, row)]))[0]

    async def decide_all(
        self, items: AsyncIterator[tuple[str, dict]]
    ) -> AsyncIterator[tuple[str, str | None]]:
        """As the base's, with `batch_size` rows' texts embedded in one call."""
        batch: list[tuple[str, dict]] = []
        async for item in items:
            batch.append(item)
            if len(batch) == self.settings.batch_size:
                for (key, _), reason in zip(batch, await self._decide_batch(batch), strict=True):
                    yield key, reason
                batch = []
        for (key, _), reason in zip(batch, await self._decide_batch(batch), strict=True):
            yield key, reason

    async def _decide_batch(self, batch: list[tuple[str, dict]]) -> list[str | None]:
        if not batch:
            return []
        vectors = await self._unit_vectors([self.text(row) for _, row in batch])
        # Against the rows kept before this batch, all at once; then within the batch, in order.
        best_value, best_index = self._closest_kept(vectors)
        reasons: list[str | None] = []
        threshold = self.settings.threshold
        assert threshold is not None
        for i, (key, _) in enumerate(batch):
            value, index = float(best_value[i]), int(best_index[i])
            if value >= threshold:
                reasons.append(
                    f"near-duplicate of {self._kept_keys[index]} (cosine {value:.3f} >= {threshold:g})"
                )
                continue
            reasons.append(None)
            kept_at = self._keep(key, vectors[i])
            # Later rows of this batch also compare with the one just kept.
            later = vectors[i + 1 :] @ vectors[i]
            closer = later > best_value[i + 1 :]
            best_value[i + 1 :][closer] = later[closer]
            best_index[i + 1 :][closer] = kept_at
        return reasons

    async def _unit_vectors(self, texts: list[str]) -> np.ndarray:
        vectors = np.asarray(await self._embed(texts), dtype=np.float32)
        if vectors.ndim != 2 or len(vectors) != len(texts):
            raise ValueError(
                f"the embedding model gave an array of shape {vectors.shape} for {len(texts)} texts"
            )
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        # An all-zero vector stays zero: cosine 0 with every row, so it is kept.
        return vectors / np.where(norms == 0, 1, norms)

    def _closest_kept(self, vectors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each vector's highest cosine with a kept row (-inf when none) and that row's index."""
        best_value = np.full(len(vectors), -np.inf, dtype=np.float32)
        best_index = np.zeros(len(vectors), dtype=np.int64)
        for number, block in enumerate(self._blocks):
            filled = min(CHUNK_ROWS, len(self._kept_keys) - number * CHUNK_ROWS)
            similarity = vectors @ block[:filled].T
            index = similarity.argmax(axis=1)
            value = similarity[np.arange(len(vectors)), index]
            closer = value > best_value
            best_value[closer] = value[closer]
            best_index[closer] = index[closer] + number * CHUNK_ROWS
        return best_value, best_index

    def _keep(self, key: str, vector: np.ndarray) -> int:
        at = len(self._kept_keys)
        if at % CHUNK_ROWS == 0:
            self._blocks.append(np.zeros((CHUNK_ROWS, len(vector)), dtype=np.float32))
        self._blocks[-1][at % CHUNK_ROWS] = vector
        self._kept_keys.append(key)
        return at
