"""NATIVE's prefill of the prompts that join the batch in one round, many in one pass.

Prefilled one at a time, a short prompt costs a forward pass of its own, and a pass over a few
tokens costs about what a decoding step of 16 rows does: reading the weights is the work, not
the tokens. On SmolLM2-135M (one core), 16 chat prompts of 39 tokens, each fed after the
system prompt they share, took 1.96 s one at a time and 0.64 s in one pass.

So the prompts of an admit round that generate, without images, an adapter or prompt logprobs
(`packable`), are fed in passes of many (scoring_prefill.passes bounds them), each row from the
longest prefix the prefix store holds of its prompt. A prompt that shares a prefix with another
of the round longer than any stored one waits for it, to a later pass: a system prompt the
round's prompts share is fed once, as one at a time it would be. Each pass is a ragged step of a
`BatchCache` whose attention takes each row apart (row_attention.rows_apart), through the
model's own attention with the mask it gets alone; the rest of the model computes each token's
row on its own. So a prompt's cache and logits are bit for bit the ones its prefill alone gives.
Models with a sliding window, or attention other than sdpa, prefill one prompt at a time.
"""

from __future__ import annotations

from typing import Any

from lmpress.engines.local.native.batch_cache import (
    MIN_SHARED_PREFIX,
    BatchCache,
    PrefixStore,
    PromptCache,
    shared_prefix,
)
from lmpress.engines.local.native.prompt_logprobs import PrefillPlan
from lmpress.engines.local.native.row_attention import PREFIX
from lmpress.engines.local.native.scoring_prefill import ScoringPrefill, passes
from lmpress.engines.local.worker import Submission


def packs(model: Any) -> bool:
    """Whether the model's prompts can be prefilled packed: sdpa attention over every earlier
    token (rows_apart gives each row the mask of full causal attention)."""
    text = model.config.get_text_config()
    own = (text._attn_implementation or "eager").removeprefix(PREFIX)
    if types := getattr(text, "layer_types", None):
        full = all(t == "full_attention" for t in types)
    else:
        full = not getattr(text, "sliding_window", None)
    return own == "sdpa" and full


def packable(submission: Submission, plan: PrefillPlan) -> bool:
    """A prompt fed whole for its last logits only: it generates, with no images, adapter or
    prompt logprobs."""
    request = submission.request
    plain = submission.media is None and request.adapter is None and not plan.scores
    return plain and request.params.max_new_tokens > 0 and plan.fed == len(submission.prompt_ids)


class PackedPrefill:
    """The prefill of a round's generating prompts in few passes (see the module docstring)."""

    def __init__(self, scoring: ScoringPrefill):
        self.scoring = scoring  # its forward pass, and the KV layers of no tokens

    def prefill(self, prompts: list[list[int]], store: PrefixStore | None) -> list[tuple[Any, Any]]:
        """Each prompt's cache and its last token's logits, [1, vocabulary], in order; the
        store keeps the caches of the last prompts made, as many as it holds (copies, so that a
        pass's tensors go once its rows have joined the batch)."""
        made: dict[int, tuple[PromptCache, Any]] = {}
        left = list(range(len(prompts)))
        while left:
            now, left, awaited = self._wave(prompts, left, store)
            starts = [self._start(prompts[i], store) for i in now]
            rests = [len(prompts[i]) - len(start.ids) for i, start in zip(now, starts, strict=True)]
            order = sorted(range(len(now)), key=rests.__getitem__)
            for group in passes([rests[j] for j in order], None, None):
                chosen = [order[g] for g in group]
                caches = self._pass([prompts[now[j]] for j in chosen], [starts[j] for j in chosen])
                for j, made_j in zip(chosen, caches, strict=True):
                    made[now[j]] = made_j
            if store is not None:  # the prompts others wait for last, so that they stay
                for i in sorted(now, key=lambda i: i in awaited)[-(store.stored.maxlen or 0) :]:
                    store.add(own_copy(made[i][0]))
        return [made[i] for i in range(len(prompts))]

    @staticmethod
    def _wave(
        prompts: list[list[int]], left: list[int], store: PrefixStore | None
    ) -> tuple[list[int], list[int], set[int]]:
        """The prompts to feed now, those that wait for one of them, and the ones waited for: a
        prompt waits where it shares a prefix with one fed now longer than any stored by what
        makes a prefix worth reusing (MIN_SHARED_PREFIX)."""
        now: list[int] = []
        later: list[int] = []
        awaited: set[int] = set()
        for i in left:
            ids = prompts[i]
            stored = store.longest(ids)[1] if store is not None else 0
            shares = [(shared_prefix(prompts[j], ids, len(ids) - 1), j) for j in now]
            ahead, j = max(shares, default=(0, -1))
            if store is not None and ahead - stored >= MIN_SHARED_PREFIX:
                later.append(i)
                awaited.add(j)
            else:
                now.append(i)
        return now, later, awaited

    def _start(self, ids: list[int], store: PrefixStore | None) -> PromptCache:
        """The longest stored prefix of the prompt, all but its last token at most."""
        return self.scoring.start(ids, len(ids) - 1, store)

    def _pass(self, prompts: list[list[int]], starts: list[PromptCache]) -> list[tuple[Any, Any]]:
        """One pass: each prompt fed after its start; its whole cache and last logits."""
        batch = BatchCache()
        batch.join(starts, [len(ids) for ids in prompts])
        rows = [ids[len(start.ids) :] for ids, start in zip(prompts, starts, strict=True)]
        logits = self.scoring.feed(batch, rows, [len(row) - 1 for row in rows], apart=True)
        made = []
        for slot, ids in enumerate(prompts):
            n = len(ids)
            layers = [
                (k[slot : slot + 1, :, :n], v[slot : slot + 1, :, :n]) for k, v in batch.layers
            ]
            made.append((PromptCache(list(ids), layers), logits[slot]))
        return made


def own_copy(prompt: PromptCache) -> PromptCache:
    """The prompt's cache in tensors of its own: a pass's caches are views of the pass's, freed
    once the rows have joined the batch unless a view outlives them (the prefix store's)."""
    return PromptCache(prompt.ids, [(k.clone(), v.clone()) for k, v in prompt.layers])
