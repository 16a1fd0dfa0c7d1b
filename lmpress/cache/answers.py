"""An engine's answers through the response cache, for a front that asks one request at a time
(`lmpress serve --cache`): a kept reply comes back at once, streamed as one piece; anything else
goes to the engine and its reply is kept. Without a cache, the engine's answers as they are."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from lmpress.cache.responses import ResponseCache
from lmpress.engines.base import Engine
from lmpress.vocabulary.embeddings import EmbedRequest, EmbedResult, ScoreRequest, ScoreResult
from lmpress.vocabulary.types import Delta, Request, Result


class CachedAnswers:
    def __init__(self, engine: Engine, cache: ResponseCache | None):
        self.engine = engine
        self.cache = cache

    async def complete(self, request: Request) -> Result:
        return await self._answer(request, self.engine.complete)

    async def embed(self, request: EmbedRequest) -> EmbedResult:
        return await self._answer(request, self.engine.embed)

    async def score(self, request: ScoreRequest) -> ScoreResult:
        return await self._answer(request, self.engine.score)

    async def _answer(self, request: Any, generate: Any) -> Any:
        key, hit = self._lookup(request)
        if hit is not None:
            return hit
        result = await generate(request)
        self._keep(key, result)
        return result

    async def stream(self, request: Request) -> AsyncIterator[Delta | Result]:
        key, hit = self._lookup(request)
        if isinstance(hit, Result):
            for index, sample in enumerate(hit.samples):
                if sample.reasoning:
                    yield Delta(request.id, sample.reasoning, index, reasoning=True)
                if sample.text:
                    yield Delta(request.id, sample.text, index)
            yield hit
            return
        async for item in self.engine.stream(request):
            if isinstance(item, Result):
                self._keep(key, item)
            yield item

    def _lookup(self, request: Any) -> tuple[bytes | None, Any]:
        return self.cache.lookup(request) if self.cache is not None else (None, None)

    def _keep(self, key: bytes | None, result: Any) -> None:
        if self.cache is not None and key is not None:
            self.cache.keep(key, result)

    def close(self) -> None:
        if self.cache is not None:
            self.cache.close()
