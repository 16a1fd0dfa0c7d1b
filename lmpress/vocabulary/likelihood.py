"""Scoring text instead of generating it: log-likelihoods of continuations, and of whole texts
for perplexity.

A model scores a token by the log probability it gives that token after the ones before it.
A continuation's log-likelihood given a context is the sum over its tokens; it is greedy
(lm-eval's `is_greedy`) when each of its tokens is the model's likeliest at its position. A
multiple-choice question scores each choice as a continuation of one context and picks the
likeliest. A text longer than the model's context is scored in windows (`rolling_windows`),
each predicting tokens no earlier window predicted, so every token is scored exactly once.

Engines score token ids (`Request.prompt_ids` with `GenerationParams.prompt_logprobs`);
`encode_pair` turns a context and continuation given as text into ids the way lm-eval's own
backends do, so that lmpress and lm-eval score the same tokens.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from lmpress.vocabulary.types import ErrorInfo, TokenLogprob, Usage


class Tokenizer(Protocol):
    """An engine's tokenizer, as scoring and `/tokenize` use it (`Engine.tokenizer`)."""

    bos_id: int | None  # the beginning-of-sequence token, where the model has one
    eos_id: int | None  # the end-of-sequence token
    context_length: int | None  # the most tokens the model reads at once

    def encode(self, text: str, special: bool = False) -> list[int]:
        """The text's token ids; `special` adds the tokens the model's tokenizer puts around
        a text (a BOS), as a prompt gets them."""
        ...

    def decode(self, ids: list[int]) -> str:
        """The text of these token ids, special tokens included."""
        ...

    def pieces(self, ids: list[int]) -> list[str]:
        """Each token's own text, as OpenAI's legacy completions list `tokens`: joined, they
        give `decode(ids)` wherever each token is whole characters."""
        ...


@dataclass
class LoglikelihoodRequest:
    """Continuations to score after one context, all token ids. Choices that share the context
    share its computation where the engine reuses prefixes."""

    id: str
    context: list[int]  # at least one token: a continuation's first token is scored after it
    continuations: list[list[int]]  # each at least one token


@dataclass
class ContinuationScore:
    logprob: float  # the continuation's tokens' log probabilities, summed
    is_greedy: bool  # every token was the likeliest at its position
    tokens: int  # how many tokens the continuation has
    token_logprobs: list[float] = field(default_factory=list)


@dataclass
class LoglikelihoodResult:
    request_id: str
    scores: list[ContinuationScore] = field(default_factory=list)  # one per continuation
    usage: Usage = field(default_factory=Usage)  # prompt_tokens: the tokens read, all choices
    model: str = ""
    engine: str = ""
    latency_s: float = 0.0
    error: ErrorInfo | None = None
    cached: bool = False  # answered from the response cache (lmpress/cache/), not computed
    cost_usd: float | None = None  # what the tokens cost, where the config knows a price

    @property
    def best(self) -> int | None:
        """The index of the likeliest continuation (the argmax choice); None without scores."""
        if not self.scores:
            return None
        return max(range(len(self.scores)), key=lambda i: self.scores[i].logprob)


@dataclass
class ChoicesRequest:
    """Continuations to score after a context, as text (a `--task loglikelihood` row, or
    `LLM.loglikelihood`): split into ids by the engine's own tokenizer (`encode_pair`) when
    scored, so a row names what it asks without knowing the model's tokens."""

    id: str
    context: str  # may be empty: the continuations are then scored after the prefix token
    continuations: list[str]  # each must give at least one token


@dataclass
class PerplexityRequest:
    """A whole text to score, every token once (`rolling_windows` over the model's context)."""

    id: str
    text: str


@dataclass
class PerplexityResult:
    request_id: str
    logprob: float = 0.0  # every token's logprob, summed
    tokens: int = 0
    usage: Usage = field(default_factory=Usage)  # prompt_tokens: read, all windows together
    model: str = ""
    engine: str = ""
    latency_s: float = 0.0
    error: ErrorInfo | None = None
    cached: bool = False
    cost_usd: float | None = None

    @property
    def perplexity(self) -> float:
        return Perplexity(self.logprob, self.tokens).perplexity


def prefix_id(tokenizer: Tokenizer) -> int:
    """The token an empty context, and a text's first window, are scored after: the model's
    BOS, else its EOS, as lm-eval's backends use."""
    token = tokenizer.bos_id if tokenizer.bos_id is not None else tokenizer.eos_id
    if token is None:
        raise ValueError("the model's tokenizer has neither a BOS nor an EOS token")
    return token


def continuation_score(logprobs: list[TokenLogprob | None]) -> ContinuationScore:
    """The score of a continuation from its tokens' logprobs (each with `top` of at least one,
    for the greedy flag)."""
    scored = [lp for lp in logprobs if lp is not None]
    if len(scored) != len(logprobs):
        raise ValueError("a continuation token has no logprob")
    values = [lp.logprob for lp in scored]
    return ContinuationScore(
        logprob=math.fsum(values),
        is_greedy=all(lp.is_top for lp in scored),
        tokens=len(scored),
        token_logprobs=values,
    )


@dataclass
class Perplexity:
    """A whole text's score: the sum of every token's logprob, each token scored once."""

    logprob: float
    tokens: int

    @property
    def perplexity(self) -> float:
        """exp of the mean negative logprob a token; inf for a text of no tokens."""
        return math.exp(-self.logprob / self.tokens) if self.tokens else math.inf


def rolling_windows(
    tokens: list[int], prefix_id: int, max_length: int
) -> Iterator[tuple[list[int], list[int]]]:
    """A long text's scoring windows, as lm-eval's `loglikelihood_rolling` makes them (context
    length 1, disjoint): (context, continuation) pairs, together predicting every token once.

    The first window predicts the first `max_length` tokens after `prefix_id` (the model's BOS,
    else its EOS). Each later one predicts the next tokens, up to `max_length` of them, after as
    many earlier tokens as fill the model's `max_length` with one to spare for the context.
    """
    if max_length < 1:
        raise ValueError("max_length must be at least 1")
    first = min(max_length, len(tokens))
    if first:
        yield [prefix_id], tokens[:first]
    done = first
    while done < len(tokens):
        end = min(len(tokens), done + max_length)
        start = max(0, end - max_length - 1)
        yield tokens[start:done], tokens[done:end]
        done = end


def encode_pair(
    encode: Callable[[str], list[int]], context: str, continuation: str, prefix_id: int
) -> tuple[list[int], list[int]]:
    """A context and continuation as token ids, split as lm-eval's backends split them: the
    context's trailing spaces move to the continuation, the two are encoded together (a word
    and its leading space make one token) and the context's own tokens are cut off the front.
    An empty context is the prefix token alone (the model's BOS, else EOS)."""
    if not context:
        return [prefix_id], encode(continuation)
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    whole = encode(context + continuation)
    own = encode(context)
    return own, whole[len(own) :]


def choice_pairs(
    context: str | Sequence[tuple[str, str]], continuations: str | Sequence[str] | None
) -> list[tuple[str, str]]:
    """`LLM.loglikelihood`'s arguments (a context and its continuations, or pairs) as
    (context, continuation) pairs."""
    if isinstance(context, str):
        if continuations is None:
            raise ValueError("give the continuations to score after the context")
        texts = [continuations] if isinstance(continuations, str) else list(continuations)
        return [(context, text) for text in texts]
    if continuations is not None:
        raise ValueError("give (context, continuation) pairs, or a context and continuations")
    return [(before, after) for before, after in context]
