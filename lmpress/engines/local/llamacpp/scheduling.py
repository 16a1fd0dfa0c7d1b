"""The worker thread of LLAMACPP: continuous batching over one llama.cpp context.

The context's KV cache holds up to `batch_size` sequences, each in its own part. Each step
decodes one token of every sequence being generated in one `llama_batch`, and the next chunk of
every prompt being read in one more, as llama-server packs its slots' prompts (an image's chunk
is its embeddings, encoded by the projector when the prompt reaches it, in a batch of its own);
each row then samples from its own sampler chain (sampling.py). A finished sequence's place goes
to the next waiting request at once. Its KV cells stay until then: a request whose prompt begins like a free sequence's last prompt and
reply (the same system prompt, the next turn of a chat) takes that sequence and reads only the
rest.
"""

from __future__ import annotations

import ctypes
import time
from typing import Any

from lmpress.engines.base import error_result
from lmpress.engines.local.llamacpp.loading import Vocab
from lmpress.engines.local.llamacpp.projector import ImageSegment, Projector, text_ids
from lmpress.engines.local.llamacpp.rows import PromptChunk, RequestState, Row, common_prefix
from lmpress.engines.local.llamacpp.sampling import Sampling
from lmpress.engines.local.worker import WorkerEngine, failure_info
from lmpress.vocabulary.errors import ErrorKind
from lmpress.vocabulary.types import ErrorInfo, Result, Sample, Usage

# The most tokens of one prompt read in one batch. llama.cpp's CPU flash attention takes a tiled
# kernel, which rounds differently, for 64 (GGML_FA_TILE_Q) or more tokens of a sequence in one
# micro-batch: below that, a prompt token's attention is computed alike however the prompt is
# cut, so packing prompts together (or reusing a cached prefix) leaves greedy replies as they
# are at batch size 1.
PROMPT_CHUNK = 63


# A cached prefix shorter than this (a chat template's opening, a word or two) does not decide
# which sequence a request takes: keeping it spares a few tokens, and a sequence taken out of
# id order costs a micro-batch a step while its prompt is read.
KEPT_PREFIX = 16


class LlamaCppScheduler(WorkerEngine):
    """The worker side of LlamaCppEngine, which loads the model and its `vocab` (and a
    `projector` for images, or None) and then calls `_start_scheduling` with the batched
    context."""

    vocab: Vocab
    projector: Projector | None

    def _start_scheduling(self, ctx: Any, batch_size: int, penalty_window: int | None) -> None:
        """Take over `ctx` (a context holding `batch_size` sequences) and start the worker.
        `penalty_window`: the tokens penalties look back over; None for the whole sequence."""
        import llama_cpp

        lc = self._lc = llama_cpp
        self._ctx = ctx
        self.batch_size = batch_size
        self.n_ctx = lc.llama_n_ctx(ctx.ctx)
        self.n_ctx_seq = lc.llama_n_ctx_seq(ctx.ctx)  # each sequence's part
        self._n_batch = lc.llama_n_batch(ctx.ctx)
        self._memory = lc.llama_get_memory(ctx.ctx)
        self._batch = lc.llama_batch_init(self._n_batch, 0, 1)
        self._embd_batch: Any = None  # for image embeddings, made on the first image
        # What an image embedding row holds: the width of the model's input embeddings.
        self._n_embd = lc.llama_model_n_embd_inp(lc.llama_get_model(ctx.ctx))
        self._sampling = Sampling(ctx.ctx, self.vocab, penalty_window or self.n_ctx_seq)
        # Two batches' worth, so a finished sequence's place is taken at once.
        self.max_in_flight = 2 * batch_size
        self._free_seqs = list(range(batch_size))  # least recently used first
        # The tokens whose KV cells a free sequence still holds from its last request.
        self._cached: list[list[int]] = [[] for _ in range(batch_size)]
        self.prompt_tokens_reused = 0  # prompt tokens not decoded again, thanks to the cache
        self._prefilling: list[RequestState] = []
        self._generating: list[Row] = []
        self.most_in_flight = 0  # the most sequences decoded in one step so far
        self._start_worker("lmpress-llamacpp")

    def _close_context(self) -> None:
        """Free the context and the batch; the worker has stopped."""
        self._lc.llama_batch_free(self._batch)
        if self._embd_batch is not None:
            self._lc.llama_batch_free(self._embd_batch)
        self._ctx.close()

    def sequences_in_flight(self) -> int:
        """Sequences holding a slot in the KV cache right now (0 when idle)."""
        return self.batch_size - len(self._free_seqs)

    def kv_cells_used(self) -> int:
        """Positions held in the KV cache, summed over sequences and read from llama.cpp
        itself (0 when nothing is cached)."""
        lc = self._lc
        return sum(
            lc.llama_memory_seq_pos_max(self._memory, seq) + 1 for seq in range(self.batch_size)
        )

    def _run(self) -> None:
        try:
            while True:
                with self._wakeup:
                    while not (self._pending or self._busy() or self._closed):
                        self._wakeup.wait()
                    if self._closed:
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
        for state in [s for s in self._pending if s.cancelled]:
            self._pending.remove(state)
        for state in [s for s in self._prefilling if s.cancelled]:
            self._prefilling.remove(state)
            self._release(state)
        for row in [r for r in self._generating if r.state.cancelled]:
            row.finish_reason = "cancelled"
            self._finish_row(row)

    def _admit(self) -> None:
        """Start waiting requests, oldest first, while sequences are free."""
        starting = []
        free = len(self._free_seqs)
        while self._pending and self._pending[0].request.params.n <= free:
            starting.append(self._pending.popleft())
            free -= starting[-1].request.params.n
        for state, seqs in self._take_seqs(starting):
            params = state.request.params
            # A row ends when its part of the KV cache is full.
            limit = min(params.max_new_tokens, self.n_ctx_seq - len(state.prompt_ids))
            state.fed = self._keep_prefix(state.prompt_ids, seqs)
            self.prompt_tokens_reused += state.fed
            state.rows = [Row(state, i, seq, limit) for i, seq in enumerate(seqs)]
            if state.matcher is not None:
                for row in state.rows:
                    row.matcher = state.matcher.copy()
            try:
                for row in state.rows:
                    row.sampler = self._sampling.chain(
                        params, row.index, text_ids(state.prompt_ids), state.logit_bias
                    )
            except Exception as exc:  # this request's settings, not the engine, are at fault
                self._release(state)
                info = failure_info(exc)
                state.deliver(error_result(state.request, self, info, state.started))
                continue
            self._prefilling.append(state)

    def _take_seqs(self, states: list[RequestState]) -> list[tuple[RequestState, list[int]]]:
        """Free sequences for requests starting together, `n` each. A request takes the free
        sequence whose cached tokens share the longest prefix with its prompt, if that is at
        least KEPT_PREFIX tokens (a shared system prompt, an earlier turn of the same
        conversation: see `_keep_prefix`). The others take the least recently used ones,
        shorter prompts the lower ids: prompts read together then stop in id order, so the
        prompts still being read form one run of ids, which llama.cpp reads in one
        micro-batch (see `_step`)."""
        taken, rest = [], []
        for state in states:
            best, kept = None, KEPT_PREFIX - 1
            for seq in self._free_seqs:
                common = common_prefix(self._cached[seq], state.prompt_ids)
                if common > kept:
                    best, kept = seq, common
            if best is None:
                rest.append(state)
            else:
                self._free_seqs.remove(best)
                taken.append((state, [best]))
        for state, seqs in taken:  # the other samples' sequences
            seqs += [self._free_seqs.pop(0) for _ in range(state.request.params.n - 1)]
        pool = sorted(
            self._free_seqs.pop(0) for state in rest for _ in range(state.request.params.n)
        )
        for state in sorted(rest, key=lambda state: len(state.prompt_ids)):
            n = state.request.params.n
            taken.append((state, pool[:n]))
            del pool[:n]
        return taken

    def _keep_prefix(self, prompt: list[int], seqs: list[int]) -> int:
        """Clear a request's sequences but for the part of the first one's cached tokens that
        begins its prompt (all but the prompt's last token at most, whose logits are needed),
        which is not decoded again; how many tokens that is."""
        first = seqs[0]
        reused = min(common_prefix(self._cached[first], prompt), len(prompt) - 1)
        lc = self._lc
        lc.llama_memory_seq_rm(self._memory, first, reused, -1)
        for seq in seqs[1:]:  # filled from the first one's cells once the prompt is read
            lc.llama_memory_seq_rm(self._memory, seq, -1, -1)
        for seq in seqs:
            self._cached[seq] = []
        return reused

    def kv_cells_cached(self) -> int:
        """Positions that free sequences keep for reuse (see `_take_seqs`)."""
        return sum(len(self._cached[seq]) for seq in self._free_seqs)

    def _step(self) -> None:
        """One batch for every sequence in flight: the next token of each one being generated
        and the next chunk of each prompt being read (an image's chunk goes in a batch of its
        own first). Over a split KV cache llama.cpp cuts a batch into micro-batches of runs of
        consecutive sequence ids, each a pass over all the weights: in sequence-id order, the
        prompts being read fill the gaps between the rows being generated instead of making
        more of them."""
        reading = []
        for state in sorted(self._prefilling, key=lambda s: s.rows[0].seq_id):
            image = next((m for m in state.media or () if m.start <= state.fed < m.end), None)
            if image is None:
                reading.append(state)
                continue
            count = self._decode_image(state, image)
            state.fed += count
            if state.fed == len(state.prompt_ids):
                self._start_generating(state, count - 1)
        rows = list(self._generating)
        self.most_in_flight = max(self.most_in_flight, len(rows))
        chunks = self._prompt_chunks(reading, self._n_batch - len(rows))
        parts = sorted(rows + chunks, key=lambda part: part.seq_id)
        n = 0
        for part in parts:
            if isinstance(part, Row):
                self._put(n, part.next_token, part.pos, part.seq_id, True)
                part.pos += 1
                n += 1
            else:
                ids, last = part.state.prompt_ids, part.end == len(part.state.prompt_ids)
                for pos in range(part.state.fed, part.end):
                    self._put(n, ids[pos], pos, part.seq_id, last and pos == part.end - 1)
                    n += 1
            part.batch_index = n - 1  # where its logits are
        if n == 0:
            return
        self._decode(n)
        for part in parts:
            if isinstance(part, Row):
                self._sample(part, part.batch_index)
            else:
                part.state.fed = part.end
                if part.end == len(part.state.prompt_ids):
                    self._start_generating(part.state, part.batch_index)

    def _prompt_chunks(self, states: list[RequestState], room: int) -> list[PromptChunk]:
        """The next chunk of each prompt's text tokens (up to its next image, if any) that
        `room` tokens of this step's batch hold: one pass over the weights reads many prompts,
        as llama-server packs its slots'. Each chunk is at most PROMPT_CHUNK tokens, whatever
        the batch size, so a prompt is read the same way alone or beside others, and the
        prompts share the room equally."""
        share = min(PROMPT_CHUNK, max(1, room // max(1, len(states))))
        chunks = []
        for state in states:
            images = [m.start for m in state.media or () if m.start > state.fed]
            end = min([state.fed + min(share, room), len(state.prompt_ids), *images])
            if end == state.fed:
                break
            room -= end - state.fed
            chunks.append(PromptChunk(state, state.rows[0].seq_id, end))
        return chunks

    def _decode_image(self, state: RequestState, image: ImageSegment) -> int:
        """The next chunk of an image's embeddings (encoded when the prefill first reaches
        it), decoded into the row's sequence in a batch of its own."""
        lc, projector = self._lc, self.projector
        if image.embeddings is None:
            image.embeddings = projector.encode(image, self._n_embd)
        if self._embd_batch is None:
            self._embd_batch = lc.llama_batch_init(self._n_batch, self._n_embd, 1)
        batch, offset = self._embd_batch, state.fed - image.start
        rows = image.embeddings[offset : offset + self._n_batch]
        last = state.fed + len(rows) == len(state.prompt_ids)
        ctypes.memmove(batch.embd, rows.ctypes.data, rows.nbytes)
        for j in range(len(rows)):
            batch.pos[j] = state.fed + j
            batch.n_seq_id[j] = 1
            batch.seq_id[j][0] = state.rows[0].seq_id
            batch.logits[j] = last and j == len(rows) - 1
        batch.n_tokens = len(rows)
        if image.non_causal:  # the image's tokens see each other both ways
            lc.llama_set_causal_attn(self._ctx.ctx, False)
        try:
            code = lc.llama_decode(self._ctx.ctx, batch)
        finally:
            if image.non_causal:
                lc.llama_set_causal_attn(self._ctx.ctx, True)
        if code != 0:
            raise RuntimeError(f"llama_decode returned {code} on an image")
        return len(rows)

    def _put(self, i: int, token: int, pos: int, seq: int, logits: bool) -> None:
        batch = self._batch
        batch.token[i] = token
        batch.pos[i] = pos
        batch.n_seq_id[i] = 1
        batch.seq_id[i][0] = seq
        batch.logits[i] = logits

    def _decode(self, n_tokens: int) -> None:
        self._batch.n_tokens = n_tokens
        code = self._lc.llama_decode(self._ctx.ctx, self._batch)
        if code != 0:
            raise RuntimeError(f"llama_decode returned {code}")

    def _start_generating(self, state: RequestState, index: int) -> None:
        """The prompt is in the KV cache: every sample samples its first token from the
        prompt's last logits and joins the sequences being generated."""
        self._prefilling.remove(state)
        first = state.rows[0].seq_id
        for row in state.rows:
            if row.seq_id != first:  # the other samples share the prompt's KV cells
                self._lc.llama_memory_seq_cp(self._memory, first, row.seq_id, -1, -1)
            row.pos = len(state.prompt_ids)
            self._generating.append(row)
        for row in state.rows:
            self._sample(row, index)

    def _sample(self, row: Row, index: int) -> None:
        params = row.params
        wants_logprobs = row.logprobs is not None
        token, logprob = self._sampling.pick(
            row.sampler, params, row.generated, index, wants_logprobs, row.matcher
        )
        row.generated += 1
        if self.vocab.is_end(token) or token in params.stop_token_ids:
            row.finish_reason = "stop"
        else:
            row.tokens.append(token)
            if logprob is not None:
                row.logprobs.append(logprob)
            if row.matcher is not None:
                row.matcher.accept(token)
                if row.matcher.complete:  # nothing but the end can follow: end here
                    row.finish_reason = "stop"
            piece = self.vocab.piece(token, special=not params.skip_special_tokens)
            row.text += row.decoder.decode(piece)
            if params.stop_strings:
                row.cut_at_stop_string()
            if row.finish_reason is None and row.generated >= row.limit:
                row.finish_reason = "length"
        if row.finish_reason is None:
            row.next_token = token
            row.stream_text()
        else:
            self._finish_row(row)

    def _finish_row(self, row: Row) -> None:
        lc = self._lc
        state = row.state
        if row in self._generating:
            self._generating.remove(row)
        if row.finish_reason == "cancelled":
            lc.llama_memory_seq_rm(self._memory, row.seq_id, -1, -1)
        else:  # kept for a later request that starts the same way
            fed = row.tokens[: row.pos - len(state.prompt_ids)]
            self._cached[row.seq_id] = state.prompt_ids + fed
        self._free_seqs.append(row.seq_id)
        self._sampling.free(row.sampler)
        row.sampler = None
        row.text += row.decoder.decode(b"", final=True)
        row.stream_text()
        if all(r.finish_reason is not None for r in state.rows) and not state.cancelled:
            state.deliver(self._result(state))

    def _release(self, state: RequestState) -> None:
        """Free the sequences a request still holds (it was cancelled or failed)."""
        for row in state.rows:
            if row.finish_reason is not None:
                continue  # already freed by _finish_row
            row.finish_reason = "cancelled" if state.cancelled else "error"
            self._lc.llama_memory_seq_rm(self._memory, row.seq_id, -1, -1)
            self._free_seqs.append(row.seq_id)
            if row.sampler is not None:
                self._sampling.free(row.sampler)
                row.sampler = None

    def _fail_all(self, error: ErrorInfo) -> None:
        states = list(self._prefilling) + [r.state for r in self._generating]
        self._prefilling.clear()
        self._generating.clear()
        for state in dict.fromkeys(states):
            self._release(state)
            state.deliver(error_result(state.request, self, error, state.started))

    def _shutdown(self) -> None:
        with self._wakeup:
            self._closed = True
            waiting = list(self._pending)
            self._pending.clear()
        self._fail_all(ErrorInfo(ErrorKind.ENGINE_CLOSED, "the LLAMACPP engine was closed"))
        for state in waiting:
            info = ErrorInfo(ErrorKind.ENGINE_CLOSED, "the LLAMACPP engine was closed")
            state.deliver(error_result(state.request, self, info, state.started))

    def _result(self, state: RequestState) -> Result:
        samples = [
            Sample(
                text=row.text,
                finish_reason=row.finish_reason or "length",
                logprobs=row.logprobs,
                completion_tokens=row.generated,
            )
            for row in state.rows
        ]
        return Result(
            request_id=state.request.id,
            samples=samples,
            usage=Usage(len(state.prompt_ids), sum(row.generated for row in state.rows)),
            model=self.model_name,
            engine=self.name,
            latency_s=time.perf_counter() - state.started,
        )
