"""What one LLAMACPP step hands llama.cpp: a `llama_batch` of tokens (every row's next token and
chunks of prompts being read) and, for an image, a batch of its embeddings, each decoded into
the context. The scheduler (scheduling.py) decides what goes in a step; `Batches` owns the
buffers and the ctypes writes, so the scheduler reads as policy and this as the C side.
"""

from __future__ import annotations

import ctypes
from typing import Any

from lmpress.engines.local.llamacpp.projector import ImageSegment, Projector


class KvCacheFull(RuntimeError):
    """llama_decode found no free KV cells for the batch (it returned 1, before decoding any
    of it)."""


class Batches:
    """The batch buffers of one llama.cpp context, and the decode calls that read them."""

    def __init__(self, lc: Any, ctx: Any, projector: Projector | None):
        self._lc = lc  # the llama_cpp module
        self._ctx = ctx  # the llama_context pointer
        self._projector = projector
        self.size = lc.llama_n_batch(ctx)  # the most tokens decoded at once
        self.micro_size = lc.llama_n_ubatch(ctx)  # the most in one pass over the weights
        self._tokens = lc.llama_batch_init(self.size, 0, 1)
        self._embeddings: Any = None  # for image embeddings, made on the first image
        # What an image embedding row holds: the width of the model's input embeddings.
        self._n_embd = lc.llama_model_n_embd_inp(lc.llama_get_model(ctx))

    def put(self, i: int, token: int, pos: int, seq: int, logits: bool) -> None:
        """Write token `i` of the next token batch."""
        batch = self._tokens
        batch.token[i] = token
        batch.pos[i] = pos
        batch.n_seq_id[i] = 1
        batch.seq_id[i][0] = seq
        batch.logits[i] = logits

    def decode(self, n_tokens: int) -> None:
        """Decode the first `n_tokens` written with `put`."""
        self._tokens.n_tokens = n_tokens
        code = self._lc.llama_decode(self._ctx, self._tokens)
        if code == 1:
            raise KvCacheFull("llama_decode found no room in the KV cache")
        if code != 0:
            raise RuntimeError(f"llama_decode returned {code}")

    def decode_image(self, image: ImageSegment, fed: int, seq: int, prompt_length: int) -> int:
        """The next chunk of an image's embeddings (encoded when the prefill first reaches it),
        from prompt position `fed`, decoded into sequence `seq` in a batch of its own; how many
        positions that was."""
        lc = self._lc
        if image.embeddings is None:
            image.embeddings = self._projector.encode(image, self._n_embd)
        if self._embeddings is None:
            self._embeddings = lc.llama_batch_init(self.size, self._n_embd, 1)
        batch, offset = self._embeddings, fed - image.start
        rows = image.embeddings[offset : offset + self.size]
        last = fed + len(rows) == prompt_length
        ctypes.memmove(batch.embd, rows.ctypes.data, rows.nbytes)
        for j in range(len(rows)):
            batch.pos[j] = fed + j
            batch.n_seq_id[j] = 1
            batch.seq_id[j][0] = seq
            batch.logits[j] = last and j == len(rows) - 1
        batch.n_tokens = len(rows)
        if image.non_causal:  # the image's tokens see each other both ways
            lc.llama_set_causal_attn(self._ctx, False)
        try:
            code = lc.llama_decode(self._ctx, batch)
        finally:
            if image.non_causal:
                lc.llama_set_causal_attn(self._ctx, True)
        if code != 0:
            raise RuntimeError(f"llama_decode returned {code} on an image")
        return len(rows)

    def free(self) -> None:
        self._lc.llama_batch_free(self._tokens)
        if self._embeddings is not None:
            self._lc.llama_batch_free(self._embeddings)
