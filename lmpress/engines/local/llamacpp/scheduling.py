"""LLAMACPP's scheduler: continuous batching over one llama.cpp context, on the worker thread.

`LlamaCppScheduler` is built by `LlamaCppEngine` with the batched context it takes over, and
owns everything that changes while the worker runs. The context's KV cache is shared by up to
`batch_size` sequences (sequences.py decides which a request takes, and keeps a finished one's
cells for a request that starts the same way). A request starts when the cells its rows may
grow to (its prompt and `max_new_tokens` a sample, up to the whole context) fit beside what
the rows in flight may grow to, cells kept for reuse giving way; so a step never runs out of
room, and one conversation may use the whole context while short rows batch; rows that choose
LoRA adapters take turns by adapter (turns.py), as llama.cpp applies one to a whole context.
Each step decodes one token of every sequence being generated in one `llama_batch`, and the
next chunk of every prompt being read in one more, as llama-server packs its slots' prompts (an
image's chunk is its embeddings, encoded by the projector when the prompt reaches it, in a
batch of its own: batches.py writes and decodes them); each row then samples from its own
sampler chain (sampling.py).

A request that scores its prompt (`prompt_logprobs`) has its prompt's logits from the position
before `Request.score_from` on, read as its chunks are decoded (reading.py); requests after one
context (a question's choices) read it once, the others taking the first one's KV cells
(forks.py).

With `model.speculative_method: ngram` (or a draft model, drafting.py) a row being generated may
carry drafted tokens after its next one (engines/local/speculation.py; this engine's
speculation.py decides how many, for the batch's cost): it samples at each of their positions in turn, exactly as it would one step at a time,
keeps going while its token equals the draft there, and the KV cells of the drafts it did not
keep are dropped.
"""

from __future__ import annotations

from typing import Any

from lmpress.engines.base import Engine
from lmpress.engines.local.bad_words import banned_next
from lmpress.engines.local.beams import rows_of
from lmpress.engines.local.llamacpp.batches import Batches, KvCacheFull
from lmpress.engines.local.llamacpp.beam_rows import BeamSearches
from lmpress.engines.local.llamacpp.drafting import Drafter
from lmpress.engines.local.llamacpp.forks import fork_source, settle
from lmpress.engines.local.llamacpp.loading import Vocab
from lmpress.engines.local.llamacpp.loras import Loras
from lmpress.engines.local.llamacpp.projector import Projector, text_ids
from lmpress.engines.local.llamacpp.reading import (
    PROMPT_CHUNK,
    prompt_chunks,
    put_chunk,
    score_chunk,
)
from lmpress.engines.local.llamacpp.rows import LlamaCppSubmission, PromptChunk, SequenceRow
from lmpress.engines.local.llamacpp.sampling import Sampling
from lmpress.engines.local.llamacpp.sequences import Sequences
from lmpress.engines.local.llamacpp.speculation import Candidate, plan
from lmpress.engines.local.llamacpp.turns import Turns
from lmpress.engines.local.speculation import Speculation, SpeculationCounts
from lmpress.engines.local.worker import Scheduler, WorkQueue, failure_info
from lmpress.vocabulary.errors import ErrorKind
from lmpress.vocabulary.types import ErrorInfo, Result, Sample


class LlamaCppScheduler(Scheduler):
    """LLAMACPP's worker loop over one batched context (see the module docstring)."""

    def __init__(
        self,
        queue: WorkQueue,
        engine: Engine,
        *,
        ctx: Any,
        vocab: Vocab,
        projector: Projector | None,
        batch_size: int,
        penalty_window: int | None,
        speculation: Speculation | None = None,
        drafter: Drafter | None = None,
        loras: Loras | None = None,
    ):
        """Take over `ctx` (a context holding `batch_size` sequences). `penalty_window`: the
        tokens penalties look back over; None for the whole sequence. `speculation`: the
        model's drafting settings, None when off; `drafter`: its draft model's (drafting.py),
        None for prompt lookup. `loras`: the model's adapters, which rows take turns at
        (turns.py), None for none."""
        super().__init__(queue, engine)
        import llama_cpp

        self._ctx = ctx
        self.vocab = vocab
        self.batch_size = batch_size
        self.n_ctx = llama_cpp.llama_n_ctx(ctx.ctx)  # the KV cells all sequences share
        self.n_ctx_seq = llama_cpp.llama_n_ctx_seq(ctx.ctx)  # n_ctx, or a split cache's part
        self.reserved = 0  # cells the rows in flight hold or may grow to (SequenceRow.cells)
        self.sequences = Sequences(
            llama_cpp, llama_cpp.llama_get_memory(ctx.ctx), batch_size, self.n_ctx_seq < self.n_ctx
        )
        self.batches = Batches(llama_cpp, ctx.ctx, projector)
        self._sampling = Sampling(ctx.ctx, vocab, penalty_window or self.n_ctx)
        self.prompt_tokens_reused = 0  # prompt tokens not decoded again, thanks to the cache
        self.speculation = speculation
        self.speculation_counts = SpeculationCounts()  # drafts verified and kept, all rows
        self.drafter = drafter
        self._prefilling: list[LlamaCppSubmission] = []
        self._generating: list[SequenceRow] = []
        self._beams = BeamSearches(self.sequences, self._sampling, vocab)  # beam_rows.py
        self.most_in_flight = 0  # the most sequences decoded in one step so far
        self.turns = Turns(batch_size, loras, ctx.ctx, self.sequences)

    def kv_cache_usage(self) -> float:
        """The fraction of the context's KV cells that the requests in flight hold; the cells
        a free sequence keeps for a prompt that starts the same way count as free, as vLLM
        counts its cached blocks. Read from the event loop without a lock (never llama.cpp,
        which the worker is using): at most a step out of date."""
        held = sum(submission.fed for submission in list(self._prefilling))
        held += sum(row.pos for row in list(self._generating))
        return held / self.n_ctx

    def close(self) -> None:
        """Free the context and the batches; the worker has stopped."""
        self.batches.free()
        self._ctx.close()
        if self.drafter is not None:
            self.drafter.close()

    def run(self) -> None:
        queue = self.queue
        try:
            while True:
                with queue.wakeup:
                    while not (queue.pending or self._busy() or queue.closed):
                        queue.wakeup.wait()
                    if queue.closed:
                        return
                    try:
                        self._drop_cancelled()
                        self._admit()
                    except Exception as exc:  # never leave callers waiting on a dead worker
                        self._fail_all(failure_info(exc))
                if not self._busy():
                    continue
                try:
                    self._step()
                except Exception as exc:  # one bad step must not take the worker down
                    self._fail_all(failure_info(exc))
        finally:
            self._shutdown()

    def _busy(self) -> bool:
        return bool(self._prefilling or self._generating)

    def _drop_cancelled(self) -> None:
        pending = self.queue.pending
        for submission in [s for s in pending if s.cancelled]:
            pending.remove(submission)
        for submission in [s for s in self._prefilling if s.cancelled]:
            self._prefilling.remove(submission)
            self._beams.drop(submission)
            self._release(submission)
        for row in [r for r in self._generating if r.submission.cancelled]:
            self._beams.drop(row.submission)
            row.finish_reason = "cancelled"
            self._finish_row(row)

    def _admit(self) -> None:
        """Start waiting requests, oldest first (of the adapter whose turn it is: turns.py),
        while sequences are free and their cells fit beside what the requests in flight may
        still grow to. The oldest waits, and those after it with it, until rows end and free
        their cells: a long prompt is not passed over for ever by short ones."""
        pending = self.queue.pending
        while True:
            submission = self.turns.next(pending, self._busy())  # by adapter (turns.py)
            count = rows_of(submission.request.params) if submission else 0  # samples, or beams
            if submission is None or count > len(self.sequences.free):
                return
            params, prompt = submission.request.params, submission.prompt_ids
            seqs = self.sequences.choose(prompt, count)
            if self.n_ctx_seq < self.n_ctx:  # a split cache: a row ends when its part is full
                limit, dropped = min(params.max_new_tokens, self.n_ctx_seq - len(prompt)), []
            else:  # a row ends when the context is full; the samples of one prompt share it
                limit = min(params.max_new_tokens, (self.n_ctx - len(prompt)) // count)
                cells = len(prompt) + count * limit
                # The free sequences it does not take keep what the rest of the cache leaves.
                dropped = self.sequences.make_room(self.n_ctx - self.reserved - cells, seqs)
                if dropped is None:
                    return
            self._forget(dropped)
            pending.remove(submission)
            self.turns.admitted()
            self.sequences.take(seqs)
            self._start(submission, seqs, limit)

    def _start(self, submission: LlamaCppSubmission, seqs: list[int], limit: int) -> None:
        """Give an admitted request its rows, each reserving the cells it may grow to, and
        its prompt's first cells kept from the sequence's last request or, for a request that
        scores its prompt, taken from a request in flight (forks.py)."""
        params = submission.request.params
        submission.fed = self.sequences.keep_prefix(
            submission.prompt_ids, seqs, submission.first_logits
        )
        self.prompt_tokens_reused += submission.fed
        submission.rows = [SequenceRow(submission, i, seq, limit) for i, seq in enumerate(seqs)]
        submission.rows[0].cells = len(submission.prompt_ids)  # the prompt's, shared
        for row in submission.rows:
            row.cells += limit
            self.reserved += row.cells
        if self.drafter is None:  # a draft model's context would not follow
            submission.awaiting = fork_source(
                submission, self._prefilling, self._generating, self.sequences
            )
            self.prompt_tokens_reused += settle(submission, self.sequences)
        # A draft model reads a row's tokens, which an image's placeholders are not.
        drafts = self.drafter is None or not submission.media
        if params.num_beams > 1:  # a beam's sequence changes, which no drafting follows
            drafts = False
            self._beams.start(submission, limit)
        if self.speculation is not None and drafts:
            for row in submission.rows:
                row.drafts = self.speculation.row(text_ids(submission.prompt_ids))
        if submission.matcher is not None:
            for row in submission.rows:
                row.matcher = submission.matcher.copy()
        try:
            for row in submission.rows:
                row.sampler = self._sampling.chain(
                    params, row.index, text_ids(submission.prompt_ids), submission.logit_bias
                )
        except Exception as exc:  # this request's settings, not the engine, are at fault
            self._release(submission)
            self.fail([submission], failure_info(exc))
            return
        self._prefilling.append(submission)

    def _settle_forks(self) -> None:
        """Requests awaiting a prefix in flight take it once it is there (forks.settle)."""
        for submission in self._prefilling:
            self.prompt_tokens_reused += settle(submission, self.sequences)

    def _step(self) -> None:
        """One batch for every sequence in flight: the next token of each one being generated
        and the next chunk of each prompt being read (an image's chunk goes in a batch of its
        own first), in sequence-id order."""
        reading = []
        self._settle_forks()  # for a source cancelled since the last step
        for submission in sorted(self._prefilling, key=lambda s: s.rows[0].seq_id):
            if submission.awaiting is not None:
                continue
            image = next(
                (m for m in submission.media or () if m.start <= submission.fed < m.end), None
            )
            if image is None:
                reading.append(submission)
                continue
            count = self.batches.decode_image(
                image, submission.fed, submission.rows[0].seq_id, len(submission.prompt_ids)
            )
            submission.fed += count
            if submission.fed == len(submission.prompt_ids):
                self._start_generating(submission, count - 1)
        rows = list(self._generating)
        self.most_in_flight = max(self.most_in_flight, len(rows))
        proposals = self._proposals(rows)
        room = self.batches.size - len(rows) - sum(map(len, proposals))
        chunks = prompt_chunks(reading, room)
        if self.speculation is not None:
            self._shape(rows, proposals, chunks)
        parts = sorted(rows + chunks, key=lambda part: part.seq_id)
        n, put = 0, self.batches.put
        for part in parts:
            if isinstance(part, SequenceRow):
                part.batch_index = n  # its next token's logits, then its drafts'
                for j, token in enumerate([part.next_token, *part.carried]):
                    put(n, token, part.pos + j, part.seq_id, True)
                    n += 1
                part.pos += 1
            else:
                n = put_chunk(self.batches, part, n)
        if n == 0:
            return
        try:
            self.batches.decode(n)
        except KvCacheFull:
            # The cells the rows reserve fit by construction; should llama.cpp still find no
            # room, the cells free sequences keep for reuse give way, and the step runs again.
            self._forget(self.sequences.make_room(0, []))
            self.batches.decode(n)
        searched = set()  # beam searches stepped, all their rows at once (they may end)
        for part in parts:
            if isinstance(part, SequenceRow):
                submission = part.submission
                if submission in self._beams and submission not in searched:
                    searched.add(submission)
                    indices = [row.batch_index for row in submission.rows]
                    self._beams.step(submission, indices, self._finish_row)
                elif submission not in searched:
                    self._sample(part, part.batch_index)
            else:
                score_chunk(self._sampling, part)
                part.submission.fed = part.end
                if part.end == len(part.submission.prompt_ids):
                    self._start_generating(part.submission, part.batch_index)
        self._settle_forks()

    def _proposals(self, rows: list[SequenceRow]) -> list[list[int]]:
        """Each row's drafts this step ([] for none), as many as its budget and its share of
        the batch leave room for."""
        if self.speculation is None:
            return [[] for _ in rows]
        share = min(PROMPT_CHUNK, self.batches.size // max(1, len(rows))) - 1
        if self.drafter is not None:
            # Places for the draft model's tokens, drafted once the step's shape is planned
            # (`_shape`): a draft model's drafts cost passes of their own.
            return [
                [-1] * row.drafts.wanted(min(self._room(row), share)) if row.drafts else []
                for row in rows
            ]
        return [
            row.drafts.propose(min(self._room(row), share)) if row.drafts else [] for row in rows
        ]

    def _room(self, row: SequenceRow) -> int:
        """The most tokens a row may carry after its next one: what its budget leaves after
        that token, and a split cache's part."""
        return min(row.limit - row.generated - 1, self.n_ctx_seq - row.pos - 1)

    def _shape(
        self, rows: list[SequenceRow], proposals: list[list[int]], chunks: list[PromptChunk]
    ) -> None:
        """Set what each row carries after its next token this step (speculation.plan)."""
        candidates = [
            Candidate(row.seq_id, len(drafts), self._room(row), row.draft_kept, row.draft_tried)
            for row, drafts in zip(rows, proposals, strict=True)
        ]
        reading = [(chunk.seq_id, chunk.end - chunk.submission.fed) for chunk in chunks]
        shape = plan(candidates, reading, self.batches.micro_size)
        if self.drafter is not None:
            proposals = self.drafter.propose(rows, [count for count, _ in shape])
        for row, drafts, (count, fillers) in zip(rows, proposals, shape, strict=True):
            row.carried = drafts[:count] + [row.next_token] * fillers
            row.drafted = len(drafts[:count])  # fewer where the draft model found no room

    def _start_generating(self, submission: LlamaCppSubmission, index: int) -> None:
        """The prompt is in the KV cache: every sample samples its first token from the
        prompt's last logits and joins the sequences being generated; a request for no new
        tokens (one that scores its prompt) is answered now."""
        self._prefilling.remove(submission)
        if submission.request.params.max_new_tokens == 0:
            submission.rows[0].pos = len(submission.prompt_ids)  # the others hold no cells
            for row in submission.rows:
                row.finish_reason = "length"
                self._finish_row(row)
            return
        first = submission.rows[0].seq_id
        for row in submission.rows:
            if row.seq_id != first:  # the other samples share the prompt's KV cells
                self.sequences.copy(first, row.seq_id)
            row.pos = len(submission.prompt_ids)
            self._generating.append(row)
        if submission in self._beams:  # every beam continues the prompt
            self._beams.step(submission, [index] * len(submission.rows), self._finish_row)
            return
        for row in submission.rows:
            self._sample(row, index)

    def _sample(self, row: SequenceRow, index: int) -> None:
        """Sample the row's next token from the logits at batch row `index`, and on at each
        position of the tokens it carried after it while its token equals the one carried
        there; then drop the KV cells of those it did not keep, and end the row or queue its
        last token for the next step."""
        carried, kept, emitted = row.carried, 0, []
        for j in range(len(carried) + 1):
            emitted.append(self._pick(row, index + j))
            if row.finish_reason is not None or j == len(carried) or emitted[-1] != carried[j]:
                break
            kept += 1
        if carried:
            row.pos += kept
            if kept < len(carried):
                self.sequences.trim(row.seq_id, row.pos)
            drafted, kept_drafts = row.drafted, min(kept, row.drafted)
            row.draft_kept += kept_drafts
            row.draft_tried += min(kept + 1, drafted)
            if drafted:
                self.speculation_counts.add(drafted, kept_drafts)
        if row.drafts is not None:
            row.drafts.settle(row.drafted, min(kept, row.drafted), emitted)
        row.carried, row.drafted = [], 0
        if row.finish_reason is None:
            row.next_token = emitted[-1]
            row.stream_text()
        else:
            self._finish_row(row)

    def _pick(self, row: SequenceRow, index: int) -> int:
        """The row's token from the logits at batch row `index`, added to its reply (its
        `finish_reason` set if it ends the row)."""
        params = row.params
        wants_logprobs = row.logprobs is not None
        budget = row.budget
        # A reasoning row's grammar waits for its thinking to end, and once its thinking
        # budget is spent the engine writes the tokens that close it in place of sampling.
        thinking = budget is not None and budget.waits
        forced = budget.forced() if budget is not None else None
        if forced is not None:
            token, logprob = self._sampling.force(
                row.sampler, params, index, wants_logprobs, forced
            )
        else:
            matcher = None if thinking else row.matcher
            bad_words = row.submission.bad_words
            token, logprob = self._sampling.pick(
                row.sampler, params, row.generated, index, wants_logprobs, matcher,
                banned_next(bad_words, row.tokens) if bad_words else [],
            )  # fmt: skip
        row.add(token, logprob, self.vocab, thinking)
        return token

    def _finish_row(self, row: SequenceRow) -> None:
        submission = row.submission
        if row in self._generating:
            self._generating.remove(row)
        if row.finish_reason == "cancelled":
            self.sequences.clear(row.seq_id)
            kept = []
        elif not row.pos:  # a sample of a request for no new tokens, but the first
            kept = []
        else:  # kept for a later request that starts the same way
            kept = submission.prompt_ids + row.tokens[: row.pos - len(submission.prompt_ids)]
        self._give_back(row, kept)
        self._sampling.free(row.sampler)
        row.sampler = None
        row.text += row.decoder.decode(b"", final=True)
        row.stream_text()
        if all(r.finish_reason is not None for r in submission.rows) and not submission.cancelled:
            submission.deliver(self._result(submission))

    def _release(self, submission: LlamaCppSubmission) -> None:
        """Free the sequences a request still holds (it was cancelled or failed)."""
        for row in submission.rows:
            if row.finish_reason is not None:
                continue  # already freed by _finish_row
            row.finish_reason = "cancelled" if submission.cancelled else "error"
            self.sequences.clear(row.seq_id)
            self._give_back(row, [])
            if row.sampler is not None:
                self._sampling.free(row.sampler)
                row.sampler = None

    def _give_back(self, row: SequenceRow, kept: list[int]) -> None:
        """Free a row's sequence, its cells holding `kept`, and the cells it reserved."""
        self.reserved -= row.cells
        row.cells = 0
        self.sequences.give_back(row.seq_id, kept)
        if self.drafter is not None:  # the draft model keeps no more than the model
            self.drafter.keep(row.seq_id, kept)

    def _forget(self, seqs: list[int] | None) -> None:
        """The draft model drops what free sequences no longer keep (Sequences.make_room)."""
        if self.drafter is not None:
            for seq in seqs or ():
                self.drafter.keep(seq, [])

    def _fail_all(self, error: ErrorInfo) -> None:
        self._beams.groups.clear()
        held = list(self._prefilling) + [r.submission for r in self._generating]
        submissions = list(dict.fromkeys(held))
        self._prefilling.clear()
        self._generating.clear()
        for submission in submissions:
            self._release(submission)
        self.fail(submissions, error)

    def _shutdown(self) -> None:
        queue = self.queue
        with queue.wakeup:
            queue.closed = True
            waiting = list(queue.pending)
            queue.pending.clear()
        closed = ErrorInfo(ErrorKind.ENGINE_CLOSED, "the LLAMACPP engine was closed")
        self._fail_all(closed)
        self.fail(waiting, closed)

    def _result(self, submission: LlamaCppSubmission) -> Result:
        rows = submission.rows[: submission.request.params.n]  # a beam search's best n
        samples = [
            Sample(
                text=row.text,
                finish_reason=row.finish_reason or "length",
                logprobs=row.logprobs,
                completion_tokens=row.generated,
                reasoning_tokens=row.budget.spent if row.budget is not None else 0,
                stop_sequence=row.stop_sequence,
            )
            for row in rows
        ]
        result = self.result(submission, samples)
        result.prompt_logprobs = submission.prompt_logprobs
        if not submission.media:  # an image's tokens have no ids of their own
            result.prompt_ids = list(submission.prompt_ids)
        return result
