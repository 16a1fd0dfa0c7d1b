"""Log-likelihoods and perplexity on any engine that returns prompt logprobs.

Each continuation is one request in the engine's own batch: its context and its tokens as
`prompt_ids`, nothing generated (`max_new_tokens` 0), the prompt's logprobs asked from the
continuation's first token on (`score_from`), with the likeliest token at each position for
the greedy flag. The continuations of one context are submitted together, so an engine that
reuses prefixes computes the context once; a long text's windows likewise go in together.

Text (a batch row, `LLM.loglikelihood`) is split into ids by the engine's own tokenizer
(`score_choices`, `score_text`): a failure to, like a continuation of no tokens, comes back as
the result's `error`, as any one request's failure does.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Protocol

from lmpress.vocabulary.errors import ErrorKind, LmpressError
from lmpress.vocabulary.likelihood import (
    ChoicesRequest,
    LoglikelihoodRequest,
    LoglikelihoodResult,
    Perplexity,
    PerplexityRequest,
    PerplexityResult,
    Tokenizer,
    continuation_score,
    encode_pair,
    prefix_id,
    rolling_windows,
)
from lmpress.vocabulary.types import ErrorInfo, GenerationParams, Request, Result, Usage


class Engine(Protocol):
    """What scoring uses of an engine (engines/base.py's Engine, which calls this module)."""

    name: str
    model_name: str

    async def complete_together(self, requests: list[Request]) -> list[Result]: ...

    async def loglikelihood(self, request: LoglikelihoodRequest) -> LoglikelihoodResult: ...

    def tokenizer(self) -> Tokenizer: ...


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
    results = await engine.complete_together([
        scoring_request(f"{request.id}-{i}", request.context, continuation)
        for i, continuation in enumerate(request.continuations)
    ])  # fmt: skip
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


async def score_choices(engine: Engine, request: ChoicesRequest) -> LoglikelihoodResult:
    """Each text continuation's score after the text context, split into ids as lm-eval's
    backends split them (`encode_pair`)."""
    try:
        ids = choice_ids(engine.tokenizer(), request)
    except (LmpressError, ValueError) as exc:
        out = LoglikelihoodResult(request.id, model=engine.model_name, engine=engine.name)
        out.error = ErrorInfo(ErrorKind.INVALID_REQUEST, str(exc))
        return out
    return await engine.loglikelihood(ids)


def choice_ids(tokenizer: Tokenizer, request: ChoicesRequest) -> LoglikelihoodRequest:
    """The request's context and continuations as the model's token ids; ValueError for a
    continuation that gives no tokens. A context of only spaces gives its spaces to the
    continuations, and is scored after the prefix token as an empty one is."""
    prefix = prefix_id(tokenizer)
    context: list[int] = [prefix]
    continuations = []
    for i, text in enumerate(request.continuations):
        own, tail = encode_pair(tokenizer.encode, request.context, text, prefix)
        if not tail:
            raise ValueError(f"choice {i} ({text!r}) gives no tokens; give it some text")
        context = own or [prefix]
        continuations.append(tail)
    return LoglikelihoodRequest(request.id, context, continuations)


async def score_text(engine: Engine, request: PerplexityRequest) -> PerplexityResult:
    """A text's total logprob and token count, in windows of the model's context."""
    started = time.perf_counter()
    out = PerplexityResult(request.id, model=engine.model_name, engine=engine.name)
    try:
        tokenizer = engine.tokenizer()
        tokens = tokenizer.encode(request.text)
        prefix = prefix_id(tokenizer)
        if not tokens:
            raise ValueError("the text gives no tokens; give it some text")
        if not tokenizer.context_length:
            raise ValueError(f"engine {engine.name} does not say the model's context length")
    except (LmpressError, ValueError) as exc:
        out.error = ErrorInfo(ErrorKind.INVALID_REQUEST, str(exc))
        return out
    # lm-eval's windows: a window's prompt is the model's context and one token more, the
    # last scored and never fed, which an engine takes from a request that generates nothing.
    max_length = tokenizer.context_length
    score, whole = await perplexity(engine, request.id, tokens, prefix, max_length)
    out.usage, out.error = whole.usage, whole.error
    if score is not None:
        out.logprob, out.tokens = score.logprob, score.tokens
    out.latency_s = time.perf_counter() - started
    return out


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
