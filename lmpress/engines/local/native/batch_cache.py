"""The KV cache behind NATIVE's continuous batching, which lmpress keeps itself.

Every row decoding now has a cache of its own (`RowCache`): for every layer, keys and values as
long as its own tokens, with a few spare columns after them, all in one allocation. Nothing is
padded to the longest row, so the batch's cache holds only the tokens its rows hold. A step
writes each row's new column in place (`RowsLayer.update`) and attention runs over each row's
own columns (row_attention.py). A row that ends drops its cache (`BatchCache.leave`); a row that
joins (`join`) copies in the cache of its own prompt, prefilled on its own. Neither copies the
other rows; a row's buffer is only copied when it runs out of spare columns.

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
# Columns a row's buffer keeps spare past its tokens: every this many steps it is copied into a
# larger one. More costs memory in every row; fewer, copies.
SPARE_COLUMNS = 16


# Allocations at least this large get pages of their own from the kernel (glibc's mmap
# threshold), given back the moment they are freed.
OWN_PAGES_FROM = 1 << 20


def give_freed_caches_back() -> None:
    """Keep the KV cache's buffers off glibc's heap, on the CPU.

    glibc maps each allocation above its mmap threshold on its own, but it raises that
    threshold to the size of each such block freed, so that once a cache buffer has been
    replaced, the next ones come from the heap, where the freed ones leave holes the larger
    next ones cannot use, which kept NATIVE's peak memory above static `generate`'s
    (benchmarks/README.md, figures behind choices). A fixed threshold stops that: buffers of a megabyte and more are mapped, and unmapped when freed.
    Only row caches, prompt prefills and the step's logits are that large, so the page faults
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


class RowCache:
    """One row's keys and values: per layer, [heads, columns, dim] each, views of a single
    buffer; the first `length` columns hold the row's tokens."""

    def __init__(self, prompt: PromptCache):
        self.length = prompt.layers[0][0].shape[-2]
        self.layers = self._buffers(
            [(k[0], v[0]) for k, v in prompt.layers], self.length + SPARE_COLUMNS
        )

    def make_room(self) -> None:
        """At least one spare column, for the next token."""
        if self.length == self.layers[0][0].shape[1]:
            self.layers = self._buffers(self.layers, self.length + SPARE_COLUMNS)

    def _buffers(self, layers: list[tuple[Any, Any]], columns: int) -> list[tuple[Any, Any]]:
        """New buffers of `columns` columns, holding the first `length` columns of `layers`."""
        tensors = [t for layer in layers for t in layer]
        sizes = [t.shape[0] * columns * t.shape[2] for t in tensors]
        flat = tensors[0].new_empty(sum(sizes))
        views, at = [], 0
        for t, size in zip(tensors, sizes, strict=True):
            view = flat[at : at + size].view(t.shape[0], columns, t.shape[2])
            view[:, : self.length] = t[:, : self.length]
            views.append(view)
            at += size
        return list(zip(views[::2], views[1::2], strict=True))


class RowViews(list):
    """Each row's keys (or values) for one layer, [heads, its own length, dim]: what a
    `RowsLayer` gives attention in place of one padded tensor (see row_attention.py)."""


@functools.cache
def rows_layer_class() -> type:
    from transformers.cache_utils import DynamicLayer

    class RowsLayer(DynamicLayer):
        """One layer of a `BatchCache` as the model sees it: `update` writes each row's new
        token in place and returns the rows' own columns. Mask sizes are those of the new
        token alone: attention needs no mask, since every row attends to all of its own
        tokens."""

        def __init__(self, batch: BatchCache, index: int):
            super().__init__()
            self.batch, self.index, self.is_initialized = batch, index, True

        def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> Any:
            keys, values = RowViews(), RowViews()
            new_keys, new_values = key_states[:, :, -1].unbind(0), value_states[:, :, -1].unbind(0)
            for row, new_k, new_v in zip(self.batch.rows, new_keys, new_values, strict=True):
                k, v = row.layers[self.index]
                n = row.length  # counts the token being written
                k.select(1, n - 1).copy_(new_k)
                v.select(1, n - 1).copy_(new_v)
                keys.append(k.narrow(1, 0, n))
                values.append(v.narrow(1, 0, n))
            return keys, values

        def get_seq_length(self) -> int:
            # Rows differ in length; the step passes each row's position itself, and masks
            # come out empty (get_mask_sizes), so no single length is asked for anything.
            return 0

        def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
            return query_length, 0

    return RowsLayer


class BatchCache:
    """The rows decoding now, in order: their caches, and the cache the model's forward pass
    takes for one step of all of them."""

    def __init__(self) -> None:
        self.rows: list[RowCache] = []
        self._cache: Any = None

    def join(self, prompts: list[PromptCache]) -> None:
        """Add a row after the last for each prompt, starting from its cache."""
        self.rows += [RowCache(prompt) for prompt in prompts]

    def leave(self, indices: list[int]) -> None:
        gone = set(indices)
        self.rows = [row for i, row in enumerate(self.rows) if i not in gone]

    def columns(self) -> int:
        """The cache columns the rows hold now, their spare columns included."""
        return sum(row.layers[0][0].shape[1] for row in list(self.rows))

    def step_inputs(self) -> tuple[Any, Any]:
        """The positions of one new token in every row, [rows, 1], and the cache to pass the
        model; every row counts the new token from here."""
        import torch

        positions = []
        for row in self.rows:
            row.make_room()
            positions.append([row.length])
            row.length += 1
        if self._cache is None:
            from transformers import DynamicCache

            self._cache = DynamicCache()
            layer = rows_layer_class()
            self._cache.layers = [layer(self, i) for i in range(len(self.rows[0].layers))]
        device = self.rows[0].layers[0][0].device
        return torch.tensor(positions, device=device), self._cache


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
