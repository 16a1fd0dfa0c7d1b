"""Which of a prompt's positions NATIVE's prefill computes logits for, and the prompt's own
tokens' logprobs read from them (`GenerationParams.prompt_logprobs`).

A prompt's prefill needs the logits after its last token only, to pick the first new token.
A prompt scored from `Request.score_from` needs them from the position before that token on:
the logits at position p give the logprob of token p + 1. With nothing to generate
(`max_new_tokens` 0) the last token's logits are never read, so the last token is not fed at
all: a prompt may then be one token longer than the model's context, as lm-eval's rolling
windows are (the context's worth of predicted tokens after one token of context).

The logits of a long scored span would take the vocabulary's width in float32 at every
position (SmolLM2: 196 kB a token, 400 MB for 2,048), so the span is prefilled in chunks that
keep at most `LOGITS_BUDGET` values, and each chunk's logits are reduced at once to what the
result holds: each token's logprob and the k likeliest at its position.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from lmpress.vocabulary.types import GenerationParams, TokenLogprob

# The logits one prefill chunk may keep: 2**25 float32 values, 128 MB (682 positions of
# SmolLM2's 49,152 tokens); a chunk keeps at least MIN_CHUNK positions whatever the vocabulary.
LOGITS_BUDGET = 2**25
MIN_CHUNK = 16


@dataclass(frozen=True)
class PrefillPlan:
    """What a prompt's prefill feeds and keeps: its first `fed` ids, and the logits of the
    positions from `start` to `fed` - 1 (start = fed - 1 for the last only). `top` is the
    prompt logprobs' k; None: the prompt is not scored."""

    fed: int
    start: int
    top: int | None = None

    @property
    def scores(self) -> bool:
        return self.top is not None

    def chunks(self, shared: int, size: int) -> Iterator[tuple[int, int, int]]:
        """The prefill's forward passes after `shared` cached tokens (at most `start`): each
        (first, end, keep), feeding ids[first:end] and keeping the last `keep` logits, at most
        `size` of them a pass (`chunk_size`). The first pass runs from the cached prefix to
        the first chunk's end."""
        first = shared
        cut = self.start
        while first < self.fed:
            cut = min(self.fed, cut + size)
            yield first, cut, cut - max(first, self.start)
            first = cut


def chunk_size(n_vocab: int) -> int:
    """The positions a prefill pass keeps the logits of, within LOGITS_BUDGET."""
    return max(MIN_CHUNK, LOGITS_BUDGET // n_vocab)


def prefill_plan(n_ids: int, params: GenerationParams, score_from: int) -> PrefillPlan:
    """The plan for a prompt of `n_ids` tokens: fed whole when a reply follows (its last
    logits pick the first token), else all but its last token; fed not at all when nothing
    is generated or scored."""
    generating = params.max_new_tokens > 0
    fed = n_ids if generating else n_ids - 1
    scoring = params.prompt_logprobs is not None
    if not scoring:
        return PrefillPlan(fed if generating else 0, max(fed - 1, 0))
    start = min(max(score_from, 1) - 1, fed - 1) if fed else 0
    return PrefillPlan(fed, start, params.prompt_logprobs)


@dataclass
class PromptScores:
    """The logprobs of a scored prompt's tokens, gathered chunk by chunk as plain numbers."""

    ids: list[int]
    plan: PrefillPlan
    logprobs: list[float] = field(default_factory=list)
    top_values: list[list[float]] = field(default_factory=list)
    top_ids: list[list[int]] = field(default_factory=list)

    def add(self, logits: Any, first: int) -> None:
        """Read the kept logits of positions `first`.. (those past the prompt's last scored
        token, the reply's, are not read), in float32."""
        import torch

        end = min(first + logits.shape[0], len(self.ids) - 1)
        if end <= first:
            return
        logprobs = logits[: end - first].float().log_softmax(dim=-1)
        targets = torch.tensor(self.ids[first + 1 : end + 1], device=logprobs.device)
        self.logprobs += logprobs.gather(1, targets[:, None])[:, 0].tolist()
        if self.plan.top:
            values, ids = logprobs.topk(self.plan.top, dim=-1)
            self.top_values += values.tolist()
            self.top_ids += ids.tolist()

    def result(self, piece: Callable[[int], str]) -> list[TokenLogprob | None]:
        """One entry a prompt token: None before the first scored one, else its logprob and
        the k likeliest at its position, their texts by `piece`."""
        skipped = self.plan.start + 1
        out: list[TokenLogprob | None] = [None] * skipped
        for i, logprob in enumerate(self.logprobs):
            token = self.ids[skipped + i]
            top_ids = self.top_ids[i] if self.plan.top else []
            top_values = self.top_values[i] if self.plan.top else []
            top = [(piece(t), v) for t, v in zip(top_ids, top_values, strict=True)]
            out.append(TokenLogprob(piece(token), logprob, top, token, top_ids))
        return out
