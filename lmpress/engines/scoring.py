"""Log-likelihoods and perplexity on any engine that returns prompt logprobs.

Each continuation is one request in the engine's own batch: its context and its tokens as
`prompt_ids`, nothing generated (`max_new_tokens` 0), the prompt's logprobs asked from the
continuation's first token on (`score_from`), with the likeliest token at each position for
the greedy flag. The continuations of one context are submitted together, so an engine that
reuses prefixes computes the context once; a long text's windows likewise go in together.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Protocol

from lmpress.vocabulary.errors import ErrorKind
from lmpress.vocabulary.likelihood import (
    LoglikelihoodRequest,
    LoglikelihoodResult,
    Perplexity,
    continuation_score,
    rolling_windows,
)
from lmpress.vocabulary.types import ErrorInfo, GenerationParams, Request, Result, Usage


class Engine(Protocol):
    """What scoring uses of an engine (engines/base.py's Engine, which calls this module)."""

    name: str
    model_name: str

    async def complete(self, request: Request) -> Result: ...

    async def loglikelihood(self, request: LoglikelihoodRequest) -> LoglikelihoodResult: ...


def scoring_request(id: str, context: list[int], continuation: list[int]) -> Request:
    """The request that scores `continuation` after `context` and generates nothing."""
    params = GenerationParams(max_new_tokens=0, prompt_logprobs=1)
    return Request(id, [], params, prompt_ids=context + continuation, score_from=len(context))


async def loglikelihood(engine: Engine, request: LoglikelihoodRequest) -> LoglikelihoodResult:
    """Each continuation's score after the context (the default of `Engine.loglikelihood`)."""
    started = time.perf_counter()
    out = LoglikelihoodResult(request.id, model=engine.model_name, engine=engine.name)
    problem = _shape_error(request)
    if problem is not None:
        out.error = ErrorInfo(ErrorKind.INVALID_REQUEST, problem)
        return out
    results = await asyncio.gather(
        *(
            engine.complete(scoring_request(f"{request.id}-{i}", request.context, continuation))
            for i, continuation in enumerate(request.continuations)
        )
    )
    out.latency_s = time.perf_counter() - started
    failed = next((r for r in results if r.error is not None), None)
    if failed is not None:
        out.error = failed.error
        return out
    start = len(request.context)
    try:
        out.scores = [continuation_score(_logprobs(r)[start:]) for r in results]
    except ValueError as exc:
        out.error = ErrorInfo(ErrorKind.GENERATION_ERROR, f"engine {engine.name}: {exc}")
        return out
    out.usage = Usage.summed(r.usage for r in results)
    return out


async def perplexity(
    engine: Engine, id: str, tokens: list[int], prefix_id: int, max_length: int
) -> tuple[Perplexity | None, LoglikelihoodResult]:
    """A whole text's logprob, scored in lm-eval's rolling windows of `max_length` tokens
    (the model's context) after `prefix_id`; with the windows' result, whose `error` says why
    the perplexity is None."""
    windows = list(rolling_windows(tokens, prefix_id, max_length))
    results = await asyncio.gather(
        *(
            engine.loglikelihood(LoglikelihoodRequest(f"{id}-w{i}", context, [continuation]))
            for i, (context, continuation) in enumerate(windows)
        )
    )
    whole = LoglikelihoodResult(id, model=engine.model_name, engine=engine.name)
    whole.usage = Usage.summed(r.usage for r in results)
    whole.latency_s = max((r.latency_s for r in results), default=0.0)
    failed = next((r for r in results if r.error is not None), None)
    if failed is not None:
        whole.error = failed.error
        return None, whole
    whole.scores = [s for r in results for s in r.scores]
    total = math.fsum(s.logprob for s in whole.scores)
    return Perplexity(total, sum(s.tokens for s in whole.scores)), whole


def _shape_error(request: LoglikelihoodRequest) -> str | None:
    if not request.context:
        return "the context has no tokens; give at least one (the model's BOS or EOS)"
    if not request.continuations:
        return "no continuation to score"
    if any(not c for c in request.continuations):
        return "a continuation has no tokens"
    return None


def _logprobs(result: Result) -> list:
    if result.prompt_logprobs is None:
        raise ValueError("returned no prompt logprobs")
    return result.prompt_logprobs
