"""A dedupe step: a barrier. It waits for all its input, then the deduplicator
(`pipeline/dedupe/`) decides each row in key order (read back from the journal), so which copy
is kept never depends on which arrived first; then the kept rows go on."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from typing import Any

from lmpress.pipeline.steps.base import Outcome, Step


class Dedupe(Step):
    barrier = True

    def __init__(self, name: str, deduplicator: Any):
        super().__init__(name, concurrency=1)
        self.deduplicator = deduplicator

    async def run(self, key: str, row: dict[str, Any]) -> Outcome:
        return _outcome(row, await self.deduplicator.duplicate_of(key, row))

    async def run_all(
        self, items: Iterable[tuple[str, dict[str, Any]]]
    ) -> AsyncIterator[tuple[str, dict[str, Any], Outcome]]:
        """Through the deduplicator's `decide_all` where it has one (the embedding method
        embeds a batch of rows a call there), else a row at a time. Only the rows fed and
        not yet decided (a batch at most) are held."""
        decide_all = getattr(self.deduplicator, "decide_all", None)
        if decide_all is None:
            async for decided in super().run_all(items):
                yield decided
            return
        pending: dict[str, dict[str, Any]] = {}

        async def rows() -> AsyncIterator[tuple[str, dict[str, Any]]]:
            for key, row in items:
                pending[key] = row
                yield key, row

        async for key, reason in decide_all(rows()):
            row = pending.pop(key)
            yield key, row, _outcome(row, reason)


def _outcome(row: dict[str, Any], reason: str | None) -> Outcome:
    return Outcome(rows=[row]) if reason is None else Outcome(dropped=reason)


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
