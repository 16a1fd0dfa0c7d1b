"""NATIVE's draft model (`model.draft_model`): a smaller model sharing the model's tokenizer
drafts each row's next tokens, which the model then verifies in its own step
(engines/local/speculation.py gives the rule; scheduling.py applies it).

`Drafter` keeps the draft model's own `BatchCache`, a row to a slot in the same order as the
model's: rows join and leave it together, and `leave` moves slots by the same rule on both.
Each row's draft cache holds a prefix of the row's tokens; the tokens after it (its `pending`,
ending with the row's last token, which neither cache holds yet) are fed at the row's next
draft. A step's drafting is one pass over the rows that draft, carrying their pending tokens,
then one pass a token for the drafts after the first: k drafts cost k passes of the draft
model. After the model's verify, a row keeps the draft columns of the drafts it kept; the
columns past them are written over later. Since the last draft is never fed, a row that kept
every draft has two pending tokens, that draft and the model's own token after it.

The drafts are the draft model's greedy tokens: a one-hot draft, for which the rule keeps a
sampled row's distribution unchanged (speculation.py).
"""

from __future__ import annotations

from typing import Any

from lmpress.engines.local.native.batch_cache import (
    BatchCache,
    PromptCache,
    dynamic_cache,
    layer_tensors,
)


class Drafter:
    """A draft model and its cache of the batch's rows (see the module docstring)."""

    def __init__(self, model: Any, device: str, cache_arg: str, n_vocab: int):
        self.model = model
        self.n_vocab = n_vocab  # the model's vocabulary: a draft beyond it is never drafted
        self.device = device
        self.cache_arg = cache_arg
        self.batch = BatchCache()
        self.pending: list[list[int]] = []  # each row's tokens its draft cache lacks

    def reset(self) -> None:
        self.batch, self.pending = BatchCache(), []

    def prefill(self, ids: list[int]) -> PromptCache:
        """A prompt's draft cache."""
        import torch

        out = self.model(
            input_ids=torch.tensor([ids], device=self.device),
            use_cache=True,
            logits_to_keep=1,
            **{self.cache_arg: dynamic_cache([])},
        )
        return PromptCache(list(ids), layer_tensors(getattr(out, self.cache_arg)))

    def join(self, prompts: list[tuple[PromptCache, list[int]]], needs: list[int]) -> None:
        """Rows after the last, each from its prompt's draft cache and its pending tokens (the
        row's first)."""
        self.batch.join([prompt for prompt, _ in prompts], needs)
        self.pending += [list(pending) for _, pending in prompts]

    def leave(self, indices: list[int]) -> None:
        order = self.batch.leave(indices)
        self.pending = [self.pending[i] for i in order]

    def propose(self, counts: list[int]) -> list[list[int]]:
        """Each row's drafts, `counts[b]` of them (0: the row drafts nothing this step)."""
        import torch

        rows = range(len(counts))
        drafting = [b for b in rows if counts[b]]
        drafts: list[list[int]] = [[] for _ in rows]
        if not drafting:
            return drafts
        # The first pass: every drafting row's pending tokens; the other rows carry fillers
        # whose columns they do not keep.
        width = max(len(self.pending[b]) for b in drafting)
        fed = [self.pending[b] if counts[b] else [] for b in rows]
        logits = self._forward([row + [0] * (width - len(row)) for row in fed])
        ends = torch.tensor([max(0, len(row) - 1) for row in fed], device=logits.device)
        tokens = logits[torch.arange(len(counts), device=logits.device), ends].argmax(-1).tolist()
        self.batch.keep([len(row) for row in fed])
        for b in drafting:
            self.pending[b] = []
            drafts[b].append(tokens[b])
        for _ in range(1, max(counts)):
            going = [b for b in drafting if len(drafts[b]) < counts[b]]
            logits = self._forward([[drafts[b][-1] if drafts[b] else 0] for b in rows])
            tokens = logits[:, -1].argmax(-1).tolist()
            keep = [0] * len(counts)
            for b in going:
                keep[b] = 1
                drafts[b].append(tokens[b])
            self.batch.keep(keep)
        return drafts

    def settle(self, drafts: list[list[int]], kept: list[int], emitted: list[list[int]]) -> None:
        """After the model's step: each row drafted `drafts`, kept the first `kept` of them and
        emitted `emitted` (its kept drafts and its own token after them)."""
        drop = [0] * len(drafts)
        for b, (d, k, e) in enumerate(zip(drafts, kept, emitted, strict=True)):
            if not d:
                self.pending[b] += e
                continue
            # The cache holds the row's drafts but its last; those past the kept ones go.
            fed = len(d) - 1
            drop[b] = fed - min(k, fed)
            self.pending[b] = e[-(k - min(k, fed) + 1) :]
        self.batch.drop(drop)

    def _forward(self, ids: list[list[int]]) -> Any:
        logits = self.batch.forward(self.model, ids, self.cache_arg, self.device)
        return logits[..., : self.n_vocab]
