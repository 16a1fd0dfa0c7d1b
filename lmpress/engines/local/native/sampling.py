"""What NATIVE does with the logits of every step, row by row.

A step's rows share one forward pass but nothing else: `BatchControl` applies each row's own
penalties, min_tokens, grammar, temperature, top-k/top-p/min-p and seed (its own generator) to
pick its next token (`choose`), then ends each row on its own EOS, stop ids, stop strings,
max_new_tokens or cancellation, streaming its text as deltas (`advance`). Rows join and leave
the batch between steps, so a control is made for each step's rows and keeps nothing itself.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from lmpress.engines.local.bad_words import banned_next
from lmpress.engines.local.speculation import RowDrafts
from lmpress.engines.local.stop_strings import first_stop
from lmpress.engines.local.worker import Submission
from lmpress.vocabulary.reasoning import ReasoningBudget
from lmpress.vocabulary.types import Delta, GenerationParams, TokenLogprob


@dataclass
class BatchRow:
    """One sequence in a batch: one sample of one request."""

    submission: Submission
    index: int
    generator: Any
    tokens: list[int] = field(default_factory=list)  # generated, the ending EOS or stop id left out
    generated: int = 0  # tokens generated, EOS included
    limit: int = 0  # max_new_tokens, or less where the model's context ends first
    finish_reason: str | None = None
    stop_sequence: str | None = None  # the stop string that ended it
    text: str = ""
    emitted: int = 0  # characters already sent as deltas
    logprobs: list[TokenLogprob] | None = None
    matcher: Any = None  # its place in the grammar it follows (guided decoding)
    budget: ReasoningBudget | None = None  # a reasoning model's: its thinking so far
    last: int = 0  # the token it picked last, which the next step feeds the model
    drafts: RowDrafts | None = None  # its prompt-lookup drafting, when it speculates

    @property
    def params(self) -> GenerationParams:
        return self.submission.request.params

    @property
    def needs_text(self) -> bool:
        return self.submission.wants_deltas or bool(self.params.stop_strings)

    @property
    def skips_special_tokens(self) -> bool:
        """Whether its text leaves special tokens out: as asked, but for a reasoning format
        written in special tokens (harmony's channels), which the split must read."""
        thinking = self.submission.reasoning
        keeps = thinking is not None and thinking.keeps_special_tokens
        return self.params.skip_special_tokens and not keeps

    def finish(self, tokenizer: Any) -> None:
        """The row's final text, and "length" where nothing else ended it."""
        if self.finish_reason != "stop" or not self.params.stop_strings:
            self.text = tokenizer.decode(self.tokens, skip_special_tokens=self.skips_special_tokens)
        if self.finish_reason is None:
            self.finish_reason = "length"


def row_generator(seed: int | None, index: int) -> Any:
    """Each row draws from its own generator, so a seeded row samples the same tokens
    whatever else shares its batch."""
    import torch

    if seed is None:
        seed = random.SystemRandom().randrange(2**62)
    return torch.Generator().manual_seed(seed + index)


# How many of each sampled row's most likely tokens a step sorts first (BatchControl._sample).
SAMPLE_WINDOW = 128


def tail_cut(probs: Any, top_k: Any, top_p: Any, min_p: Any) -> Any:
    """Which of the tokens, ordered from the most likely (`probs`, their shares), top_k, top_p
    and min_p cut. Each cut is a tail: once a token is cut, every later one is. The most
    likely token always stays."""
    import torch

    position = torch.arange(probs.shape[1], device=probs.device)[None, :]
    drop = position >= top_k[:, None]
    drop |= (probs.cumsum(dim=-1) - probs) > top_p[:, None]
    drop |= probs < min_p[:, None] * probs[:, :1]
    drop[:, 0] = False
    return drop


class BatchControl:
    """One step's per-row sampling (`choose`) and per-row stopping (`advance`)."""

    def __init__(
        self, rows: list[BatchRow], tokenizer: Any, eos_ids: set[int], processors: Any = None
    ):
        import torch

        self.torch = torch
        self.tokenizer = tokenizer
        self.rows = rows
        self.processors = processors  # the checkpoint's own (generation_defaults "use")
        params = [row.params for row in rows]
        self.sampled = [b for b, p in enumerate(params) if p.sampling_temperature() > 0]
        self.penalised = any(
            p.repetition_penalty != 1 or p.presence_penalty or p.frequency_penalty for p in params
        )
        self.min_tokens = any(p.min_tokens for p in params)
        # generation.bad_words: each row's tokens banned at this step.
        self.banned = {
            b: ids
            for b, row in enumerate(rows)
            if row.submission.bad_words
            and (ids := banned_next(row.submission.bad_words, row.tokens))
        }
        self.want_logprobs = any(p.logprobs for p in params)
        # A reasoning row's grammar waits for its thinking to end; meanwhile the engine may
        # write the tokens that close the thinking in place of sampling.
        self.guided = [
            b
            for b, row in enumerate(rows)
            if row.matcher is not None and not (row.budget is not None and row.budget.waits)
        ]
        self.forced = {
            b: token
            for b, row in enumerate(rows)
            if row.budget is not None and (token := row.budget.forced()) is not None
        }
        self.plain = not (
            self.sampled
            or self.penalised
            or self.min_tokens
            or self.want_logprobs
            or self.guided
            or self.processors
            or self.banned
        )
        # ignore_eos: the model's end tokens are written like any other token.
        self.stop_ids = [
            (set() if p.ignore_eos else set(eos_ids)) | set(p.stop_token_ids) for p in params
        ]
        # min_tokens holds off the model's end tokens, ignored or not, as vLLM does.
        self.end_ids = [set(eos_ids) | set(p.stop_token_ids) for p in params]

    def choose(self, scores: Any) -> Any:
        """Each row's next token, from its logits (one row of `scores` each)."""
        if self.plain:
            return self._force(scores.argmax(dim=-1))
        torch = self.torch
        scores = scores.float()
        rows = self.rows
        if self.min_tokens:
            for b, row in enumerate(rows):
                if row.generated < row.params.min_tokens:
                    scores[b, list(self.end_ids[b])] = float("-inf")
        # Log-probabilities are the model's own distribution, before the checkpoint's
        # processors, penalties and any grammar, as LLAMACPP and VLLM report them.
        reshaped = self.processors or self.penalised or self.guided or self.banned
        model_scores = scores.clone() if self.want_logprobs and reshaped else scores
        if self.processors:  # as generate applies them: on the row's prompt and reply so far
            for b, row in enumerate(rows):
                ids = torch.tensor([row.submission.prompt_ids + row.tokens], device=scores.device)
                scores[b : b + 1] = self.processors(ids, scores[b : b + 1])
        if self.penalised:
            scores = self._penalise(scores)
        for b, ids in self.banned.items():
            scores[b, ids] = float("-inf")
        for b in self.guided:
            if rows[b].finish_reason is None:
                self._constrain(scores[b], rows[b].matcher)
        chosen = scores.argmax(dim=-1)
        if self.sampled:
            idx = torch.tensor(self.sampled, device=scores.device)
            chosen[idx] = self._sample(scores[idx], [rows[b] for b in self.sampled])
        chosen = self._force(chosen)
        if self.want_logprobs:
            self._record_logprobs(model_scores, chosen)
        return chosen

    def _force(self, chosen: Any) -> Any:
        """The tokens the engine writes itself (a thinking budget spent) in place of the
        rows' picks."""
        for b, token in self.forced.items():
            chosen[b] = token
        return chosen

    def _constrain(self, scores: Any, matcher: Any) -> None:
        """Only the tokens the row's grammar allows next keep their score."""
        torch = self.torch
        allowed = torch.from_numpy(matcher.allowed()).to(scores.device, torch.bool)
        n = min(len(allowed), scores.shape[0])
        scores[:n].masked_fill_(~allowed[:n], float("-inf"))
        scores[n:] = float("-inf")  # the model's padded rows past the tokenizer's tokens

    def _penalise(self, scores: Any) -> Any:
        torch = self.torch
        for b, row in enumerate(self.rows):
            p = row.params
            if p.repetition_penalty != 1:
                seen = torch.tensor(
                    sorted(set(row.submission.prompt_ids) | set(row.tokens)), device=scores.device
                )
                picked = scores[b, seen]
                scores[b, seen] = torch.where(
                    picked < 0, picked * p.repetition_penalty, picked / p.repetition_penalty
                )
            if p.presence_penalty or p.frequency_penalty:
                # Counts of the tokens it generated (a stop token would have ended it).
                generated = torch.tensor(row.tokens, dtype=torch.long, device=scores.device)
                counts = torch.bincount(generated, minlength=scores.shape[1])[: scores.shape[1]]
                scores[b] -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0)
        return scores

    def _sample(self, scores: Any, rows: list[BatchRow]) -> Any:
        """Each sampled row's token: its logits over its temperature, ordered from the most
        likely; top_k, top_p and min_p cut the tail (the most likely token always stays); the
        row's one draw of the step picks by the cumulative share of what is left.

        Sorting every row's whole vocabulary took more CPU than SmolLM2's forward pass, and a
        draw nearly always lands among a row's most likely tokens. So each row's top
        SAMPLE_WINDOW are sorted first, with their shares of the whole distribution; a row
        whose tail is cut inside them, or that cuts none and whose draw falls among them,
        picks there; only the others sort all of theirs. Either way it is the token a full
        sort picks, but for a draw within a float rounding of the line between two tokens'
        shares (the window's shares are summed in another order). Measured with
        `benchmarks/native_throughput.py --temperature`."""
        torch = self.torch
        device = scores.device
        temperature = torch.tensor([r.params.sampling_temperature() for r in rows], device=device)
        top_p = torch.tensor([r.params.top_p for r in rows], device=device)
        min_p = torch.tensor([r.params.min_p for r in rows], device=device)
        vocab = scores.shape[1]
        top_k = torch.tensor([r.params.top_k or vocab for r in rows], device=device)
        draws = torch.cat([torch.rand(1, generator=r.generator) for r in rows]).to(device)
        logits = scores / temperature[:, None]
        window = min(SAMPLE_WINDOW, vocab)
        _, order = logits.topk(window, dim=-1)
        probs = logits.softmax(dim=-1).gather(1, order)
        drop = tail_cut(probs, top_k, top_p, min_p)
        cdf = probs.masked_fill(drop, 0.0).cumsum(dim=-1)
        cut = drop[:, -1]  # the tail is cut inside the window: all that is left is in it
        uncut = (top_k >= vocab) & (top_p >= 1) & (min_p <= 0)  # all of it is left: a share of 1
        target = draws * torch.where(cut, cdf[:, -1], torch.ones_like(draws))
        inside = cut | (uncut & (target <= cdf[:, -1]))
        picked = torch.searchsorted(cdf, target[:, None]).clamp(max=window - 1)
        chosen = order.gather(1, picked).squeeze(1)
        if not bool(inside.all()):
            rest = (~inside).nonzero().squeeze(1)
            chosen[rest] = self._sample_sorted(
                logits[rest], top_k[rest], top_p[rest], min_p[rest], draws[rest]
            )
        return chosen

    def _sample_sorted(self, logits: Any, top_k: Any, top_p: Any, min_p: Any, draws: Any) -> Any:
        """`_sample`'s pick for rows whose draw may land anywhere: the whole vocabulary sorted."""
        torch = self.torch
        logits, order = logits.sort(dim=-1, descending=True)
        probs = logits.softmax(dim=-1)
        cdf = probs.masked_fill(tail_cut(probs, top_k, top_p, min_p), 0.0).cumsum(dim=-1)
        picked = torch.searchsorted(cdf, (draws * cdf[:, -1])[:, None])
        return order.gather(1, picked.clamp(max=logits.shape[1] - 1)).squeeze(1)

    def _record_logprobs(self, scores: Any, chosen: Any) -> None:
        decode = self.tokenizer.decode
        logprobs = scores.log_softmax(dim=-1)
        for b, row in enumerate(self.rows):
            if row.logprobs is None or row.finish_reason is not None:
                continue
            token = int(chosen[b])
            top, top_ids = [], []
            if row.params.top_logprobs:
                values, ids = logprobs[b].topk(row.params.top_logprobs)
                top_ids = ids.tolist()
                top = [(decode([i]), v) for v, i in zip(values.tolist(), top_ids, strict=True)]
            lp = float(logprobs[b, token])
            row.logprobs.append(TokenLogprob(decode([token]), lp, top, token, top_ids))

    def advance(self, chosen: Any) -> None:
        """Give each row the token `choose` picked for it, ending the rows it ends."""
        for b, (row, token) in enumerate(zip(self.rows, chosen.tolist(), strict=True)):
            if row.finish_reason is None:
                self._advance(b, row, token)

    def _advance(self, b: int, row: BatchRow, token: int) -> None:
        row.generated += 1
        if token in self.stop_ids[b]:
            row.finish_reason = "stop"
        else:
            row.tokens.append(token)
            thinking = row.budget is not None and row.budget.waits
            if row.budget is not None:
                row.budget.accept(token)
            if row.matcher is not None and not thinking:
                row.matcher.accept(token)
                if row.matcher.complete:  # nothing but the end can follow: end here
                    row.finish_reason = "stop"
            if row.finish_reason is None and row.generated >= row.limit:
                row.finish_reason = "length"
        if row.submission.cancelled:
            row.finish_reason = "cancelled"
            return
        if row.needs_text:
            self._update_text(row)

    def _update_text(self, row: BatchRow) -> None:
        params = row.params
        text = self.tokenizer.decode(row.tokens, skip_special_tokens=row.skips_special_tokens)
        holdback = 0
        if params.stop_strings:
            hit = first_stop(text, params.stop_strings)
            if hit is not None:
                text = text[: hit[0]]
                row.finish_reason, row.stop_sequence = "stop", hit[1]
            else:
                holdback = max(len(s) for s in params.stop_strings) - 1
        row.text = text
        if not row.submission.wants_deltas:
            return
        if row.finish_reason is None:
            # Hold back a half-formed character and anything that may begin a stop string.
            end = len(text.rstrip("\ufffd")) - holdback
        else:
            end = len(text)
        if end > row.emitted:
            row.submission.deliver(
                Delta(row.submission.request.id, text[row.emitted : end], row.index)
            )
            row.emitted = end
