"""What LLAMACPP's scheduler keeps per request (`LlamaCppSubmission`: the worker's
`Submission` with its rows and how much of its prompt is read) and per sequence
(`SequenceRow`: one sample, decoded in one sequence of the KV cache). NATIVE's counterpart of a
row is `BatchRow` (native/sampling.py), which holds a generator where this holds a sampler
chain and a sequence id."""

from __future__ import annotations

import codecs
from dataclasses import dataclass, field
from typing import Any

from lmpress.engines.local.guided import Matcher
from lmpress.engines.local.llamacpp.loading import Vocab
from lmpress.engines.local.speculation import RowDrafts
from lmpress.engines.local.stop_strings import first_stop
from lmpress.engines.local.worker import Submission
from lmpress.vocabulary.reasoning import ReasoningBudget
from lmpress.vocabulary.types import Delta, GenerationParams, TokenLogprob


@dataclass(eq=False)
class LlamaCppSubmission(Submission):
    """A request as LLAMACPP's scheduler takes it."""

    logit_bias: list[tuple[int, float]] = field(default_factory=list)
    rows: list[SequenceRow] = field(default_factory=list)
    fed: int = 0  # prompt tokens already decoded
    # With `prompt_logprobs`: one entry per prompt token, filled as its chunks are read.
    prompt_logprobs: list[TokenLogprob | None] | None = None
    # The request in flight whose KV cells it waits to take before it reads the rest.
    awaiting: Fork | None = None

    def __post_init__(self) -> None:
        if self.request.params.prompt_logprobs is not None:
            self.prompt_logprobs = [None] * len(self.prompt_ids)

    @property
    def first_logits(self) -> int:
        """The first prompt position whose logits are read: the last one's, where the first
        token is sampled, or with `prompt_logprobs` the one before `Request.score_from` (the
        logits at a position score the token after it). The KV cells of the positions before
        it may come from a cached or shared prefix; from it on, the prompt is decoded."""
        last = len(self.prompt_ids) - 1
        if self.prompt_logprobs is None:
            return last
        return min(last, max(self.request.score_from, 1) - 1)


@dataclass(eq=False)
class Fork:
    """Where a request takes the first `length` KV cells of its prompt: sequence `seq` of the
    request in flight `source`, whose prompt begins the same way (scheduling.py)."""

    source: LlamaCppSubmission
    seq: int
    length: int


@dataclass(eq=False)
class PromptChunk:
    """The part of a prompt one step reads into its sequence: up to `end`."""

    submission: LlamaCppSubmission
    seq_id: int
    end: int
    batch_index: int = -1  # the batch row of its last token
    # Its first position whose logits the batch returns (`first_logits` or later), and the
    # batch row of those logits; the positions after it follow row by row.
    scored: int = -1
    scored_index: int = -1


@dataclass(eq=False)
class SequenceRow:
    """One sequence in the KV cache: one sample of one request."""

    submission: LlamaCppSubmission
    index: int
    seq_id: int
    limit: int  # tokens this row may generate
    cells: int = 0  # KV cells it reserved: its share of `limit`, and the prompt's for the first
    sampler: Any = None
    matcher: Matcher | None = None
    pos: int = 0  # tokens of this sequence in the KV cache
    next_token: int = -1  # sampled, to be decoded at the next step
    batch_index: int = -1  # its row in the step's batch
    tokens: list[int] = field(default_factory=list)  # generated, the ending token left out
    generated: int = 0  # tokens generated, end tokens included
    text: str = ""
    emitted: int = 0  # characters already sent as deltas
    finish_reason: str | None = None
    stop_sequence: str | None = None  # the stop string that ended it
    # An incremental decoder keeps a character split across tokens until it is whole.
    decoder: Any = field(default_factory=lambda: codecs.getincrementaldecoder("utf-8")("replace"))
    logprobs: list[TokenLogprob] | None = None
    budget: ReasoningBudget | None = None  # a reasoning model's: its thinking so far
    # Speculation (this engine's speculation.py): the row's drafting, None when off; the
    # tokens it carries after `next_token` this step, the first `drafted` of them its drafts
    # and the rest fillers; and the draft positions it has verified and kept, all steps.
    drafts: RowDrafts | None = None
    carried: list[int] = field(default_factory=list)
    drafted: int = 0
    draft_tried: int = 0
    draft_kept: int = 0

    def __post_init__(self) -> None:
        if self.params.logprobs:
            self.logprobs = []
        if self.submission.reasoning is not None:
            self.budget = self.submission.reasoning.budget()

    @property
    def special_pieces(self) -> bool:
        """Whether special tokens are written into its text: as asked, and always for a
        reasoning format written in them (harmony's channels), which the split must read."""
        thinking = self.submission.reasoning
        keeps = thinking is not None and thinking.keeps_special_tokens
        return keeps or not self.params.skip_special_tokens

    @property
    def params(self) -> GenerationParams:
        return self.submission.request.params

    def add(self, token: int, logprob: TokenLogprob | None, vocab: Vocab, thinking: bool) -> None:
        """A token the row picked (its logprob entry, when it asks for them), added to its
        reply; its `finish_reason` set if it ends the row. `thinking`: a reasoning row still
        thinking, whose grammar waits for its answer."""
        params = self.params
        self.generated += 1
        if logprob is not None:  # an end token too: it was sampled, and counted
            self.logprobs.append(logprob)
        if (vocab.is_end(token) and not params.ignore_eos) or token in params.stop_token_ids:
            self.finish_reason = "stop"
            return
        self.tokens.append(token)
        if self.budget is not None:
            self.budget.accept(token)
        if self.matcher is not None and not thinking:
            self.matcher.accept(token)
            if self.matcher.complete:  # nothing but the end can follow: end here
                self.finish_reason = "stop"
        self.text += self.decoder.decode(vocab.piece(token, special=self.special_pieces))
        if params.stop_strings:
            self.cut_at_stop_string()
        if self.finish_reason is None and self.generated >= self.limit:
            self.finish_reason = "length"

    def cut_at_stop_string(self) -> None:
        hit = first_stop(self.text, self.params.stop_strings)
        if hit is not None:
            self.text = self.text[: hit[0]]
            self.finish_reason, self.stop_sequence = "stop", hit[1]
            self.decoder.reset()  # bytes after the stop string are not part of the reply

    def stream_text(self) -> None:
        if not self.submission.wants_deltas or self.submission.cancelled:
            return
        end = len(self.text)
        if self.finish_reason is None and self.params.stop_strings:
            # Hold back what may be the beginning of a stop string.
            end -= max(len(s) for s in self.params.stop_strings) - 1
        if end > self.emitted:
            self.submission.deliver(
                Delta(self.submission.request.id, self.text[self.emitted : end], self.index)
            )
            self.emitted = end
