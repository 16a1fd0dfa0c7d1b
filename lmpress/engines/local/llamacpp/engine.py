"""LLAMACPP: GGUF models through llama-cpp-python, many sequences decoded together.

llama-cpp-python's `Llama` loads the model (every `model.model_kwargs` key must be one of its
constructor's parameters: it ignores unknown ones, lmpress refuses them) and gives the
tokenizer and the GGUF metadata. Generation does not go through `Llama`, which decodes one
sequence at a time. A worker thread owns a llama.cpp context whose KV cache holds up to
`generation.batch_size` sequences and runs continuous batching on it: each step decodes one
token of every sequence being generated in one `llama_batch` (and the next chunk of each newly
admitted prompt in a batch of its own); each sequence samples from its own sampler chain (seeded
per row); a finished sequence's place goes to the next waiting request at once. Its KV cells
stay until then: a request whose prompt begins like a free sequence's last prompt and reply
(the same system prompt, the next turn of a chat) takes that sequence and reads only the rest.

`model_kwargs.n_ctx` (default: the model's own context length) is the size of the KV cache, and
each of the `batch_size` sequences gets an equal part of it (a multiple of 256, at least 256),
as llama-server's `-c` and `-np` do. Each sequence attends only to its own part, so a step costs
the same whatever the others hold, and what else is in flight moves a sequence's logits only by
llama.cpp's rounding at different batch shapes (about 1e-6): greedy replies do not depend on the
batch size, short of a near-exact tie between two tokens.
"""

from __future__ import annotations

import codecs
import ctypes
import difflib
import inspect
import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lmpress.configs.schema import ModelParams, RunConfig
from lmpress.engines.base import check_token_settings, error_result
from lmpress.engines.common.prompts import resolve_chat_template
from lmpress.engines.local.worker import Submission, WorkerEngine, failure_info
from lmpress.errors import ConfigError, ModelLoadError, RequestError
from lmpress.packaged import resolve_packaged_name
from lmpress.tinygguf import resolve_gguf_name
from lmpress.types import (
    Delta,
    ErrorInfo,
    GenerationParams,
    Request,
    Result,
    Sample,
    TokenLogprob,
    Usage,
)

GGUF_MAGIC = b"GGUF"

# `Llama` parameters that mean nothing here, with what to do instead.
REFUSED_KWARGS = {
    "model_path": "set model.model_name instead",
    "seed": "set generation.seed instead (lmpress seeds every row)",
    "chat_format": "set model.chat_template instead (a Jinja template, a file, or 'chatml')",
    "chat_handler": "set model.chat_template instead",
    "tokenizer": "lmpress uses the GGUF file's own tokenizer",
    "draft_model": "speculative decoding is not supported by the LLAMACPP engine",
    "embedding": "the LLAMACPP engine generates text; it does not compute embeddings",
    "vocab_only": "the LLAMACPP engine needs the model's weights",
    "logits_all": "not needed: generation.logprobs works without it",
    "lora_path": "LoRA adapters are not supported by the LLAMACPP engine yet; merge the adapter "
    "into the GGUF file (llama.cpp's llama-export-lora)",
    "lora_base": "LoRA adapters are not supported by the LLAMACPP engine yet",
    "lora_scale": "LoRA adapters are not supported by the LLAMACPP engine yet",
    "spm_infill": "infill is not supported by the LLAMACPP engine",
}


class LlamaCppEngine(WorkerEngine):
    name = "LLAMACPP"
    supported_params = frozenset({
        "max_new_tokens", "temperature", "top_p", "top_k", "min_p", "repetition_penalty",
        "presence_penalty", "frequency_penalty", "stop_strings", "stop_token_ids", "min_tokens",
        "seed", "n", "logprobs", "top_logprobs", "logit_bias", "skip_special_tokens",
    })  # fmt: skip

    def __init__(self, config: RunConfig):
        super().__init__(config)
        import llama_cpp

        self._lc = llama_cpp
        if not config.model.load_pretrained_weights:
            raise ConfigError(
                "model.load_pretrained_weights: false: LLAMACPP reads its weights from the GGUF "
                "file; random weights need the NATIVE or VLLM engine"
            )
        self.path = gguf_path(oumi_gguf_file(config.model) or config.model.model_name)
        model_kwargs = {k: v for k, v in config.model.model_kwargs.items() if k != "filename"}
        kwargs = check_model_kwargs(model_kwargs, llama_cpp.Llama)
        kwargs.setdefault("verbose", False)
        kwargs.setdefault("n_ctx", 0)  # 0: the model's own context length
        extra_bufts = kwargs.pop("use_extra_bufts", None)
        try:
            self.llama = load_llama(self.path, kwargs, extra_bufts=extra_bufts)
        except Exception as exc:
            raise ModelLoadError(f"cannot load GGUF model '{self.path}': {exc}") from exc
        self.vocab = llama_cpp.llama_model_get_vocab(self.llama.model)
        self.n_vocab = self.llama.n_vocab()
        self.metadata: dict[str, str] = dict(self.llama.metadata)
        self.chat_template = _chat_template(config, self.metadata)
        self._formatter = None
        # The penalty window: the whole sequence unless the recipe says otherwise.
        self._penalty_window = kwargs.get("last_n_tokens_size")
        self.batch_size = min(
            config.generation.batch_size, llama_cpp.llama_max_parallel_sequences()
        )
        self._ctx = self._batched_context(kwargs)
        self.n_ctx = llama_cpp.llama_n_ctx(self._ctx.ctx)
        self.n_ctx_seq = llama_cpp.llama_n_ctx_seq(self._ctx.ctx)  # each sequence's part
        self._n_batch = llama_cpp.llama_n_batch(self._ctx.ctx)
        self._memory = llama_cpp.llama_get_memory(self._ctx.ctx)
        self._batch = llama_cpp.llama_batch_init(self._n_batch, 0, 1)
        self._piece = ctypes.create_string_buffer(256)
        self._eog_ids: list[int] | None = None  # filled on first use (min_tokens)
        # Two batches' worth, so a finished sequence's place is taken at once.
        self.max_in_flight = 2 * self.batch_size
        self._free_seqs = list(range(self.batch_size))  # least recently used first
        # The tokens whose KV cells a free sequence still holds from its last request.
        self._cached: list[list[int]] = [[] for _ in range(self.batch_size)]
        self.prompt_tokens_reused = 0  # prompt tokens not decoded again, thanks to the cache
        self._prefilling: list[_RequestState] = []
        self._generating: list[_Row] = []
        self.most_in_flight = 0  # the most sequences decoded in one step so far
        self._start_worker("lmpress-llamacpp")

    def _batched_context(self, kwargs: dict[str, Any]) -> Any:
        """A context like the one `Llama` made from the recipe's kwargs, but holding
        `batch_size` sequences, each in its own part of the KV cache. `Llama`'s own
        single-sequence context is freed first so that the KV memory is not held twice."""
        from llama_cpp import _internals

        lc = self._lc
        params = lc.llama_context_params.from_buffer_copy(self.llama.context_params)
        params.n_ctx = self.llama.n_ctx()
        if self.batch_size > 1:
            # llama.cpp wants an equal part per sequence, a multiple of 256; ask for that
            # rather than let it round (and warn).
            part = max(256, params.n_ctx // self.batch_size // 256 * 256)
            params.n_ctx = part * self.batch_size
        params.n_seq_max = self.batch_size
        params.kv_unified = False
        # Every sequence in flight contributes a token to each step's batch.
        params.n_batch = max(params.n_batch, self.batch_size)
        params.n_ubatch = max(params.n_ubatch, self.batch_size)
        if "flash_attn" not in kwargs:
            # llama.cpp's own default (llama-cpp-python turns it off): faster on CPU too.
            params.flash_attn_type = lc.LLAMA_FLASH_ATTN_TYPE_AUTO
        self.llama._ctx.close()
        try:
            return _internals.LlamaContext(
                model=self.llama._model, params=params, verbose=bool(kwargs["verbose"])
            )
        except Exception as exc:
            raise ModelLoadError(
                f"cannot create a llama.cpp context for '{self.path}': {exc}"
            ) from exc

    # --- the interface ---------------------------------------------------------------------

    async def aclose(self) -> None:
        if not await self._stop_worker():
            return
        self._lc.llama_batch_free(self._batch)
        self._ctx.close()
        self.llama.close()

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

    # --- prompts ---------------------------------------------------------------------------

    def render(self, request: Request) -> str:
        """The chat template applied to a request's messages, as llama-cpp-python renders it."""
        if self._formatter is None:
            from llama_cpp.llama_chat_format import Jinja2ChatFormatter

            eos = self.llama.token_eos()
            self._formatter = Jinja2ChatFormatter(
                template=self.chat_template,
                eos_token=self._token_text(eos),
                bos_token=self._token_text(self.llama.token_bos()),
                stop_token_ids=[eos],
            )
        messages = [{"role": m.role, "content": m.text()} for m in request.messages]
        try:
            return self._formatter(messages=messages).prompt
        except Exception as exc:  # Jinja raises its own errors for refused conversations
            raise RequestError(f"chat template failed: {exc}", kind="invalid_request") from exc

    def encode(self, request: Request) -> list[int]:
        """The prompt's token ids: the chat template applied, or the raw prompt."""
        if request.prompt is not None:
            ids = self.llama.tokenize(request.prompt.encode("utf-8"), add_bos=True, special=True)
        else:
            if any(m.has_images() for m in request.messages):
                raise RequestError(
                    "the LLAMACPP engine in lmpress sends text only; this row has image parts",
                    kind="invalid_request",
                )
            if not self.chat_template:
                raise RequestError(
                    f"model '{self.model_name}' has no chat template in its GGUF metadata; set "
                    f"model.chat_template (a Jinja string, a template file, or 'chatml')",
                    kind="invalid_request",
                )
            # As llama-cpp-python's chat handler does: the template emits BOS itself.
            text = self.render(request)
            ids = self.llama.tokenize(text.encode("utf-8"), add_bos=False, special=True)
        if not ids:
            raise RequestError("the prompt is empty", kind="invalid_request")
        if len(ids) >= self.n_ctx_seq:
            raise RequestError(
                f"prompt is {len(ids)} tokens, the context of a sequence is {self.n_ctx_seq} "
                f"(model.model_kwargs.n_ctx {self.n_ctx} shared by generation.batch_size "
                f"{self.batch_size}): raise n_ctx or lower batch_size",
                kind="context_length_exceeded",
            )
        return list(ids)

    def _token_text(self, token: int) -> str:
        if token < 0:
            return ""
        return self._lc.llama_vocab_get_text(self.vocab, token).decode("utf-8", errors="replace")

    def _piece_bytes(self, token: int, special: bool) -> bytes:
        n = self._lc.llama_token_to_piece(
            self.vocab, token, self._piece, len(self._piece), 0, special
        )
        if n < 0:  # longer than the buffer: grow it and ask again
            self._piece = ctypes.create_string_buffer(-n)
            n = self._lc.llama_token_to_piece(self.vocab, token, self._piece, -n, 0, special)
        return self._piece.raw[:n]

    # --- checking a request before it is queued -------------------------------------------

    def _prepare(self, request: Request, started: float) -> _RequestState:
        prompt_ids = self.encode(request)
        logit_bias = self._logit_bias(request.params)
        check_token_settings(request.params, self.n_vocab)
        self._check_fits(request.params)
        return _RequestState(request, prompt_ids, started, logit_bias=logit_bias)

    def _logit_bias(self, params: GenerationParams) -> list[tuple[int, float]]:
        bias = []
        for key, value in params.logit_bias.items():
            try:
                token = int(key)
            except ValueError:
                token = -1
            if not 0 <= token < self.n_vocab:
                raise RequestError(
                    f"generation.logit_bias: '{key}' is not a token id of this model "
                    f"(0 to {self.n_vocab - 1})",
                    kind="invalid_request",
                )
            bias.append((token, float(value)))
        return bias

    def _check_fits(self, params: GenerationParams) -> None:
        if params.n > self.batch_size:
            raise RequestError(
                f"generation.n is {params.n} but generation.batch_size is {self.batch_size}: "
                f"each sample is a sequence in flight; raise batch_size to at least n",
                kind="invalid_request",
            )

    # --- the worker thread -----------------------------------------------------------------

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
        while self._pending:
            state = self._pending[0]
            params = state.request.params
            n = params.n
            if len(self._free_seqs) < n:
                return
            self._pending.popleft()
            # A row ends when its part of the KV cache is full.
            limit = min(params.max_new_tokens, self.n_ctx_seq - len(state.prompt_ids))
            seqs, state.fed = self._take_seqs(state.prompt_ids, n)
            self.prompt_tokens_reused += state.fed
            state.rows = [_Row(state, i, seq, limit) for i, seq in enumerate(seqs)]
            try:
                for row in state.rows:
                    row.sampler = self._sampler_chain(state, row)
            except Exception as exc:  # this request's settings, not the engine, are at fault
                self._release(state)
                info = failure_info(exc)
                state.deliver(error_result(state.request, self, info, state.started))
                continue
            self._prefilling.append(state)

    def _take_seqs(self, prompt: list[int], n: int) -> tuple[list[int], int]:
        """`n` free sequences for a request, and how many of its prompt tokens are already in
        the first one's KV cells: the free sequence whose cached tokens share the longest
        prefix with the prompt keeps that prefix (all but the prompt's last token at most,
        whose logits are needed), so a shared system prompt or an earlier turn of the same
        conversation is not decoded again. Otherwise the least recently used one is taken."""
        first, reused = self._free_seqs[0], 0
        for seq in self._free_seqs:
            common = _common_prefix(self._cached[seq], prompt)
            if common > reused:
                first, reused = seq, common
        reused = min(reused, len(prompt) - 1)
        self._free_seqs.remove(first)
        seqs = [first] + [self._free_seqs.pop(0) for _ in range(n - 1)]
        lc = self._lc
        lc.llama_memory_seq_rm(self._memory, first, reused, -1)
        for seq in seqs[1:]:  # filled from the first one's cells once the prompt is read
            lc.llama_memory_seq_rm(self._memory, seq, -1, -1)
        for seq in seqs:
            self._cached[seq] = []
        return seqs, reused

    def kv_cells_cached(self) -> int:
        """Positions that free sequences keep for reuse (see `_take_seqs`)."""
        return sum(len(self._cached[seq]) for seq in self._free_seqs)

    def _step(self) -> None:
        """One token for every sequence being generated, in one batch; then the next chunk of
        each prompt being read, each in a batch of its own. Keeping prompts apart gives every
        prompt the same computation whatever else is in flight (llama.cpp picks its kernels by
        batch shape, and a prompt mixed with others would round differently), which is what
        keeps greedy replies identical at any batch size."""
        rows = list(self._generating)
        if rows:
            self.most_in_flight = max(self.most_in_flight, len(rows))
            for i, row in enumerate(rows):
                self._put(i, row.next_token, row.pos, row.seq_id, True)
                row.pos += 1
            self._decode(len(rows))
            for i, row in enumerate(rows):
                self._sample(row, i)
        for state in list(self._prefilling):
            chunk = state.prompt_ids[state.fed : state.fed + self._n_batch]
            seq = state.rows[0].seq_id
            last = state.fed + len(chunk) == len(state.prompt_ids)
            for j, token in enumerate(chunk):
                self._put(j, token, state.fed + j, seq, last and j == len(chunk) - 1)
            self._decode(len(chunk))
            state.fed += len(chunk)
            if last:
                self._start_generating(state, len(chunk) - 1)

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

    def _start_generating(self, state: _RequestState, index: int) -> None:
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

    def _sample(self, row: _Row, index: int) -> None:
        lc = self._lc
        params = row.params
        if row.generated < params.min_tokens:
            self._forbid_end(row, index)
        distribution = self._logprobs(row, index) if row.logprobs is not None else None
        token = lc.llama_sampler_sample(row.sampler, self._ctx.ctx, index)
        row.generated += 1
        if lc.llama_vocab_is_eog(self.vocab, token) or token in params.stop_token_ids:
            row.finish_reason = "stop"
        else:
            row.tokens.append(token)
            if distribution is not None:
                logprobs, top = distribution
                text = self._token_string(token, params)
                row.logprobs.append(TokenLogprob(text, float(logprobs[token]), top))
            piece = self._piece_bytes(token, special=not params.skip_special_tokens)
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

    def _forbid_end(self, row: _Row, index: int) -> None:
        """min_tokens: end-of-generation tokens cannot be picked yet."""
        if self._eog_ids is None:
            is_eog = self._lc.llama_vocab_is_eog
            self._eog_ids = [t for t in range(self.n_vocab) if is_eog(self.vocab, t)]
        logits = self._lc.llama_get_logits_ith(self._ctx.ctx, index)
        for token in (*self._eog_ids, *row.params.stop_token_ids):
            logits[token] = float("-inf")

    def _logprobs(self, row: _Row, index: int) -> tuple[Any, list[tuple[str, float]]]:
        """Log-probabilities of every token under the model's distribution (before
        temperature, top-k/p and penalties), and the row's `top_logprobs` most likely ones."""
        import numpy as np

        pointer = self._lc.llama_get_logits_ith(self._ctx.ctx, index)
        logits = np.ctypeslib.as_array(pointer, shape=(self.n_vocab,)).astype(np.float64)
        top = logits.max()
        logprobs = logits - (top + np.log(np.exp(logits - top).sum()))
        k = row.params.top_logprobs
        best = []
        if k:
            ids = np.argpartition(-logprobs, k - 1)[:k]
            ids = ids[np.argsort(-logprobs[ids], kind="stable")]
            best = [(self._token_string(int(t), row.params), float(logprobs[t])) for t in ids]
        return logprobs, best

    def _token_string(self, token: int, params: GenerationParams) -> str:
        piece = self._piece_bytes(token, special=not params.skip_special_tokens)
        return piece.decode("utf-8", errors="replace")

    def _finish_row(self, row: _Row) -> None:
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
        lc.llama_sampler_free(row.sampler)
        row.sampler = None
        row.text += row.decoder.decode(b"", final=True)
        row.stream_text()
        if all(r.finish_reason is not None for r in state.rows) and not state.cancelled:
            state.deliver(self._result(state))

    def _release(self, state: _RequestState) -> None:
        """Free the sequences a request still holds (it was cancelled or failed)."""
        for row in state.rows:
            if row.finish_reason is not None:
                continue  # already freed by _finish_row
            row.finish_reason = "cancelled" if state.cancelled else "error"
            self._lc.llama_memory_seq_rm(self._memory, row.seq_id, -1, -1)
            self._free_seqs.append(row.seq_id)
            if row.sampler is not None:
                self._lc.llama_sampler_free(row.sampler)
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
        self._fail_all(ErrorInfo("engine_closed", "the LLAMACPP engine was closed"))
        for state in waiting:
            info = ErrorInfo("engine_closed", "the LLAMACPP engine was closed")
            state.deliver(error_result(state.request, self, info, state.started))

    def _result(self, state: _RequestState) -> Result:
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

    # --- sampling settings -------------------------------------------------------------------

    def _sampler_chain(self, state: _RequestState, row: _Row) -> Any:
        """One llama.cpp sampler chain per sequence, so every row keeps its own settings,
        penalty history and random state (seeded per row: the same seed gives the same
        tokens whatever else is in flight)."""
        lc = self._lc
        params = row.params
        chain = lc.llama_sampler_chain_init(lc.llama_sampler_chain_default_params())
        if state.logit_bias:
            array = (lc.llama_logit_bias * len(state.logit_bias))(*state.logit_bias)
            lc.llama_sampler_chain_add(
                chain, lc.llama_sampler_init_logit_bias(self.n_vocab, len(array), array)
            )
        window = self._penalty_window or self.n_ctx_seq
        if params.repetition_penalty != 1:
            # Repetition counts the prompt too, as transformers does.
            repeat = lc.llama_sampler_init_penalties(
                self.n_vocab, window, params.repetition_penalty, 0.0, 0.0
            )
            for token in state.prompt_ids[-window:]:
                lc.llama_sampler_accept(repeat, token)
            lc.llama_sampler_chain_add(chain, repeat)
        if params.presence_penalty or params.frequency_penalty:
            # Presence and frequency count generated tokens only, as OpenAI's API does.
            lc.llama_sampler_chain_add(
                chain,
                lc.llama_sampler_init_penalties(
                    self.n_vocab, window, 1.0, params.frequency_penalty, params.presence_penalty
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
        lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_dist(_row_seed(params, row.index)))
        return chain


def _common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens two token lists share. Found by bisection with list slices
    compared in C: admitting a row against every free sequence's cache stays in microseconds
    even when they share a long system prompt."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:  # the longest k with a[:k] == b[:k] lies in [lo, hi]
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _row_seed(params: GenerationParams, index: int) -> int:
    seed = params.seed if params.seed is not None else random.SystemRandom().randrange(2**32)
    # llama.cpp reads 0xFFFFFFFF as "pick a random seed".
    return (seed + index) % 0xFFFFFFFF


# --- per-request and per-row state ---------------------------------------------------------


@dataclass(eq=False)
class _RequestState(Submission):
    logit_bias: list[tuple[int, float]] = field(default_factory=list)
    rows: list[_Row] = field(default_factory=list)
    fed: int = 0  # prompt tokens already decoded


@dataclass(eq=False)
class _Row:
    """One sequence in the KV cache: one sample of one request."""

    state: _RequestState
    index: int
    seq_id: int
    limit: int  # tokens this row may generate
    sampler: Any = None
    pos: int = 0  # tokens of this sequence in the KV cache
    next_token: int = -1  # sampled, to be decoded at the next step
    tokens: list[int] = field(default_factory=list)  # generated, end tokens left out
    generated: int = 0  # tokens generated, end tokens included
    text: str = ""
    emitted: int = 0  # characters already sent as deltas
    finish_reason: str | None = None
    # An incremental decoder keeps a character split across tokens until it is whole.
    decoder: Any = field(default_factory=lambda: codecs.getincrementaldecoder("utf-8")("replace"))
    logprobs: list[TokenLogprob] | None = None

    def __post_init__(self) -> None:
        if self.params.logprobs:
            self.logprobs = []

    @property
    def params(self) -> GenerationParams:
        return self.state.request.params

    def cut_at_stop_string(self) -> None:
        hits = [i for i in (self.text.find(s) for s in self.params.stop_strings) if i >= 0]
        if hits:
            self.text = self.text[: min(hits)]
            self.finish_reason = "stop"
            self.decoder.reset()  # bytes after the stop string are not part of the reply

    def stream_text(self) -> None:
        if not self.state.wants_deltas or self.state.cancelled:
            return
        end = len(self.text)
        if self.finish_reason is None and self.params.stop_strings:
            # Hold back what may be the beginning of a stop string.
            end -= max(len(s) for s in self.params.stop_strings) - 1
        if end > self.emitted:
            self.state.deliver(
                Delta(self.state.request.id, self.text[self.emitted : end], self.index)
            )
            self.emitted = end


# --- loading ---------------------------------------------------------------------------------


def gguf_path(name: str) -> str:
    """The local GGUF file `model.model_name` names, checked to exist and to be GGUF."""
    if not name:
        raise ModelLoadError("model.model_name is empty; give the path of a .gguf file")
    path = Path(resolve_gguf_name(resolve_packaged_name(name))).expanduser()
    if path.is_dir():
        ggufs = sorted(p.name for p in path.glob("*.gguf"))
        hint = f" (it holds {', '.join(ggufs[:3])})" if ggufs else ""
        raise ModelLoadError(
            f"model.model_name: '{name}' is a directory; give the path of a .gguf file{hint}"
        )
    if not path.is_file():
        raise ModelLoadError(
            f"model.model_name: '{name}' does not exist; the LLAMACPP engine loads a local "
            f".gguf file (it downloads nothing)"
        )
    with path.open("rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise ModelLoadError(
            f"model.model_name: '{name}' is not a GGUF file; convert the model with llama.cpp's "
            f"convert_hf_to_gguf.py, or use an engine that reads this format"
        )
    return str(path)


def oumi_gguf_file(model: ModelParams) -> str | None:
    """Oumi's form: `model_name` a hub repo or a directory, `model_kwargs.filename` the GGUF
    file in it. A directory is joined with the file name; a repo is looked up in the Hugging
    Face cache, since LLAMACPP downloads nothing. None when no filename is given."""
    filename = model.model_kwargs.get("filename")
    if filename is None:
        return None
    if not isinstance(filename, str) or not filename:
        raise ModelLoadError("model.model_kwargs.filename: give the GGUF file's name")
    directory = Path(model.model_name).expanduser()
    if directory.is_dir():
        return str(directory / filename)
    from huggingface_hub import try_to_load_from_cache

    try:
        cached = try_to_load_from_cache(model.model_name, filename, revision=model.model_revision)
    except Exception:  # not a repo id either (a path that does not exist)
        cached = None
    if isinstance(cached, str):
        return cached
    raise ModelLoadError(
        f"model.model_kwargs.filename: '{filename}' of '{model.model_name}' is neither in a "
        f"local directory nor in the Hugging Face cache; the LLAMACPP engine downloads nothing: "
        f"run `hf download {model.model_name} {filename}` first"
    )


def extra_bufts_are_safe(system_info: str) -> bool:
    """Whether llama.cpp's extra weight buffer types may be used, given its system info line.

    A build with Intel AMX kernels (`AMX_INT8 = 1`: built with native flags on a CPU that has
    AMX) stores quantized weights in an AMX buffer, and decoding a multi-token batch through it
    crashes the process (SIGSEGV in ggml_backend_amx_mul_mat; ggml-org/llama.cpp#20824). Such a
    build loads weights without the extra buffer types. Everywhere else the CPU repack layouts
    (Q4_0, Q4_K, IQ4_NL and Q8_0 weights on AVX2) stay on, as llama.cpp's default.
    """
    return "AMX_INT8 = 1" not in system_info


_LOAD_LOCK = threading.Lock()


def load_llama(path: str, kwargs: dict[str, Any], *, extra_bufts: bool | None = None) -> Any:
    """llama-cpp-python's `Llama` for `path`, its weights in the extra buffer types or not
    (None: as `extra_bufts_are_safe` says for this llama.cpp build).

    `Llama` has no keyword for `llama_model_params.use_extra_bufts`: it starts from
    `llama_model_default_params()` and loads the weights within its constructor. For the
    length of that call its defaults come with the extra buffer types off; the lock keeps two
    loads from overlapping.
    """
    from llama_cpp import Llama, llama_print_system_info
    from llama_cpp import llama as llama_module

    if extra_bufts is None:
        extra_bufts = extra_bufts_are_safe(llama_print_system_info().decode())
    if extra_bufts:
        return Llama(model_path=path, **kwargs)
    low = llama_module.llama_cpp  # the ctypes bindings `Llama` reads its defaults from
    defaults = low.llama_model_default_params

    def without_extra_bufts() -> Any:
        params = defaults()
        params.use_extra_bufts = False
        return params

    with _LOAD_LOCK:
        low.llama_model_default_params = without_extra_bufts
        try:
            return Llama(model_path=path, **kwargs)
        finally:
            low.llama_model_default_params = defaults


def check_model_kwargs(kwargs: dict[str, Any], llama_class: type) -> dict[str, Any]:
    """The recipe's model_kwargs, each checked to be a parameter of `Llama`'s constructor
    (or `use_extra_bufts`: true or false overrides lmpress's choice, see load_llama)."""
    accepted = [
        name
        for name, p in inspect.signature(llama_class.__init__).parameters.items()
        if name != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
    ]
    accepted.append("use_extra_bufts")
    for key in kwargs:
        if key in REFUSED_KWARGS:
            raise ConfigError(f"model.model_kwargs.{key}: {REFUSED_KWARGS[key]}")
        if key not in accepted:
            usable = [name for name in accepted if name not in REFUSED_KWARGS]
            close = difflib.get_close_matches(key, usable, n=1, cutoff=0.6)
            hint = f"did you mean '{close[0]}'?" if close else f"valid keys: {', '.join(usable)}"
            raise ConfigError(
                f"model.model_kwargs.{key}: not a llama-cpp-python Llama parameter; {hint}"
            )
    return dict(kwargs)


def _chat_template(config: RunConfig, metadata: dict[str, str]) -> str | None:
    if config.model.chat_template:
        return resolve_chat_template(config.model.chat_template)
    return metadata.get("tokenizer.chat_template")
