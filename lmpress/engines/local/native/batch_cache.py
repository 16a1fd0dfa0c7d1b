"""The KV cache behind NATIVE's continuous batching, which lmpress keeps itself.

The rows decoding now share one slot cache (`BatchCache`): for every layer, one keys and one
values tensor of [slots, heads, capacity, dim], zero-initialised, a row to a slot. The live rows
always hold slots [0, n): a row that ends (`leave`) hands its slot to the last live row, one copy
a layer, and a row that joins (`join`) copies in the cache of its own prompt, prefilled on its
own. The capacity grows for all slots at once, `GROW_COLUMNS` at a time, so the cache holds
rows x longest row rather than each row's own length: what static `generate` holds too.

A step writes every row's new tokens with one `index_put_` a layer and attention reads the
rows' columns up to the longest, in one call a layer (row_attention.py), under a mask built
once a step from each row's length. A row may carry several new tokens in a step (the drafts a
speculative step verifies); the step keeps as many of them as the row emitted (`keep`), and the
columns past that are written over later.

With `model.kv_cache_dtype: int8` each layer's keys and values are `Int8Slots` (int8_slots.py):
quantized as tokens are written, dequantized a layer at a time as attention reads them, copied
as they are. Prompt caches (`PromptCache`, `PrefixStore`) stay in the model's dtype: they are
one prompt's, and short-lived.

`PrefixStore` keeps the prompt caches of the last few prompts prefilled: a new prompt that
begins with the same tokens (a system prompt, a few-shot block) starts from the longest such
prefix and computes only the rest.
"""

from __future__ import annotations

import functools
import inspect
from collections import deque
from dataclasses import dataclass
from typing import Any

from lmpress.engines.local.native.int8_slots import Int8Slots

# A prompt reuses a stored prefix only when they share at least this many tokens: below that,
# copying the prefix costs about what computing it would.
MIN_SHARED_PREFIX = 16
PREFIX_SLOTS = 4  # prompts whose caches are kept for the prompts after them
# The slot cache grows by this many columns at once: every growth copies the whole cache, and
# more columns cost memory in every slot.
GROW_COLUMNS = 256
# Attention reads the columns up to the longest row's, rounded up to this: fewer distinct shapes
# for the kernels, and a little padding.
MASK_COLUMNS = 64


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


def cache_argument(model: Any) -> str:
    """The name the model's forward takes and returns its KV cache by: `cache` from
    transformers 5.24 on, where `past_key_values` is deprecated (and goes in 5.40);
    `past_key_values` before it."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def layer_tensors(cache: Any) -> list[tuple[Any, Any]]:
    return [(layer.keys, layer.values) for layer in cache.layers]


def dynamic_cache(layers: list[tuple[Any, Any]]) -> Any:
    from transformers import DynamicCache

    return DynamicCache(layers)


def round_up(n: int, step: int) -> int:
    return -(-n // step) * step


@dataclass
class Ragged:
    """How a ragged step's tokens, one sequence in row order, map to [rows, widest] and back:
    `spread` [rows, widest] gives each place's token in the sequence (a row's places past its
    own tokens repeat its last), and `real` the places of the sequence's tokens in [rows,
    widest], flattened."""

    spread: Any
    real: Any

    @classmethod
    def of(cls, counts: Any, ahead: Any) -> Ragged:
        """For rows carrying `counts` tokens, [rows]; `ahead`: each place's token within its
        row, [rows, widest]."""
        import torch

        starts = torch.cumsum(counts, 0) - counts
        width = ahead.shape[1]
        real = torch.arange(width, device=counts.device)[None, :] < counts[:, None]
        return cls(spread=starts[:, None] + ahead, real=real.flatten().nonzero().squeeze(1))

    def to_rows(self, query: Any) -> Any:
        """A query [1, heads, total, dim] -> [rows, heads, widest, dim]."""
        return query[0][:, self.spread].transpose(0, 1)

    def to_sequence(self, out: Any) -> Any:
        """An attention output [rows, widest, heads, dim] -> [1, total, heads, dim]."""
        rows, width = out.shape[:2]
        return out.reshape(rows * width, *out.shape[2:])[self.real][None]


class StepMask:
    """One step's attention masks, [rows, 1, new tokens, columns], additive: a row's new token
    j attends to the row's columns up to its own position, and on a layer with a sliding
    window only to the last `window` of them. Built for each window when a layer first asks."""

    def __init__(
        self,
        positions: Any,
        columns: int,
        dtype: Any,
        ragged: Ragged | None = None,
        rotations: dict[int, Any] | None = None,
        apart: list[tuple[int, int]] | None = None,
    ):
        import torch

        self.ragged = ragged  # a ragged step's layout, None for one of equal rows
        # A packed prefill's pass (packed_prefill.py): each row's (columns cached, new tokens),
        # for row_attention.rows_apart; None for a decoding step.
        self.apart = apart
        # The rotation of an int8 cache's keys, by head width (int8_slots.py), which attention
        # turns its query by; None for a plain cache.
        self.rotations = rotations
        self.positions = positions[:, None, :, None]  # each new token's column
        self.columns = torch.arange(columns, device=positions.device)
        self.dtype = dtype
        self.masks: dict[tuple[int | None, int], Any] = {}

    @functools.cached_property
    def apart_masks(self) -> list[Any]:
        """A packed prefill's rows' masks (`apart`), as transformers gives a prompt fed alone
        after the columns it has cached: None with none (causal attention), else a boolean one,
        [1, 1, new tokens, cached + new]. Built once, for every layer."""
        import torch

        device = self.columns.device
        masks = []
        for cached, new in self.apart or []:
            own = torch.arange(cached, cached + new, device=device)[:, None]
            masks.append(
                (torch.arange(cached + new, device=device) <= own)[None, None] if cached else None
            )
        return masks

    def mask(self, window: int | None, group: int = 1) -> Any:
        """The mask for a layer with this sliding window (None: none); with `group` > 1, for
        queries stacked `group` heads to a key head (row_attention.grouped_attention):
        [rows, 1, group * new tokens, columns]."""
        if (window, group) in self.masks:
            return self.masks[window, group]
        if group > 1:
            mask = self.mask(window)
            rows, _, new, columns = mask.shape
            stacked = mask.expand(rows, group, new, columns).reshape(rows, 1, group * new, columns)
            self.masks[window, group] = stacked
            return stacked
        import torch

        allowed = self.columns <= self.positions
        if window:
            allowed &= self.columns > self.positions - window
        blocked = torch.finfo(self.dtype).min  # as transformers' own masks: never -inf
        mask = torch.zeros(allowed.shape, dtype=self.dtype, device=allowed.device)
        self.masks[window, 1] = mask.masked_fill_(~allowed, blocked)
        return self.masks[window, 1]


@functools.cache
def slots_layer_class() -> type:
    from transformers.cache_utils import DynamicLayer

    class SlotsLayer(DynamicLayer):
        """One layer of a `BatchCache` as the model sees it: `update` writes the rows' new
        tokens in place and returns every live slot's columns up to the step's width. The
        step passes its own mask (`StepMask`), so the model asks no mask sizes of it."""

        def __init__(self, batch: BatchCache, index: int):
            super().__init__()
            self.batch, self.index, self.is_initialized = batch, index, True

        def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> Any:
            keys, values = self.batch.layers[self.index]
            # The rows and columns as tensor sizes, not Python ints, so that a compiled step
            # (loading.compiled_decode) takes them as symbols rather than recompiling for each.
            where, n, columns = (
                self.batch.where,
                self.batch.step.positions.shape[0],
                self.batch.step.columns.shape[0],
            )
            if isinstance(keys, Int8Slots):
                keys.put(where, key_states)
                values.put(where, value_states)
                reads = self.batch.reads
                return keys.read(n, columns, reads[0]), values.read(n, columns, reads[1])
            keys.transpose(1, 2).index_put_(where, key_states.transpose(1, 2))
            values.transpose(1, 2).index_put_(where, value_states.transpose(1, 2))
            return keys[:n, :, :columns], values[:n, :, :columns]

        def get_seq_length(self) -> int:
            # Rows differ in length; the step passes each token's position and its own mask,
            # so no single length is asked for anything.
            return 0

        def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
            return query_length, 0

    return SlotsLayer


class BatchCache:
    """The rows decoding now, in slot order: the slot cache, each row's length, and the cache
    the model's forward pass takes for one step of all of them."""

    def __init__(self, int8: bool = False) -> None:
        self.int8 = int8  # the layers are `Int8Slots` (model.kv_cache_dtype: int8)
        self.lengths: list[int] = []  # the tokens each live slot holds
        self.needs: list[int] = []  # the columns each live slot may come to hold
        # per layer: keys, values [slots, heads, capacity, dim]
        self.layers: list[tuple[Any, Any]] = []
        # int8: two buffers of one layer's keys and values in the model's dtype, flat, which
        # every layer's read fills in turn (Int8Slots.read); counted in the budget
        self.reads: list[Any] = []
        self.where: tuple[Any, Any] = ()  # the step's (slot, column) of each new token
        self.step: StepMask | None = None  # the step's mask, and the columns attention reads
        self._cache: Any = None

    @property
    def slots(self) -> int:
        return self.layers[0][0].shape[0] if self.layers else 0

    @property
    def capacity(self) -> int:
        return self.layers[0][0].shape[2] if self.layers else 0

    def columns(self) -> int:
        """The cache columns allocated now, all slots and all their columns."""
        return self.slots * self.capacity

    def columns_with(self, needs: list[int]) -> int:
        """The columns the cache may come to allocate with rows of these needs added."""
        rows = max(self.slots, len(self.lengths) + len(needs))
        return rows * max([self.capacity, *self.needs, *needs])

    def join(self, prompts: list[PromptCache], needs: list[int]) -> None:
        """Add a row after the last for each prompt, starting from its cache; `needs`: the
        columns each may come to hold."""
        if not prompts:
            return
        n = len(self.lengths)
        lengths = [prompt.layers[0][0].shape[-2] for prompt in prompts]
        self.needs += needs
        self._reserve(n + len(prompts), max(self.lengths + lengths), prompts[0].layers)
        for slot, prompt in enumerate(prompts, start=n):
            for (keys, values), (k, v) in zip(self.layers, prompt.layers, strict=True):
                keys[slot, :, : k.shape[-2]].copy_(k[0])
                values[slot, :, : v.shape[-2]].copy_(v[0])
        self.lengths += lengths

    def leave(self, indices: list[int]) -> list[int]:
        """Drop these rows: the last live rows move into the slots they leave. Returns the
        rows' old indices in their new slot order."""
        n, gone = len(self.lengths), set(indices)
        kept = n - len(gone)
        holes = [i for i in sorted(gone) if i < kept]
        movers = [i for i in range(kept, n) if i not in gone]
        order = list(range(n))
        if holes:
            import torch

            device = self.layers[0][0].device
            to, source = torch.tensor(holes, device=device), torch.tensor(movers, device=device)
            width = max(self.lengths[i] for i in movers)
            for keys, values in self.layers:
                keys[to, :, :width] = keys[source, :, :width]
                values[to, :, :width] = values[source, :, :width]
            for hole, mover in zip(holes, movers, strict=True):
                order[hole] = mover
        order = order[:kept]
        self.lengths = [self.lengths[i] for i in order]
        self.needs = [self.needs[i] for i in order]
        if not order:
            # an empty batch gives its memory back
            self.layers, self.reads, self._cache = [], [], None
        return order

    def reorder(self, moves: list[tuple[int, int]]) -> None:
        """Each (slot, source) pair: the slot now holds what the source slot holds (a beam
        search's beams continuing others; beams.py). Every source is read before any slot is
        written."""
        import torch

        device = self.layers[0][0].device
        to = torch.tensor([slot for slot, _ in moves], device=device)
        source = torch.tensor([source for _, source in moves], device=device)
        width = max(self.lengths[source] for _, source in moves)
        for keys, values in self.layers:
            keys[to, :, :width] = keys[source, :, :width]  # indexing copies the sources first
            values[to, :, :width] = values[source, :, :width]

    def keep(self, counts: list[int]) -> None:
        """Each row keeps this many of the step's new tokens."""
        self.lengths = [length + count for length, count in zip(self.lengths, counts, strict=True)]

    def drop(self, counts: list[int]) -> None:
        """Each row forgets its last this many columns (a draft model's refused drafts)."""
        self.lengths = [length - count for length, count in zip(self.lengths, counts, strict=True)]

    def step_inputs(self, widths: int | list[int] = 1, apart: bool = False) -> tuple[Any, Any, Any]:
        """For each row's new tokens this step (`widths`: how many each row carries, or one
        count for all): their positions, the cache to pass the model, and the step's attention
        mask (a `StepMask`'s, which it carries for row_attention.py). Rows count none of them
        until `keep`. `apart`: attention takes each row on its own (a packed prefill's pass).

        Rows carrying as many tokens each step as one tensor [rows, width]. Rows carrying
        unequal counts (a speculative step whose rows verify different numbers of drafts) step
        ragged: their tokens are one sequence, [1, total], so no row's matmuls carry padding,
        and the step's `Ragged` lays them out [rows, widest] for attention alone."""
        import torch

        rows = len(self.lengths)
        if isinstance(widths, int):
            widths = [widths] * rows
        width = max(widths)
        longest = max(length + w for length, w in zip(self.lengths, widths, strict=True))
        # A column to spare: the columns read are always a view narrower than the cache, one
        # layout for a compiled step (loading.compiled_decode) rather than two.
        self._reserve(rows, longest + 1, self.layers)
        device = self.layers[0][0].device
        lengths = torch.tensor(self.lengths, device=device)
        ahead = torch.arange(width, device=device)
        ragged = None
        if min(widths) < width:
            counts = torch.tensor(widths, device=device)
            # A row's places past its own tokens repeat its last: attention computes them
            # like it, and nothing reads them.
            ahead = torch.minimum(ahead[None, :], counts[:, None] - 1)
            ragged = Ragged.of(counts, ahead)
        positions = lengths[:, None] + ahead  # each row's, [rows, width]
        slots = torch.arange(rows, device=device)[:, None].expand_as(positions)
        if ragged is None:
            self.where = (slots, positions)
        else:
            real = ragged.real
            self.where = (slots.flatten()[real][None], positions.flatten()[real][None])
        columns = min(round_up(longest, MASK_COLUMNS), self.capacity - 1)
        rotations = None
        if self.int8:
            rotations = {keys.shape[-1]: keys.rotation for keys, _ in self.layers}
        step = self.step = StepMask(
            positions, columns, self.layers[0][0].dtype, ragged, rotations,
            list(zip(self.lengths, widths, strict=True)) if apart else None,
        )  # fmt: skip
        mask = step.mask(None)
        mask.lmpress_step = step
        if self._cache is None:
            from transformers import DynamicCache

            self._cache = DynamicCache()
            layer = slots_layer_class()
            self._cache.layers = [layer(self, i) for i in range(len(self.layers))]
        return (positions if ragged is None else self.where[1]), self._cache, mask

    def _reserve(self, rows: int, columns: int, like: list[tuple[Any, Any]]) -> None:
        """Room for `rows` slots of `columns` columns, in tensors shaped as `like`'s."""
        if rows <= self.slots and columns <= self.capacity:
            return
        capacity = max(
            self.capacity, columns, min(round_up(columns, GROW_COLUMNS), max(self.needs))
        )
        slots = max(self.slots, rows)
        n, width = len(self.lengths), max(self.lengths, default=0)
        layers = []
        for i, (k, v) in enumerate(like):
            keys = self._zeros(k, slots, capacity, keys=True)
            values = self._zeros(v, slots, capacity)
            if self.layers and n:
                keys[:n, :, :width] = self.layers[i][0][:n, :, :width]
                values[:n, :, :width] = self.layers[i][1][:n, :, :width]
            layers.append((keys, values))
        self.layers = layers
        if self.int8:
            most = max(t.codes.numel() for layer in layers for t in layer)
            self.reads = [layers[0][0].scales.new_empty(most) for _ in range(2)]

    def _zeros(self, like: Any, slots: int, capacity: int, keys: bool = False) -> Any:
        """Empty keys or values of `slots` x `capacity` with the heads and width of `like`
        (int8: the keys rotated, int8_slots.py)."""
        shape = (slots, like.shape[-3], capacity, like.shape[-1])
        if self.int8:
            return Int8Slots.zeros(shape, like.dtype, like.device, rotated=keys)
        return like.new_zeros(shape)

    def forward(
        self, model: Any, ids: list[list[int]], cache_arg: str, device: Any, compiled: Any = None
    ) -> Any:
        """One step of `model` over these rows, `ids` being each row's new tokens: their
        logits, [rows, widest, vocabulary]; a row carrying fewer than the widest has logits past
        its own that no one reads. `compiled`, a compiled form of the model's forward, takes
        the step when every row carries as many tokens and there are several rows: a lone row
        would compile a graph apart, and a ragged step (step_inputs) has a layout it does not
        take, so both run on the model's own forward."""
        import torch

        width = max(len(row) for row in ids)
        positions, cache, mask = self.step_inputs([len(row) for row in ids])
        ragged = mask.lmpress_step.ragged
        if ragged is None:
            tokens, keep = torch.tensor(ids, device=device), width
        else:
            tokens = torch.tensor([[t for row in ids for t in row]], device=device)
            keep = 0  # every token's
        forward = compiled if compiled is not None and len(ids) > 1 and ragged is None else model
        out = forward(
            input_ids=tokens,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=keep,
            **{cache_arg: cache},
        )
        return out.logits if ragged is None else out.logits[0][ragged.spread]


class PrefixStore:
    """The caches of the last few prompts, for the prompts after them that share a prefix."""

    def __init__(self, slots: int = PREFIX_SLOTS):
        self.stored: deque[PromptCache] = deque(maxlen=slots)

    def longest(self, ids: list[int], limit: int | None = None) -> tuple[PromptCache | None, int]:
        """The stored prompt sharing the longest prefix with `ids`, and how many tokens, at
        most `limit`: the positions whose logits are wanted must be computed (the last token's,
        which pick the first new token, by default; a scored prompt's from its first scored
        token's position)."""
        limit = len(ids) - 1 if limit is None else limit
        best, best_shared = None, 0
        for stored in self.stored:
            shared = shared_prefix(stored.ids, ids, limit)
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
