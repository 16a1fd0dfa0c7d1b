"""LLAMACPP's draft model (`model.draft_model`): a smaller GGUF model sharing the model's
vocabulary drafts each row's next tokens, which the model then verifies in its own step
(engines/local/speculation.py gives the rule; scheduling.py applies it as for prompt lookup).

The draft model has a context of its own, split into as many sequences as the model's (a
drafting engine's cache is split: loading.batched_context), and a row drafts in the sequence of
the same id, within the positions the row reserved (its prompt and budget); a sequence keeps no
more than the model's does once its row ends. `Drafter` keeps, for each sequence, the tokens its
KV cells hold. Before a row drafts, its sequence is cut back to the longest prefix those share
with the row's tokens now (its prompt and its reply so far, ending with the token the model
decodes next), and the rest is read: at a row's first draft that is its prompt, unless the
sequence still holds a prompt that starts the same way (as the model's own sequences keep
theirs); after a step, the token the model picked and whatever drafts it did not keep. A
step's drafting is one batch of those tokens for every drafting row, then one batch a token
for the drafts after the first: k drafts cost k passes of the draft model. Each draft is the
draft model's greedy token, a one-hot draft, for which the rule leaves a sampled row's
distribution unchanged.
"""

from __future__ import annotations

from typing import Any

from lmpress.configs.schema import ModelParams
from lmpress.engines.local.llamacpp.batches import Batches, KvCacheFull
from lmpress.engines.local.llamacpp.loading import batched_context, gguf_path, load_llama
from lmpress.engines.local.llamacpp.rows import SequenceRow
from lmpress.engines.local.llamacpp.sequences import common_prefix
from lmpress.vocabulary.errors import ConfigError, ModelLoadError

# The most tokens every drafting row reads in the draft's first pass of a step, each row the same
# count: a row lacking more (a prompt) reads the rest before it.
READ_AT_ONCE = 8


class Drafter:
    """A draft model's context and what each of its sequences holds (see the module
    docstring)."""

    def __init__(self, llama: Any, ctx: Any, sequences: int):
        import llama_cpp

        self._lc = llama_cpp
        self._llama = llama  # the draft model's `Llama`, whose weights the context reads
        self._ctx = ctx
        self._memory = llama_cpp.llama_get_memory(ctx.ctx)
        self.batches = Batches(llama_cpp, ctx.ctx, None)
        self.n_vocab = llama.n_vocab()
        self.held: list[list[int]] = [[] for _ in range(sequences)]

    def propose(self, rows: list[SequenceRow], counts: list[int]) -> list[list[int]]:
        """Each row's drafts, `counts[i]` of them (0: none this step); none at all this step
        should the draft's cache find no room (the samples of one prompt read it once each
        here, where the model's share it)."""
        drafts: list[list[int]] = [[] for _ in rows]
        drafting = sorted((i for i, c in enumerate(counts) if c), key=lambda i: rows[i].seq_id)
        if not drafting:
            return drafts
        try:
            self._read_pending([rows[i] for i in drafting], [drafts[i] for i in drafting])
            # Every drafting row drafts as many as the most any asks for, while the cells it
            # reserved have room: rows carrying one token each take one pass, where rows
            # dropping out would split it into several.
            for _ in range(1, max(counts)):
                going = [
                    i
                    for i in drafting
                    if len(drafts[i]) < counts[i] or len(self.held[rows[i].seq_id]) < end(rows[i])
                ]
                for n, i in enumerate(going):
                    row, token = rows[i], drafts[i][-1]
                    held = self.held[row.seq_id]
                    self.batches.put(n, token, len(held), row.seq_id, True)
                    held.append(token)
                self.batches.decode(len(going))
                for n, i in enumerate(going):
                    drafts[i].append(self._greedy(n))
        except KvCacheFull:
            self.clear()
            return [[] for _ in rows]
        except Exception:
            self.clear()  # what the cells hold is not known now
            raise
        return [d[:count] for d, count in zip(drafts, counts, strict=True)]

    def _read_pending(self, rows: list[SequenceRow], firsts: list[list[int]]) -> None:
        """Read each row's tokens its sequence lacks and put the draft model's token after the
        last of them in the row's `firsts`.

        Over a split KV cache llama.cpp gives rows carrying different token counts passes of
        their own (this engine's speculation.py), so every row ends with the same count,
        `width`: the most any row lacks, up to READ_AT_ONCE; a row lacking fewer reads some it
        holds again (as cheap as padding, and its cells stay right), and a row lacking more (a
        new prompt) reads the rest first, in batches of the context's size, with no logits."""
        tokens = [row.submission.prompt_ids + row.tokens for row in rows]
        keeps = [
            min(common_prefix(self.held[row.seq_id], t), len(t) - 1)
            for row, t in zip(rows, tokens, strict=True)
        ]
        lacking = [len(t) - keep for t, keep in zip(tokens, keeps, strict=True)]
        width = max([n for n in lacking if n <= READ_AT_ONCE], default=1)
        ahead = []  # (token, position, sequence) read before the step's last `width` a row
        for place, row in enumerate(rows):
            t = tokens[place]
            keep = min(keeps[place], max(0, len(t) - width))
            held = self.held[row.seq_id]
            if keep < len(held):
                self._lc.llama_memory_seq_rm(self._memory, row.seq_id, keep, -1)
                del held[keep:]
            tail = max(keep, len(t) - width)
            ahead += [(t[p], p, row.seq_id) for p in range(keep, tail)]
            held += t[keep:]
        size = self.batches.size
        for start in range(0, len(ahead), size):
            chunk = ahead[start : start + size]
            for n, (token, pos, seq) in enumerate(chunk):
                self.batches.put(n, token, pos, seq, False)
            self.batches.decode(len(chunk))
        final = []  # each row's last `width` tokens: (its place, token, position, sequence)
        for place, row in enumerate(rows):
            t = tokens[place]
            final += [(place, t[p], p, row.seq_id) for p in range(max(0, len(t) - width), len(t))]
        for start in range(0, len(final), size):
            chunk = final[start : start + size]
            lasts = []
            for n, (place, token, pos, seq) in enumerate(chunk):
                last = pos == len(tokens[place]) - 1
                self.batches.put(n, token, pos, seq, last)
                if last:
                    lasts.append((place, n))
            self.batches.decode(len(chunk))
            for place, n in lasts:
                firsts[place].append(self._greedy(n))

    def _greedy(self, index: int) -> int:
        import numpy as np

        pointer = self._lc.llama_get_logits_ith(self._ctx.ctx, index)
        return int(np.ctypeslib.as_array(pointer, shape=(self.n_vocab,)).argmax())

    def keep(self, seq: int, tokens: list[int]) -> None:
        """Keep no more of a free sequence's cells than the start they share with `tokens`
        (what the model's sequence keeps)."""
        held = self.held[seq]
        keep = common_prefix(held, tokens)
        if keep < len(held):
            self._lc.llama_memory_seq_rm(self._memory, seq, keep, -1)
            del held[keep:]

    def clear(self) -> None:
        """Drop every sequence's cells."""
        for seq, held in enumerate(self.held):
            self._lc.llama_memory_seq_rm(self._memory, seq, -1, -1)
            held.clear()

    def close(self) -> None:
        self.batches.free()
        self._ctx.close()
        self._llama.close()


def end(row: SequenceRow) -> int:
    """The positions a row reserved in the model's KV cache: its prompt and its budget."""
    return len(row.submission.prompt_ids) + row.limit


def load_drafter(
    model: ModelParams, kwargs: dict[str, Any], target: Any, ctx: Any, batch_size: int
) -> Any:
    """`model.draft_model`'s weights and a context of its own, made as the model's batched
    context `ctx` is, after checking that it shares the model's vocabulary (a draft is a list
    of token ids)."""
    import llama_cpp

    path = gguf_path(model.draft_model, "model.draft_model")
    n_ctx = llama_cpp.llama_n_ctx(ctx.ctx)
    try:
        llama = load_llama(path, {**kwargs, "n_ctx": n_ctx, "verbose": False})
    except Exception as exc:
        raise ModelLoadError(f"model.draft_model: cannot load GGUF model '{path}': {exc}") from exc
    if llama.n_vocab() != target.n_vocab():
        theirs = llama.n_vocab()
        llama.close()
        raise ConfigError(
            f"model.draft_model: '{model.draft_model}' has a vocabulary of {theirs} tokens and "
            f"'{model.model_name}' one of {target.n_vocab()}; a draft model must share the "
            "model's tokenizer (a smaller model of the same family)"
        )
    draft_ctx = batched_context(llama, path, {**kwargs, "verbose": False}, batch_size)
    return Drafter(llama, draft_ctx, batch_size)
