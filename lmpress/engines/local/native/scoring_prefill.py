"""NATIVE's prefill of the prompts that are only scored, all those of one admit round together.

A scored prompt that generates nothing (`max_new_tokens` 0, `prompt_logprobs` set: a choice of
a multiple-choice question, a perplexity window) needs its logits from its first scored
position on (prompt_logprobs.py) and no row in the batch. Prefilled one at a time, each cost a
forward pass of its own, about 37 ms on SmolLM2-135M for a few tokens, which made NATIVE a
quarter of lm-eval's `hf` backend's speed on multiple choice (benchmarks/README.md).

So the prompts of one round are prefilled in few passes, each over many of them:
- prompts that feed the same ids from the same scored position (choices of one token after
  one context, which differ only in the token nothing follows) are read once;
- a context that several of the rest share (the tokens before the first scored position) is
  fed once, in a pass of such contexts without logits, from the longest prefix the prefix
  store holds of it, and kept for the prompts' spans;
- then every prompt's row in packed passes: its span over its shared context's cache, or its
  ids after the longest stored prefix, the logits kept at its scored positions only.
Passes are steps of a `BatchCache` (batch_cache.py), whose rows may carry different numbers of
tokens (a ragged step, one sequence with no padding in the matmuls), under the positions and
mask it builds for each row. They are cut so that rows x widest stays within `PASS_TOKENS` and
the logits kept within prompt_logprobs.py's chunk; a span longer than a chunk is left to the
one-prompt prefill, which cuts it in chunks.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from lmpress.engines.local.native.batch_cache import (
    BatchCache,
    PrefixStore,
    PromptCache,
    dynamic_cache,
    layer_tensors,
)
from lmpress.engines.local.native.prompt_logprobs import PrefillPlan, PromptScores
from lmpress.engines.local.worker import Submission

# The places (rows x widest row) one pass may carry: attention's scores and masks grow with
# it, and beyond a few thousand a pass is compute-bound anyway.
PASS_TOKENS = 2048


@dataclass
class ScoredPrompt:
    """One prompt to prefill: its ids and plan, and the scores its span's logits fill."""

    ids: list[int]
    plan: PrefillPlan
    scores: PromptScores

    @property
    def context(self) -> tuple[int, ...]:
        return tuple(self.ids[: self.plan.start])

    @property
    def span(self) -> list[int]:
        return self.ids[self.plan.start : self.plan.fed]


@dataclass
class Row:
    """A prompt's row in a span pass: the cache it starts from, the ids it feeds after it, and
    how many of those come before its first scored position (their logits are not kept)."""

    prompt: ScoredPrompt
    cache: PromptCache
    feed: list[int]
    skip: int


def scored_prompt(submission: Submission, plan: PrefillPlan, chunk: int) -> ScoredPrompt | None:
    """The request as a `ScoringPrefill` prompt where it is one: scored, generating nothing,
    without images, its span's logits within one chunk; else None."""
    params, ids = submission.request.params, submission.prompt_ids
    if params.max_new_tokens or submission.media is not None or not plan.scores:
        return None
    if not 0 < plan.fed - plan.start <= chunk:
        return None
    return ScoredPrompt(ids, plan, PromptScores(ids, plan))


def takes_more(submission: Submission, tokens: int) -> bool:
    """Whether a round that has taken `batch_size` requests generating nothing takes one more
    that is only scored: while the prompts taken hold at most a pass's tokens (`tokens`, this
    one's with them). Such requests take no row in the batch, and prefilled together they cost
    a few passes a round, not one each, so a count of rows is not what bounds them."""
    scored = submission.request.params.prompt_logprobs is not None
    return scored and submission.media is None and tokens <= PASS_TOKENS


class ScoringPrefill:
    """The prefill of a round's scored prompts in few passes (see the module docstring), on
    the model's own forward."""

    def __init__(self, model: Any, cache_arg: str, device: str, chunk: int):
        self.model, self.cache_arg, self.device, self.chunk = model, cache_arg, device, chunk
        self._empty: list[tuple[Any, Any]] | None = None  # `no_tokens`'s, once computed

    def no_tokens(self) -> list[tuple[Any, Any]]:
        """The KV layers of no tokens, for a prompt with no context: a one-token prefill's,
        cut to none, so that their heads, width and dtype are the model's own."""
        if self._empty is None:
            import torch

            cache = dynamic_cache([])
            tokens = torch.tensor([[0]], device=self.device)
            self.model(input_ids=tokens, use_cache=True, **{self.cache_arg: cache})
            self._empty = [(k[:, :, :0], v[:, :, :0]) for k, v in layer_tensors(cache)]
        return self._empty

    def prefill(self, prompts: list[ScoredPrompt], store: PrefixStore | None) -> None:
        """Fill each prompt's scores. Prompts that feed the same ids from the same first scored
        position (choices of one token after one context) are read once."""
        reads: dict[tuple[tuple[int, ...], int], list[ScoredPrompt]] = {}
        for prompt in prompts:
            key = (tuple(prompt.ids[: prompt.plan.fed]), prompt.plan.start)
            reads.setdefault(key, []).append(prompt)
        firsts = [same[0] for same in reads.values()]
        spans = Counter(prompt.context for prompt in firsts)
        shared = self._contexts([c for c, n in spans.items() if n > 1], store)
        rows = sorted((self._row(p, shared, store) for p in firsts), key=lambda r: len(r.feed))
        kept = [len(row.feed) - row.skip for row in rows]
        for group in passes([len(row.feed) for row in rows], kept, self.chunk):
            batch = BatchCache()
            batch.join([rows[i].cache for i in group], [rows[i].prompt.plan.fed for i in group])
            logits = self.feed(batch, [rows[i].feed for i in group], [rows[i].skip for i in group])
            for i, row_logits in zip(group, logits, strict=True):
                first = rows[i].prompt
                for prompt in reads[tuple(first.ids[: first.plan.fed]), first.plan.start]:
                    prompt.scores.add(row_logits, prompt.plan.start)

    def _row(
        self,
        prompt: ScoredPrompt,
        shared: dict[tuple[int, ...], PromptCache],
        store: PrefixStore | None,
    ) -> Row:
        """A prompt's row in the span passes: its span over its context's cache where other
        prompts share that context, else its ids after the longest stored prefix."""
        if prompt.context in shared:
            return Row(prompt, shared[prompt.context], prompt.span, 0)
        start = self.start(prompt.ids[: prompt.plan.fed], prompt.plan.start, store)
        n = len(start.ids)
        return Row(prompt, start, prompt.ids[n : prompt.plan.fed], prompt.plan.start - n)

    def start(self, ids: list[int], limit: int, store: PrefixStore | None) -> PromptCache:
        """The longest stored prefix of `ids`, at most `limit` tokens, or no tokens."""
        stored, shared = store.longest(ids, limit) if store else (None, 0)
        if stored is None:
            return PromptCache([], self.no_tokens())
        layers = [(k[:, :, :shared], v[:, :, :shared]) for k, v in stored.layers]
        return PromptCache(ids[:shared], layers)

    def _contexts(
        self, contexts: list[tuple[int, ...]], store: PrefixStore | None
    ) -> dict[tuple[int, ...], PromptCache]:
        """Each context's cache: from the prefix store's longest prefix of it, the rest fed in
        passes of many contexts; each context fed is added to the store."""
        caches: dict[tuple[int, ...], PromptCache] = {}
        starts = [self.start(list(c), len(c), store) for c in contexts]
        fed = [i for i, c in enumerate(contexts) if len(starts[i].ids) < len(c)]
        for i in set(range(len(contexts))) - set(fed):  # held whole by the store
            caches[contexts[i]] = starts[i]
        fed.sort(key=lambda i: len(contexts[i]) - len(starts[i].ids))
        rests = [contexts[i][len(starts[i].ids) :] for i in fed]
        for group in passes([len(r) for r in rests], None, None):
            batch = BatchCache()
            batch.join([starts[fed[j]] for j in group], [len(contexts[fed[j]]) for j in group])
            self.feed(batch, [list(rests[j]) for j in group], None)
            for slot, j in enumerate(group):
                context = contexts[fed[j]]
                n = len(context)
                layers = [
                    (k[slot : slot + 1, :, :n].clone(), v[slot : slot + 1, :, :n].clone())
                    for k, v in batch.layers
                ]
                caches[context] = PromptCache(list(context), layers)
                if store is not None:
                    store.add(caches[context])
        return caches

    def feed(
        self,
        batch: BatchCache,
        rows: list[list[int]],
        skips: list[int] | None,
        apart: bool = False,
    ) -> list[Any]:
        """Feed each row its tokens after its cache; each row's logits, [tokens, vocabulary],
        of its tokens past its first `skips` (None: no row's, and the pass returns none).
        `apart`: attention takes each row on its own (packed_prefill.py)."""
        import torch

        widths = [len(row) for row in rows]
        positions, cache, mask = batch.step_inputs(widths, apart)
        ragged = mask.lmpress_step.ragged
        keep: Any = 1  # the pass's last token's only, which no one reads
        if ragged is None:
            tokens = torch.tensor(rows, device=self.device)
            if skips is not None:
                keep = widths[0] - min(skips)  # the last positions, for every row alike
        else:
            tokens = torch.tensor([[t for row in rows for t in row]], device=self.device)
            if skips is not None:  # the kept positions in the one sequence of every row's
                ends = torch.tensor(widths).cumsum(0).tolist()
                kept = [
                    p
                    for s, w, e in zip(skips, widths, ends, strict=True)
                    for p in range(e - w + s, e)
                ]
                keep = torch.tensor(kept, device=self.device)
        out = self.model(
            input_ids=tokens,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=keep,
            **{self.cache_arg: cache},
        )
        batch.keep(widths)
        if skips is None:
            return []
        if ragged is None:
            low = min(skips)
            return [out.logits[b, s - low :] for b, s in enumerate(skips)]
        counts = [w - s for w, s in zip(widths, skips, strict=True)]
        return list(out.logits[0].split(counts))


def passes(widths: list[int], kept: list[int] | None, chunk: int | None) -> Iterator[list[int]]:
    """Rows of these widths (sorted, narrowest first) cut into passes, in order: each within
    PASS_TOKENS places (rows x widest) and, where their logits are kept (`kept` of each row's
    positions), within `chunk` logits; a row too wide for either goes alone."""
    group: list[int] = []
    total = 0
    for i, width in enumerate(widths):
        more = kept[i] if kept is not None else 0
        over = chunk is not None and total + more > chunk
        if group and ((len(group) + 1) * width > PASS_TOKENS or over):
            yield group
            group, total = [], 0
        group.append(i)
        total += more
    if group:
        yield group
