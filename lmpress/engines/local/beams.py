"""Beam search for the local engines that run their own (NATIVE, LLAMACPP; VLLM runs
vLLM's): a request with `num_beams` k > 1 holds k rows of the batch, and each step keeps the k
likeliest continuations of its beams rather than sampling each row.

It is transformers' beam search (`GenerationMixin._beam_search`), step for step, so that a
request's beams equal `generate(num_beams=k)`'s on the same model: the 2k (more with several
end tokens) likeliest continuations over all beams; those ending (an end token, or the reply's
last token) go to the finished hypotheses with their score over `length ** length_penalty`,
the best k others run on; `early_stopping` (True, False or "never") decides when the finished
ones can no longer be beaten. `n` returns the best n hypotheses. The arithmetic is float32, as
transformers'.

Beam rows share the batch's steps with every other row: the engine hands a group its rows'
log-probabilities, and gives each row the cache of the beam it continues (NATIVE moves KV
slots, LLAMACPP sequences). Nothing is sampled, so a group has no seed or temperature; it
writes its replies when the search ends, not as it goes (a beam's text may be dropped at any
step).
"""

from __future__ import annotations

from typing import Any

from lmpress.vocabulary.types import GenerationParams

# transformers' stand-in for minus infinity in its beam bookkeeping; the same value keeps ties
# and orderings the same (a Python float keeps the float32 arrays it is added to float32).
NEG = -1.0e9

# The settings a beam search cannot honour here: each changes how a row picks its next token,
# and a beam picks by the k best sums of log-probabilities alone.
NOT_WITH_BEAMS = (
    ("temperature", lambda p: p.sampling_temperature() > 0, "beam search here is greedy"),
    ("stop_strings", lambda p: bool(p.stop_strings), "stop_token_ids end a beam instead"),
    ("logprobs", lambda p: p.logprobs, "a beam's tokens change until the search ends"),
    ("guided_decoding", lambda p: p.guided_decoding is not None, "a beam follows no grammar"),
    ("min_tokens", lambda p: p.min_tokens > 0, "no logits processor runs in a beam search"),
    ("repetition_penalty", lambda p: p.repetition_penalty != 1, "no penalty runs in a beam"),
    ("presence_penalty", lambda p: bool(p.presence_penalty), "no penalty runs in a beam"),
    ("frequency_penalty", lambda p: bool(p.frequency_penalty), "no penalty runs in a beam"),
    ("logit_bias", lambda p: bool(p.logit_bias), "no logits processor runs in a beam search"),
    ("bad_words", lambda p: bool(p.bad_words), "no logits processor runs in a beam search"),
    ("max_reasoning_tokens", lambda p: p.max_reasoning_tokens is not None,
     "a beam's thinking is not budgeted"),
)  # fmt: skip


def beams_refusal(params: GenerationParams) -> str | None:
    """Why these settings cannot run as a beam search, in a line; None: they can (or there
    are no beams)."""
    k = params.num_beams
    if k == 1:
        return None
    if params.n > k:
        return f"generation.n {params.n} is more than generation.num_beams {k}: n returns beams"
    for name, applies, why in NOT_WITH_BEAMS:
        if applies(params):
            return f"generation.{name} does not go with generation.num_beams {k}: {why}"
    return None


def grammar_refusal(params: GenerationParams, grammar: bool) -> str | None:
    """Why a request whose reply must follow a grammar the engine builds itself (a required
    tool call's) cannot search beams; None: it can."""
    if grammar and params.num_beams > 1:
        return (
            "generation.num_beams: a beam follows no grammar, and this request's tool_choice "
            "needs one; ask without beams"
        )
    return None


def rows_of(params: GenerationParams) -> int:
    """The batch rows a request holds: one per beam, or one per sample."""
    return params.num_beams if params.num_beams > 1 else params.n


def top(values: Any, k: int) -> Any:
    """The indices of the k largest values, largest first (ties: the lower index first)."""
    import numpy as np

    if k >= len(values):
        chosen = np.arange(len(values))
    else:
        chosen = np.sort(np.argpartition(-values, k - 1)[:k])
    return chosen[np.argsort(-values[chosen], kind="stable")]


def log_softmax(logits: Any) -> Any:
    """Each row's log-probabilities, in float32."""
    import numpy as np

    logits = logits.astype(np.float32, copy=False)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


class BeamGroup:
    """One request's beam search: its k rows, their running beams and the finished
    hypotheses."""

    def __init__(self, rows: list, limit: int, model_ends: set[int], params: GenerationParams):
        """`model_ends`: the model's end tokens, which end a beam unless `ignore_eos`; the
        request's `stop_token_ids` end one too."""
        import numpy as np

        self.rows = rows  # beam i runs on rows[i] (the engine's; the search only counts them)
        self.k = k = len(rows)
        self.limit = limit  # tokens a hypothesis may have, its end token included
        end_ids = set() if params.ignore_eos else set(model_ends)
        self.end_ids = end_ids | set(params.stop_token_ids)
        self.length_penalty = params.length_penalty
        self.early_stopping = params.early_stopping
        # As transformers: room for every beam to end at once and k still to run on.
        self.keep = max(2, 1 + len(end_ids)) * k
        self.generated = 0  # tokens each running beam has
        self.running: list[list[int]] = [[] for _ in range(k)]
        self.scores = np.full(k, NEG, dtype=np.float32)  # the running beams' summed logprobs
        self.scores[0] = 0.0  # one beam runs at first: the others would repeat it
        self.hypotheses: list[list[int]] = [[] for _ in range(k)]  # finished, best first
        self.hypothesis_scores = np.full(k, NEG, dtype=np.float32)
        self.finished = np.zeros(k, dtype=bool)
        self.improvable = True  # a running beam could still beat the worst hypothesis
        self.done = False

    def step(self, log_probs: Any) -> tuple[list[int], list[int]]:
        """Advance every beam by one token from its log-probabilities ([k, vocabulary],
        float32); returns, for each beam, the beam it continues (whose cache its row must now
        hold) and its new token. Every beam has `generated` tokens then."""
        import numpy as np

        k = self.k
        vocabulary = log_probs.shape[-1]
        summed = (log_probs + self.scores[:, None]).reshape(-1)
        best = top(summed, self.keep)
        top_scores = summed[best]
        parents, tokens = (best // vocabulary).tolist(), (best % vocabulary).tolist()
        length = self.generated + 1
        candidates = [[*self.running[p], t] for p, t in zip(parents, tokens, strict=True)]
        ends = np.array([t in self.end_ids or length >= self.limit for t in tokens])
        # The k best that did not end run on.
        running_scores = top_scores + ends.astype(np.float32) * NEG
        chosen = top(running_scores, k).tolist()
        self._finish(candidates, top_scores, ends, length)
        self.running = [candidates[c] for c in chosen]
        self.scores = running_scores[chosen]
        self.generated = length
        self._check_improvable()
        open_beam = not (bool(self.finished.all()) and self.early_stopping is True)
        self.done = not (self.improvable and open_beam and not bool(ends.all()))
        return [parents[c] for c in chosen], [tokens[c] for c in chosen]

    def _finish(self, candidates: list[list[int]], scores: Any, ends: Any,
                length: int) -> None:  # fmt: skip
        """Add the candidates that ended among the k best to the hypotheses, as
        `_update_finished_beams` does."""
        import numpy as np

        k = self.k
        just_ended = ends & (np.arange(self.keep) < k)
        scores = scores / (length**self.length_penalty)
        if bool(self.finished.all()) and self.early_stopping is True:
            scores = scores + NEG
        if not self.improvable:
            scores = scores + NEG
        scores = scores + (~just_ended).astype(np.float32) * NEG
        merged_scores = np.concatenate((self.hypothesis_scores, scores.astype(np.float32)))
        merged = [*self.hypotheses, *candidates]
        merged_finished = np.concatenate((self.finished, just_ended))
        best = top(merged_scores, k)
        self.hypotheses = [merged[i] for i in best.tolist()]
        self.hypothesis_scores = merged_scores[best]
        self.finished = merged_finished[best]

    def _check_improvable(self) -> None:
        """`_check_early_stop_heuristic`: whether the best running beam, at its best possible
        length, can still beat the worst finished hypothesis."""
        import numpy as np

        never = self.early_stopping == "never" and self.length_penalty > 0.0
        best_length = self.limit if never else self.generated
        best_running = self.scores[0] / np.float32(best_length**self.length_penalty)
        worst = np.where(self.finished, self.hypothesis_scores.min(), NEG)
        self.improvable = self.improvable and bool((best_running > worst).any())

    def replies(self, n: int) -> list[tuple[list[int], str, int]]:
        """The best n hypotheses: each one's tokens (its end token left out), why it ended,
        and the tokens it generated (its end token counted)."""
        out = []
        for tokens in self.hypotheses[:n]:
            if tokens and tokens[-1] in self.end_ids:
                out.append((tokens[:-1], "stop", len(tokens)))
            else:
                out.append((tokens, "length", len(tokens)))
        return out
