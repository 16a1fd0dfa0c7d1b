"""Beam search for NATIVE: a request with `num_beams` k > 1 holds k rows of the batch, and
each step keeps the k likeliest continuations of its beams rather than sampling each row.

It is transformers' beam search (`GenerationMixin._beam_search`), step for step, so that a
request's beams equal `generate(num_beams=k)`'s on the same model: the 2k (more with several
end tokens) likeliest continuations over all beams; those ending (an end token, or the reply's
last token) go to the finished hypotheses with their score over `length ** length_penalty`,
the best k others run on; `early_stopping` (True, False or "never") decides when the finished
ones can no longer be beaten. `n` returns the best n hypotheses.

Beam rows share the batch's steps with every other row: the scheduler hands a group its rows'
logits, and moves each row's KV cache to the slot of the beam that continues it
(`BatchCache.reorder`). Nothing is sampled, so a group has no seed or temperature; it writes its
replies when the search ends, not as it goes (a beam's text may be dropped at any step).
"""

from __future__ import annotations

from typing import Any

from lmpress.vocabulary.types import GenerationParams

# transformers' stand-in for minus infinity in its beam bookkeeping; the same value keeps ties
# and orderings the same.
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


def rows_of(params: GenerationParams) -> int:
    """The batch rows a request holds: one per beam, or one per sample."""
    return params.num_beams if params.num_beams > 1 else params.n


class BeamGroup:
    """One request's beam search: its k rows, their running beams and the finished
    hypotheses."""

    def __init__(self, rows: list[Any], limit: int, end_ids: set[int], params: GenerationParams):
        import torch

        self.torch = torch
        self.rows = rows  # beam i runs on rows[i]
        self.k = k = len(rows)
        self.limit = limit  # tokens a hypothesis may have, its end token included
        self.end_ids = end_ids
        self.length_penalty = params.length_penalty
        self.early_stopping = params.early_stopping
        # As transformers: room for every beam to end at once and k still to run on.
        self.keep = max(2, 1 + len(end_ids)) * k
        self.generated = 0  # tokens each running beam has
        self.running: list[list[int]] = [[] for _ in range(k)]
        self.scores = torch.full((k,), NEG)  # the running beams' summed log-probabilities
        self.scores[0] = 0.0  # one beam runs at first: the others would repeat it
        self.hypotheses: list[list[int]] = [[] for _ in range(k)]  # finished, best first
        self.hypothesis_scores = torch.full((k,), NEG)
        self.finished = torch.zeros(k, dtype=torch.bool)
        self.improvable = True  # a running beam could still beat the worst hypothesis
        self.done = False

    def step(self, logits: Any) -> list[int]:
        """Advance every beam by one token from its logits ([k, vocabulary]); returns, for
        each beam, the beam it continues (whose KV cache its row must now hold). The new
        tokens are the rows' `last`."""
        torch, k = self.torch, self.k
        log_probs = torch.log_softmax(logits.float(), dim=-1)
        vocabulary = log_probs.shape[-1]
        summed = (log_probs + self.scores[:, None]).reshape(-1)
        top_scores, top = torch.topk(summed, self.keep)
        parents, tokens = (top // vocabulary).tolist(), (top % vocabulary).tolist()
        length = self.generated + 1
        candidates = [[*self.running[p], t] for p, t in zip(parents, tokens, strict=True)]
        ends = torch.tensor([t in self.end_ids or length >= self.limit for t in tokens])
        # The k best that did not end run on.
        running_scores = top_scores + ends.float() * NEG
        chosen = torch.topk(running_scores, k).indices.tolist()
        self._finish(candidates, top_scores, ends, length)
        self.running = [candidates[c] for c in chosen]
        self.scores = running_scores[chosen]
        self.generated = length
        continues = [parents[c] for c in chosen]
        for row, c in zip(self.rows, chosen, strict=True):
            row.last = tokens[c]
            row.generated = length
        self._check_improvable()
        open_beam = not (bool(self.finished.all()) and self.early_stopping is True)
        self.done = not (self.improvable and open_beam and not bool(ends.all()))
        return continues

    def _finish(self, candidates: list[list[int]], scores: Any, ends: Any, length: int) -> None:
        """Add the candidates that ended among the k best to the hypotheses, as
        `_update_finished_beams` does."""
        torch, k = self.torch, self.k
        just_ended = ends & (torch.arange(self.keep) < k)
        scores = scores / (length**self.length_penalty)
        if bool(self.finished.all()) and self.early_stopping is True:
            scores = scores + NEG
        if not self.improvable:
            scores = scores + NEG
        scores = scores + (~just_ended).float() * NEG
        merged_scores = torch.cat((self.hypothesis_scores, scores))
        merged = [*self.hypotheses, *candidates]
        merged_finished = torch.cat((self.finished, just_ended))
        best = torch.topk(merged_scores, k).indices
        self.hypotheses = [merged[i] for i in best.tolist()]
        self.hypothesis_scores = merged_scores[best]
        self.finished = merged_finished[best]

    def _check_improvable(self) -> None:
        """`_check_early_stop_heuristic`: whether the best running beam, at its best possible
        length, can still beat the worst finished hypothesis."""
        torch = self.torch
        never = self.early_stopping == "never" and self.length_penalty > 0.0
        best_length = self.limit if never else self.generated
        best_running = self.scores[0] / (best_length**self.length_penalty)
        worst = torch.where(self.finished, self.hypothesis_scores.min(), torch.tensor(NEG))
        self.improvable = self.improvable and bool((best_running > worst).any())

    def replies(self, n: int) -> list[tuple[list[int], str]]:
        """The best n hypotheses: each one's tokens (its end token left out) and why it
        ended."""
        out = []
        for tokens in self.hypotheses[:n]:
            if tokens and tokens[-1] in self.end_ids:
                out.append((tokens[:-1], "stop"))
            else:
                out.append((tokens, "length"))
        return out
