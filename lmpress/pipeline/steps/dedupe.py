"""A dedupe step: a barrier. It takes all its input, then the deduplicator
(`pipeline/dedupe.py`) decides each row in key order, so which copy is kept never depends on
which arrived first; then the kept rows go on."""

from __future__ import annotations

from typing import Any

from lmpress.pipeline.steps.base import Outcome, Step


class Dedupe(Step):
    barrier = True

    def __init__(self, name: str, deduplicator: Any):
        super().__init__(name, concurrency=1)
        self.deduplicator = deduplicator

    async def run(self, key: str, row: dict[str, Any]) -> Outcome:
        reason = await self.deduplicator.duplicate_of(key, row)
        if reason is None:
            return Outcome(rows=[row])
        return Outcome(dropped=reason)


def embedder(answers: Any, step: str) -> Any:
    """The async function a deduplicator embeds texts with: the step's model's vectors
    (`answers`: the model behind the cache, made on first use)."""
    import numpy as np

    from lmpress.vocabulary.embeddings import EmbedRequest
    from lmpress.vocabulary.errors import LmpressError

    async def embed(texts: list[str]) -> Any:
        result = await answers().embed(EmbedRequest(f"{step}-embed", list(texts)))
        if result.error is not None:
            raise LmpressError(f"step '{step}': embedding failed: {result.error.message}")
        return np.asarray([e.vector for e in result.embeddings], dtype=np.float32)

    return embed
