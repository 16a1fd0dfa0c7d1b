"""The sequences of LLAMACPP's KV cache: which are free, and what each free one keeps.

The context holds `batch_size` sequences in one KV cache that they share (llama.cpp's unified
cache): a sequence may use any free cell, up to the whole context. The scheduler
(scheduling.py) asks `Sequences` for free ones when a request starts and gives them back when
its rows end; a finished sequence's KV cells stay until the sequence is taken again or their
room is needed, so a request whose prompt begins like a free sequence's last prompt and reply
(the same system prompt, the next turn of a chat) takes that sequence and reads only the rest.
This is its own class because which sequence a request takes, and whose kept cells give way
when the cache is full, are a policy of their own, apart from the step that decodes them.
"""

from __future__ import annotations

from typing import Any, TypeVar

# A cached prefix shorter than this (a chat template's opening, a word or two) does not decide
# which sequence a request takes: keeping it spares a few tokens, and a sequence taken out of
# id order costs a micro-batch a step while its prompt is read.
KEPT_PREFIX = 16

Prompted = TypeVar("Prompted")  # anything with `prompt_ids` and `request.params.n`


def common_prefix(a: list[int], b: list[int]) -> int:
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


class Sequences:
    """The sequence ids of one llama.cpp context and their KV cells."""

    def __init__(self, lc: Any, memory: Any, count: int, split: bool = False):
        self._lc = lc  # the llama_cpp module
        self._memory = memory  # the context's llama_memory
        self.count = count
        # Each sequence in a part of the cache of its own (a stream): llama.cpp copies cells
        # between parts only whole.
        self.split = split
        self.free = list(range(count))  # least recently used first
        # The tokens whose KV cells a free sequence still holds from its last request, and the
        # LoRA adapter they were computed with (turns.py): they serve that adapter's rows only.
        self._cached: list[list[int]] = [[] for _ in range(count)]
        self._made_with: list[str | None] = [None] * count
        self.adapter: str | None = None  # the adapter the context applies now

    def in_flight(self) -> int:
        """Sequences holding a slot in the KV cache right now (0 when idle)."""
        return self.count - len(self.free)

    def cells_used(self) -> int:
        """Positions held in the KV cache, summed over sequences and read from llama.cpp
        itself (0 when nothing is cached)."""
        lc = self._lc
        return sum(lc.llama_memory_seq_pos_max(self._memory, seq) + 1 for seq in range(self.count))

    def cells_cached(self) -> int:
        """Positions that free sequences keep for reuse (see `take`)."""
        return sum(len(self._cached[seq]) for seq in self.free)

    def _kept(self, seq: int) -> list[int]:
        """The tokens a sequence keeps that a row of the current adapter may reuse."""
        return self._cached[seq] if self._made_with[seq] == self.adapter else []

    def cached_prefix(self, prompt: list[int]) -> int:
        """The longest prefix of `prompt` that a free sequence keeps."""
        return max((common_prefix(self._kept(seq), prompt) for seq in self.free), default=0)

    def choose(self, prompt: list[int], n: int) -> list[int]:
        """The free sequences a request of `n` samples would take (see `take`): first the one
        whose cached tokens share the longest prefix with its prompt, if that is at least
        KEPT_PREFIX tokens (a shared system prompt, an earlier turn of the same conversation:
        see `keep_prefix`), then the least recently used ones."""
        best, kept = None, KEPT_PREFIX - 1
        for seq in self.free:
            common = common_prefix(self._kept(seq), prompt)
            if common > kept:
                best, kept = seq, common
        rest = [seq for seq in self.free if seq != best]
        return ([] if best is None else [best]) + rest[: n - (best is not None)]

    def take(self, seqs: list[int]) -> None:
        """The sequences `choose` picked are no longer free."""
        for seq in seqs:
            self.free.remove(seq)

    def make_room(self, most: int, spare: list[int]) -> list[int] | None:
        """Drop the kept cells of free sequences other than `spare`, least recently used first,
        until they hold at most `most` cells; the sequences dropped, or None where even
        dropping them all would not do (nothing is dropped then)."""
        if most < 0:
            return None
        others = [seq for seq in self.free if seq not in spare and self._cached[seq]]
        held = sum(len(self._cached[seq]) for seq in others)
        dropped = []
        for seq in others:
            if held <= most:
                break
            held -= len(self._cached[seq])
            self.clear(seq)
            self._cached[seq] = []
            dropped.append(seq)
        return dropped

    def keep_prefix(self, prompt: list[int], seqs: list[int], most: int) -> int:
        """Clear a request's sequences but for the part of the first one's cached tokens that
        begins its prompt, up to `most` tokens (the first position whose logits are needed,
        at most the prompt's last), which is not decoded again; how many tokens that is."""
        first = seqs[0]
        reused = min(common_prefix(self._kept(first), prompt), most)
        lc = self._lc
        lc.llama_memory_seq_rm(self._memory, first, reused, -1)
        for seq in seqs[1:]:  # filled from the first one's cells once the prompt is read
            lc.llama_memory_seq_rm(self._memory, seq, -1, -1)
        for seq in seqs:
            self._cached[seq] = []
        return reused

    def copy(self, source: int, seq: int) -> None:
        """Give `seq` the KV cells of `source` (another sample of the same prompt)."""
        self._lc.llama_memory_seq_cp(self._memory, source, seq, -1, -1)

    def fork(self, source: int, seq: int, length: int) -> None:
        """Give `seq` the first `length` KV cells of `source`, a sequence in flight whose
        prompt begins the same way (another choice after the same context): in a shared cache
        the cells are shared, in a split one the whole part is copied and the rest dropped."""
        lc, memory = self._lc, self._memory
        lc.llama_memory_seq_rm(memory, seq, -1, -1)
        if self.split:
            lc.llama_memory_seq_cp(memory, source, seq, -1, -1)
            lc.llama_memory_seq_rm(memory, seq, length, -1)
        else:
            lc.llama_memory_seq_cp(memory, source, seq, 0, length)
        self._cached[seq] = []

    def give_back(self, seq: int, kept: list[int]) -> None:
        """The sequence is free again; its cells hold `kept` for a request that starts the
        same way."""
        self._cached[seq] = kept
        self._made_with[seq] = self.adapter
        self.free.append(seq)

    def trim(self, seq: int, pos: int) -> None:
        """Drop the sequence's KV cells from position `pos` on (drafts it did not keep)."""
        self._lc.llama_memory_seq_rm(self._memory, seq, pos, -1)

    def clear(self, seq: int) -> None:
        """Drop the sequence's KV cells."""
        self._lc.llama_memory_seq_rm(self._memory, seq, -1, -1)
