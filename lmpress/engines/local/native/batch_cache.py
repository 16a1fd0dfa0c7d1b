"""The KV cache behind NATIVE's continuous batching, which lmpress keeps itself.

transformers' DynamicCache holds one tensor a layer, [rows, heads, length, head_dim], every row
as long as the longest. `BatchCache` keeps the rows decoding now in one such cache, each row's
tokens right-aligned behind masked-out padding, so one forward pass decodes a token for every
row. A row's position counts its own tokens only, so the padding changes nothing it computes.
A row that ends leaves at once (`keep`), and columns that no row uses any more are cut away; a
row that joins (`join`) brings the cache of its own prompt, prefilled on its own, and is padded
on the left to the batch's length (or the batch to its own). Each layer appends a step's keys
and values into spare columns (`SlackLayer`) rather than concatenating as DynamicCache does,
which copies the whole cache every step.

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
# Columns a layer's buffers keep spare: every this many steps, or when rows join or leave,
# they are copied into new ones. Concatenating instead copied the whole cache every step:
# about 30% of a decode step of SmolLM2-135M on a CPU at batch 16 and 400 tokens.
SPARE_COLUMNS = 64


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
        """A DynamicLayer whose keys and values are the used columns of larger buffers, so a
        step writes its own column in place. Padding columns stay zeros: a masked column
        weighs 0 in attention, and 0 times a NaN left in unset memory would still be NaN."""

        def __init__(self, keys: Any, values: Any, rows: int, width: int):
            super().__init__()
            self.dtype, self.device, self.is_initialized = keys.dtype, keys.device, True
            self.allocate(keys, values, rows, width)

        def allocate(self, keys: Any, values: Any, rows: int, width: int) -> None:
            """Zeroed buffers shaped like `keys` and `values`, with `width` columns in use."""
            spare = width + SPARE_COLUMNS
            self.key_buffer = keys.new_zeros((rows, keys.shape[1], spare, keys.shape[3]))
            self.value_buffer = values.new_zeros((rows, values.shape[1], spare, values.shape[3]))
            self.show(width)

        def show(self, width: int) -> None:
            self.keys = self.key_buffer[:, :, :width]
            self.values = self.value_buffer[:, :, :width]

        def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> Any:
            start = self.keys.shape[-2]
            end = start + key_states.shape[-2]
            if end > self.key_buffer.shape[-2]:  # out of spare columns: new buffers
                keys, values = self.keys, self.values
                self.allocate(keys, values, keys.shape[0], start)
                self.key_buffer[:, :, :start] = keys
                self.value_buffer[:, :, :start] = values
            self.key_buffer[:, :, start:end] = key_states
            self.value_buffer[:, :, start:end] = value_states
            self.show(end)
            return self.keys, self.values

    return SlackLayer


def slack_cache(layers: list[Any]) -> Any:
    from transformers import DynamicCache

    cache = DynamicCache()
    cache.layers = layers
    return cache


class BatchCache:
    """The rows decoding now: their KV cache and their attention mask [rows, length]."""

    def __init__(self, device: str):
        self.device = device
        self.cache: Any = None
        self.mask: Any = None

    @property
    def rows(self) -> int:
        return 0 if self.mask is None else self.mask.shape[0]

    @property
    def width(self) -> int:
        return 0 if self.mask is None else self.mask.shape[1]

    def join(self, prompts: list[PromptCache]) -> None:
        """Add rows after the ones already here, each with its prompt's cache."""
        import torch

        width = max([self.width] + [len(p.ids) for p in prompts])
        rows = self.rows + len(prompts)
        mask = torch.zeros((rows, width), dtype=torch.long, device=self.device)
        if self.mask is not None:
            mask[: self.rows, width - self.width :] = self.mask
        for b, prompt in enumerate(prompts, start=self.rows):
            mask[b, width - len(prompt.ids) :] = 1
        old = layer_tensors(self.cache) if self.cache is not None else None
        layer_class, layers = slack_layer_class(), []
        for i, (keys, values) in enumerate(prompts[0].layers):
            layer = layer_class(keys, values, rows, width)
            for t, buffer in enumerate((layer.key_buffer, layer.value_buffer)):
                if old is not None:
                    buffer[: self.rows, :, width - self.width : width] = old[i][t]
                for b, prompt in enumerate(prompts, start=self.rows):
                    buffer[b, :, width - len(prompt.ids) : width] = prompt.layers[i][t][0]
            layers.append(layer)
        self.cache, self.mask = slack_cache(layers), mask

    def keep(self, indices: list[int]) -> None:
        """Keep only these rows, in this order, and cut the columns none of them uses."""
        if not indices:
            self.cache = self.mask = None
            return
        import torch

        index = torch.tensor(indices, device=self.device)
        mask = self.mask[index]
        first = int(mask.any(dim=0).int().argmax())  # the first column a row still uses
        self.mask = mask[:, first:]
        width = self.mask.shape[1]
        layer_class, layers = slack_layer_class(), []
        for keys, values in layer_tensors(self.cache):
            layer = layer_class(keys, values, len(indices), width)
            layer.key_buffer[:, :, :width] = keys[index, :, first:]
            layer.value_buffer[:, :, :width] = values[index, :, first:]
            layers.append(layer)
        self.cache = slack_cache(layers)

    def step_inputs(self) -> tuple[Any, Any]:
        """The attention mask and positions for one new token in every row; the mask is kept."""
        import torch

        positions = self.mask.sum(dim=1, keepdim=True)  # each row's own tokens so far
        self.mask = torch.cat([self.mask, self.mask.new_ones((self.rows, 1))], dim=1)
        return self.mask, positions

    def nbytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in layer_tensors(self.cache)) if self.cache else 0


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
