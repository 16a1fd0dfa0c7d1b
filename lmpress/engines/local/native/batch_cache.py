"""The KV cache behind NATIVE's continuous batching, which lmpress keeps itself.

transformers' DynamicCache holds one tensor a layer, [rows, heads, length, head_dim], every row
as long as the longest. `BatchCache` keeps the rows decoding now in one such cache, each row's
tokens right-aligned behind masked-out padding, so one forward pass decodes a token for every
row. A row's position counts its own tokens only, so the padding changes nothing it computes.
A row that ends leaves at once (`keep`), and columns that no row uses any more are cut away; a
row that joins (`join`) brings the cache of its own prompt, prefilled on its own, and is padded
on the left to the batch's length (or the batch to its own).

`PrefixStore` keeps the prompt caches of the last few prompts prefilled: a new prompt that
begins with the same tokens (a system prompt, a few-shot block) starts from the longest such
prefix and computes only the rest.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

# A prompt reuses a stored prefix only when they share at least this many tokens: below that,
# copying the prefix costs about what computing it would.
MIN_SHARED_PREFIX = 16
PREFIX_SLOTS = 4  # prompts whose caches are kept for the prompts after them


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
        layers = []
        for i, (keys, values) in enumerate(prompts[0].layers):
            shape = (rows, keys.shape[1], width, keys.shape[3])
            new = [keys.new_zeros(shape), values.new_zeros(shape[:3] + (values.shape[3],))]
            for t, tensor in enumerate(new):
                if old is not None:
                    tensor[: self.rows, :, width - self.width :] = old[i][t]
                for b, prompt in enumerate(prompts, start=self.rows):
                    tensor[b, :, width - len(prompt.ids) :] = prompt.layers[i][t][0]
            layers.append(tuple(new))
        self.cache, self.mask = dynamic_cache(layers), mask

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
        self.cache = dynamic_cache(
            [(k[index, :, first:], v[index, :, first:]) for k, v in layer_tensors(self.cache)]
        )

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
