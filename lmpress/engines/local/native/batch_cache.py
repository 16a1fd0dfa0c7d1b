"""The KV cache behind NATIVE's continuous batching, which lmpress keeps itself.

transformers' DynamicCache holds one tensor a layer, [rows, heads, length, head_dim], every row
as long as the longest. `BatchCache` keeps the rows decoding now in one such cache, one slot a
row, each row's tokens right-aligned behind masked-out padding, so one forward pass decodes a
token for every slot. A row's position counts its own tokens only, so the padding changes
nothing it computes.

Each layer's keys and values are a window of columns in larger buffers (`SlackLayer`): a step
writes its own column in place rather than concatenating as DynamicCache does, which copies the
whole cache every step. A row that ends frees its slot (`leave`) and the columns no row uses
any more drop out of the window; a row that joins (`place`) takes a free slot and copies in the
cache of its own prompt, prefilled on its own. Neither copies the other rows: the buffers are
only copied when they run out of room (columns, or slots) and when slots stay free with nobody
to take them (`compact`), so the cache never holds two copies of itself at once.

`PrefixStore` keeps the prompt caches of the last few prompts prefilled: a new prompt that
begins with the same tokens (a system prompt, a few-shot block) starts from the longest such
prefix and computes only the rest.
"""

from __future__ import annotations

import functools
from collections import deque
from dataclasses import dataclass
from typing import Any

# A prompt reuses a stored prefix only when they share at least this many tokens: below that,
# copying the prefix costs about what computing it would.
MIN_SHARED_PREFIX = 16
PREFIX_SLOTS = 4  # prompts whose caches are kept for the prompts after them
# Columns a layer's buffers keep spare past the window: every this many steps they are copied
# into new ones. Concatenating instead copied the whole cache every step: about 30% of a decode
# step of SmolLM2-135M on a CPU at batch 16 and 400 tokens.
SPARE_COLUMNS = 32


# Allocations at least this large get pages of their own from the kernel (glibc's mmap
# threshold), given back the moment they are freed.
OWN_PAGES_FROM = 1 << 20


def give_freed_caches_back() -> None:
    """Keep the KV cache's buffers off glibc's heap, on the CPU.

    glibc maps each allocation above its mmap threshold on its own, but it raises that
    threshold to the size of each such block freed, so that once a cache buffer has been
    replaced, the next ones come from the heap, where the freed ones leave holes the larger
    next ones cannot use. Measured on SmolLM2-135M (48 chat prompts, batch 16, 256 new
    tokens), that kept NATIVE's peak memory 8-12% above static `generate`'s. A fixed
    threshold stops that: buffers of a megabyte and more are mapped, and unmapped when freed.
    Only cache moves, prompt prefills and the step's logits are that large, so the page faults
    cost nothing measurable. No-op where the C library is not glibc."""
    import ctypes
    import sys

    if not sys.platform.startswith("linux"):
        return
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    m_mmap_threshold = -3  # from glibc's malloc.h
    mallopt(m_mmap_threshold, OWN_PAGES_FROM)


@dataclass
class PromptCache:
    """One prompt's KV cache on its own: per layer, keys and values of [1, heads, length, dim]."""

    ids: list[int]
    layers: list[tuple[Any, Any]]


def layer_tensors(cache: Any) -> list[tuple[Any, Any]]:
    return [(layer.keys, layer.values) for layer in cache.layers]


def dynamic_cache(layers: list[tuple[Any, Any]]) -> Any:
    from transformers import DynamicCache

    return DynamicCache(layers)


@functools.cache
def slack_layer_class() -> type:
    from transformers.cache_utils import DynamicLayer

    class SlackLayer(DynamicLayer):
        """A DynamicLayer whose keys and values are columns `start` to `end` of larger buffers
        [slots, heads, columns, dim], so a step writes its own column in place. Columns that
        no row's tokens fill are masked out, and hold zeros or an ended row's keys: a masked
        column weighs 0 in attention, but 0 times a NaN left in unset memory would still be
        NaN, so the buffers are never left unset."""

        def __init__(self, like: Any, slots: int, columns: int):
            super().__init__()
            self.dtype, self.device, self.is_initialized = like.dtype, like.device, True
            shape = (slots, like.shape[1], columns, like.shape[3])
            self.key_buffer, self.value_buffer = like.new_zeros(shape), like.new_zeros(shape)
            self.show(0, 0)

        def show(self, start: int, end: int) -> None:
            self.start, self.end = start, end
            self.keys = self.key_buffer[:, :, start:end]
            self.values = self.value_buffer[:, :, start:end]

        def moved(self, slots: list[int] | None, total: int, width: int) -> Any:
            """A new layer of `total` slots, these of this one (all, for None) first in this
            order, their window right-aligned in `width` columns and spare columns after it."""
            moved = type(self)(self.keys, total, width + SPARE_COLUMNS)
            moved.show(0, width)
            kept = self.end - self.start
            for mine, theirs in ((self.keys, moved.keys), (self.values, moved.values)):
                if slots is None:
                    theirs[: mine.shape[0], :, width - kept :] = mine
                else:
                    theirs[: len(slots), :, width - kept :] = mine[slots]
            return moved

        def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> Any:
            if self.end + key_states.shape[-2] > self.key_buffer.shape[-2]:  # out of columns
                moved = self.moved(None, self.key_buffer.shape[0], self.end - self.start)
                self.key_buffer, self.value_buffer = moved.key_buffer, moved.value_buffer
                self.show(0, moved.end)
            end = self.end + key_states.shape[-2]
            self.key_buffer[:, :, self.end : end] = key_states
            self.value_buffer[:, :, self.end : end] = value_states
            self.show(self.start, end)
            return self.keys, self.values

    return SlackLayer


def slack_cache(layers: list[Any]) -> Any:
    from transformers import DynamicCache

    cache = DynamicCache()
    cache.layers = layers
    return cache


class BatchCache:
    """The rows decoding now, a slot each: their KV cache, and their attention mask
    [slots, width] (1 where the slot's row has a token). A free slot decodes too, until a row
    takes it or `compact` drops it: its mask keeps it to its own tokens since it was freed,
    so it computes nothing that is not finite."""

    def __init__(self, device: str):
        self.device = device
        self.cache: Any = None
        self.mask: Any = None
        self.free: set[int] = set()

    @property
    def slots(self) -> int:
        return 0 if self.mask is None else self.mask.shape[0]

    @property
    def width(self) -> int:
        return 0 if self.mask is None else self.mask.shape[1]

    def place(self, joining: list[tuple[int, PromptCache]]) -> None:
        """Put each prompt's cache in its slot: a free one, or a new one after the last."""
        import torch

        slots = max(self.slots, *(b + 1 for b, _ in joining))
        width = max(self.width, *(len(prompt.ids) for _, prompt in joining))
        if self.cache is None:
            like = joining[0][1].layers
            self.cache = slack_cache([slack_layer_class()(k, 0, 0) for k, _ in like])
        room = self.cache.layers[0].start  # unused columns left of the window
        if slots > self.slots or width - self.width > room:
            self._move(None, slots, width)
        else:
            for layer in self.cache.layers:
                layer.show(layer.end - width, layer.end)
        mask = torch.zeros((slots, width), dtype=torch.long, device=self.device)
        if self.mask is not None:
            mask[: self.slots, width - self.width :] = self.mask
        for b, prompt in joining:
            n = len(prompt.ids)
            mask[b] = 0
            mask[b, width - n :] = 1
            for layer, tensors in zip(self.cache.layers, prompt.layers, strict=True):
                for window, tensor in zip((layer.keys, layer.values), tensors, strict=True):
                    window[b, :, : width - n] = 0
                    window[b, :, width - n :] = tensor[0]
        self.mask = mask
        self.free -= {b for b, _ in joining}

    def leave(self, slots: list[int]) -> None:
        """Free these slots, and drop the columns no row uses any more."""
        self.free.update(slots)
        if len(self.free) == self.slots:
            self.cache = self.mask = None
            self.free = set()
            return
        self.mask[slots] = 0
        live = [b for b in range(self.slots) if b not in self.free]
        first = int(self.mask[live].any(dim=0).int().argmax())  # the first column in use
        if first:
            self.mask = self.mask[:, first:]
            for layer in self.cache.layers:
                layer.show(layer.start + first, layer.end)

    def compact(self) -> list[int]:
        """Drop the free slots; returns the slots kept, in their new order."""
        live = [b for b in range(self.slots) if b not in self.free]
        if self.free:
            self.mask = self.mask[live]
            self._move(live, len(live), self.width)
            self.free = set()
        return live

    def _move(self, slots: list[int] | None, total: int, width: int) -> None:
        """Into new buffers (see SlackLayer.moved), layer by layer, so that at most one layer
        is held twice at a time."""
        layers = self.cache.layers
        for i, layer in enumerate(layers):
            layers[i] = layer.moved(slots, total, width)

    def step_inputs(self) -> tuple[Any, Any]:
        """The attention mask and positions for one new token in every slot; the mask is
        kept."""
        import torch

        positions = self.mask.sum(dim=1, keepdim=True)  # each row's own tokens so far
        self.mask = torch.cat([self.mask, self.mask.new_ones((self.slots, 1))], dim=1)
        return self.mask, positions


class PrefixStore:
    """The caches of the last few prompts, for the prompts after them that share a prefix."""

    def __init__(self, slots: int = PREFIX_SLOTS):
        self.stored: deque[PromptCache] = deque(maxlen=slots)

    def longest(self, ids: list[int]) -> tuple[PromptCache | None, int]:
        """The stored prompt sharing the longest prefix with `ids`, and how many tokens; the
        last token of `ids` is never shared, since its logits pick the first new token."""
        best, best_shared = None, 0
        for stored in self.stored:
            shared = shared_prefix(stored.ids, ids, len(ids) - 1)
            if shared > best_shared:
                best, best_shared = stored, shared
        if best_shared < MIN_SHARED_PREFIX:
            return None, 0
        return best, best_shared

    def add(self, prompt: PromptCache) -> None:
        self.stored.append(prompt)


def shared_prefix(a: list[int], b: list[int], limit: int) -> int:
    n = min(len(a), len(b), limit)
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
