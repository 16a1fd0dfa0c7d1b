"""Sampling for LLAMACPP: one llama.cpp sampler chain per sequence, so every row keeps its own
settings, penalty history and random state (seeded per row), and each step's pick from a row's
logits, with min_tokens holding off the end and the log-probabilities a row asks for.
"""

from __future__ import annotations

import random
from typing import Any

from lmpress.engines.local.guided import Matcher
from lmpress.engines.local.llamacpp.loading import Vocab
from lmpress.vocabulary.types import GenerationParams, TokenLogprob


class Sampling:
    """Sampler chains and picks for the sequences of one llama.cpp context."""

    def __init__(self, ctx: Any, vocab: Vocab, penalty_window: int):
        import llama_cpp

        self._lc = llama_cpp
        self._ctx = ctx  # the llama_context pointer whose logits are read
        self.vocab = vocab
        self.penalty_window = penalty_window  # tokens the penalties look back over

    def chain(
        self,
        params: GenerationParams,
        index: int,
        prompt_ids: list[int],
        logit_bias: list[tuple[int, float]],
    ) -> Any:
        """A row's sampler chain: logit bias, penalties, then greedy, or top-k, top-p, min-p,
        temperature and a draw seeded per row (the same seed gives the same tokens whatever
        else is in flight). None for plain greedy (no bias, no penalties): `pick` takes the
        most likely token itself, because a chain copies the whole vocabulary's logits into a
        candidate array at every pick, which costs a greedy row far more than an argmax
        (benchmarks/README.md, figures behind choices)."""
        if params.sampling_temperature() == 0 and not logit_bias and not has_penalties(params):
            return None
        lc = self._lc
        chain = lc.llama_sampler_chain_init(lc.llama_sampler_chain_default_params())
        if logit_bias:
            array = (lc.llama_logit_bias * len(logit_bias))(*logit_bias)
            lc.llama_sampler_chain_add(
                chain, lc.llama_sampler_init_logit_bias(self.vocab.size, len(array), array)
            )
        window = self.penalty_window
        if params.repetition_penalty != 1:
            # Repetition counts the prompt too, as transformers does.
            repeat = lc.llama_sampler_init_penalties(
                self.vocab.size, window, params.repetition_penalty, 0.0, 0.0
            )
            for token in prompt_ids[-window:]:
                lc.llama_sampler_accept(repeat, token)
            lc.llama_sampler_chain_add(chain, repeat)
        if params.presence_penalty or params.frequency_penalty:
            # Presence and frequency count generated tokens only, as OpenAI's API does.
            lc.llama_sampler_chain_add(
                chain,
                lc.llama_sampler_init_penalties(
                    self.vocab.size, window, 1.0, params.frequency_penalty, params.presence_penalty
                ),
            )
        if params.sampling_temperature() == 0:
            lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_greedy())
            return chain
        if params.top_k:
            lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_top_k(params.top_k))
        if params.top_p < 1:
            lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_top_p(params.top_p, 1))
        if params.min_p > 0:
            lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_min_p(params.min_p, 1))
        lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_temp(params.sampling_temperature()))
        lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_dist(row_seed(params, index)))
        return chain

    def free(self, chain: Any) -> None:
        if chain is not None:
            self._lc.llama_sampler_free(chain)

    def pick(
        self,
        sampler: Any,
        params: GenerationParams,
        generated: int,
        index: int,
        logprobs: bool,
        matcher: Matcher | None = None,
        banned: list[int] = (),
    ) -> tuple[int, TokenLogprob | None]:
        """The next token of the row whose logits sit at `index` of the last batch, and its
        log-probability entry when the row asks for logprobs. A row under a grammar picks
        among the tokens the grammar allows next, and never one of `banned` (its bad words');
        its log-probabilities stay the model's."""
        if generated < params.min_tokens:
            self._forbid_end(params, index)
        distribution = self._logprobs(params, index) if logprobs else None
        if banned:
            self.logits(index)[list(banned)] = float("-inf")
        if matcher is not None:
            matcher.mask_logits(self.logits(index))
        if sampler is None:  # plain greedy: the first of the most likely, as llama.cpp picks
            token = int(self.logits(index).argmax())
        else:
            token = self._lc.llama_sampler_sample(sampler, self._ctx, index)
        if distribution is None:
            return token, None
        return token, self._entry(token, *distribution)

    def force(
        self, sampler: Any, params: GenerationParams, index: int, logprobs: bool, token: int
    ) -> tuple[int, TokenLogprob | None]:
        """`token`, which the engine writes itself (a reasoning row's close of its thinking),
        taken by the row's sampler chain as if sampled (its penalties count it), with its
        log-probability entry under the model when the row asks for logprobs."""
        entry = None
        if logprobs:
            entry = self._entry(token, *self._logprobs(params, index))
        if sampler is not None:
            self._lc.llama_sampler_accept(sampler, token)
        return token, entry

    def logits(self, index: int) -> Any:
        """The logits of batch row `index`, as a numpy array over llama.cpp's own buffer."""
        import numpy as np

        pointer = self._lc.llama_get_logits_ith(self._ctx, index)
        return np.ctypeslib.as_array(pointer, shape=(self.vocab.size,))

    def _forbid_end(self, params: GenerationParams, index: int) -> None:
        """min_tokens: end-of-generation tokens cannot be picked yet."""
        logits = self._lc.llama_get_logits_ith(self._ctx, index)
        for token in (*self.vocab.end_ids(), *params.stop_token_ids):
            logits[token] = float("-inf")

    def _logprobs(self, params: GenerationParams, index: int) -> tuple[Any, list[int]]:
        """Log-probabilities of every token under the model's distribution (before
        temperature, top-k/p and penalties), and the ids of the row's `top_logprobs` most
        likely ones."""
        values, best = log_softmax_top(self.logits(index)[None, :], params.top_logprobs)
        return values[0], best[0]

    def prompt_entries(
        self, params: GenerationParams, index: int, targets: list[int]
    ) -> list[TokenLogprob]:
        """The logprob entries of prompt tokens `targets`, each scored by the logits of one
        batch row from `index` on (the row of the token before it), with the request's
        `prompt_logprobs` likeliest tokens at each position."""
        import numpy as np

        logits = np.stack([self.logits(index + j) for j in range(len(targets))])
        values, best = log_softmax_top(logits, params.prompt_logprobs or 0)
        return [
            self._entry(token, row, ids)
            for token, row, ids in zip(targets, values, best, strict=True)
        ]

    def _entry(self, token: int, values: Any, top_ids: list[int]) -> TokenLogprob:
        string = self.vocab.string
        return TokenLogprob(
            string(token),
            float(values[token]),
            [(string(t), float(values[t])) for t in top_ids],
            id=token,
            top_ids=top_ids,
        )


def log_softmax_top(logits: Any, k: int) -> tuple[Any, list[list[int]]]:
    """Each row's log-softmax, in float64 (llama.cpp's logits are float32: a sum over a
    vocabulary of 49k in float32 loses the last digits a log-likelihood adds up), and the ids of
    its `k` largest, most likely first (the lowest id first among equals, as argmax picks)."""
    import numpy as np

    values = logits.astype(np.float64)
    top = values.max(axis=1, keepdims=True)
    values -= top + np.log(np.exp(values - top).sum(axis=1, keepdims=True))
    if not k:
        return values, [[] for _ in range(len(values))]
    k = min(k, values.shape[1])
    ids = np.argpartition(-values, k - 1, axis=1)[:, :k]
    best = []
    for row, candidates in zip(values, ids, strict=True):
        candidates = np.sort(candidates)  # by id, so that the stable sort keeps low ids first
        order = np.argsort(-row[candidates], kind="stable")
        best.append([int(t) for t in candidates[order]])
    return values, best


def has_penalties(params: GenerationParams) -> bool:
    return (
        params.repetition_penalty != 1
        or bool(params.presence_penalty)
        or bool(params.frequency_penalty)
    )


def row_seed(params: GenerationParams, index: int) -> int:
    seed = params.seed if params.seed is not None else random.SystemRandom().randrange(2**32)
    # llama.cpp reads 0xFFFFFFFF as "pick a random seed".
    return (seed + index) % 0xFFFFFFFF
