"""`model.kv_cache_dtype: int8` on NATIVE: the slot cache's keys and values (batch_cache.py) held
as int8: with the buffers attention reads a layer from, on SmolLM2, 0.30 of float32's bytes and
0.55 of bfloat16's.

Each token's key (or value) of one head is quantized on its own, symmetric: its scale is its
largest magnitude over the head's dimension / 127, and each element the nearest whole multiple
of it (off by at most half a step). Tokens are quantized as they are written (a step's new
tokens, a joining prompt's cache) and dequantized when a layer's columns are read for
attention, one layer at a time into one buffer, so only one layer's float copy exists at once.
Copying slots (rows leaving, beams reordering, the cache growing) moves the int8 and the scales
as they are, never rounding twice.

Keys are rotated by a Hadamard matrix before they are quantized, and stay rotated. A few
channels of a head's keys are many times the others (on SmolLM2 the largest channel's mean
magnitude is 9 to 14 times the median's), so a scale sized to them leaves the rest a handful of
steps; the rotation spreads every channel over all of them. Attention reads the rotated keys as
they are: `StepMask.rotations` has row_attention.py rotate the step's query the same way
(rotated query times rotated key is query times key), a few tokens a row; unrotating every
column as it is read would add about 40 ms to a 16-row step of 60. Measured on SmolLM2,
64 greedy rows of 24 tokens against the unquantized cache (rows matching, and the mean change
in the chosen tokens' logprobs before a row parts): unrotated, 37 and 0.016 nats, nearly all
of it the keys' (values alone: 61 and 0.004); keys rotated, 52 to 58 and 0.008; values rotated too,
no better (0.0082 against 0.0087 nats over 128 rows of 64 tokens), so they are not, and
attention's output needs no turning back; a scale per 16 elements instead of a rotation, 56
and 0.009 at four times the scales' bytes. A cache rounded to bfloat16 gives 59 and 0.003:
SmolLM2's greedy rows meet near ties (21 of these 64 a top-2 gap under 0.03 nats).

The scales are held in the model's dtype, which is what the columns come out in: a float32
scale would add two bytes a head and token at bfloat16 for precision the product drops. Each
element is rounded against the scale as stored, so the scale's own rounding costs nothing.
"""

from __future__ import annotations

import functools
from typing import Any

LEVELS = 127  # int8's symmetric range, -127 to 127


class Int8Slots:
    """A slot tensor [slots, heads, capacity, dim] held as int8 `codes` and their `scales`,
    [slots, heads, capacity] in the model's dtype; keys rotated first (`rotation`, [dim, dim];
    None for values). It answers what
    `BatchCache` asks of a plain one: its shape, dtype (what it reads out in) and device,
    indexing over its first three dimensions (a view, or a copy for tensor indices, of both),
    assigning another's int8 as it is, and `copy_` of float values, which quantizes them."""

    def __init__(self, codes: Any, scales: Any, rotation: Any = None):
        self.codes, self.scales, self.rotation = codes, scales, rotation

    @classmethod
    def zeros(
        cls, shape: tuple[int, int, int, int], dtype: Any, device: Any, rotated: bool
    ) -> Int8Slots:
        import torch

        codes = torch.zeros(shape, dtype=torch.int8, device=device)
        scales = torch.zeros(shape[:3], dtype=dtype, device=device)
        return cls(codes, scales, hadamard(shape[-1], str(device)) if rotated else None)

    @property
    def shape(self) -> Any:
        return self.codes.shape

    @property
    def dtype(self) -> Any:
        return self.scales.dtype

    @property
    def device(self) -> Any:
        return self.codes.device

    def __getitem__(self, index: Any) -> Int8Slots:
        return Int8Slots(self.codes[index], self.scales[index], self.rotation)

    def __setitem__(self, index: Any, other: Int8Slots) -> None:
        self.codes[index] = other.codes
        self.scales[index] = other.scales

    def copy_(self, states: Any) -> Int8Slots:
        """Write float `states`, shaped as this view, quantized."""
        self.codes.copy_(self._quantize(states, self.scales))
        return self

    def put(self, where: tuple[Any, Any], states: Any) -> None:
        """Write a step's new tokens, `states` [rows, heads, new, dim], quantized, at the
        (slot, column) of each (`BatchCache.where`)."""
        scales = states.new_empty(states.shape[:3], dtype=self.dtype)
        codes = self._quantize(states, scales)
        self.codes.transpose(1, 2).index_put_(where, codes.transpose(1, 2))
        self.scales.transpose(1, 2).index_put_(where, scales.transpose(1, 2))

    def read(self, rows: Any, columns: Any, out: Any) -> Any:
        """The first `rows` slots' first `columns` columns in the model's dtype (keys still
        rotated), written to the start of `out` (flat, in the model's dtype). Every layer
        reads into the same buffer: one allocated a read was mapped and faulted in anew each
        time (batch_cache.py's `give_freed_caches_back`), 19 ms of a 16-row step against 6."""
        import torch

        codes, scales = self.codes[:rows, :, :columns], self.scales[:rows, :, :columns, None]
        if torch.compiler.is_compiling():
            # Inductor plans the graph's own buffers; one written by every layer ran the tiny
            # model's compiled step at half the speed (its writes kept apart, copied back).
            return codes.to(self.dtype) * scales
        read = out[: codes.numel()].view(codes.shape)
        return read.copy_(codes).mul_(scales)

    def _quantize(self, states: Any, scales: Any) -> Any:
        """`states` [..., dim] as int8 codes (rotated first, for keys); their scales [...] are
        written into `scales`, whose dtype they are kept in. The arithmetic is float32's."""
        import torch

        x = states.float() if self.rotation is None else rotate(states, self.rotation)
        scales.copy_(x.abs().amax(-1) / LEVELS)
        # Against the scale as stored; a scale of 0 (a zero vector) divides by the smallest
        # float, which leaves zeros zero.
        step = scales.float().clamp(min=torch.finfo(torch.float32).tiny)
        return (x / step[..., None]).round_().clamp_(-LEVELS, LEVELS).to(torch.int8)


def rotate(x: Any, rotation: Any) -> Any:
    """`x` [..., dim] times `rotation`, in float32. Flattened to a matrix first: a step's keys
    come as a transposed view, which matmul took 50 times as long over (0.5 ms a call)."""
    return (x.float().reshape(-1, x.shape[-1]) @ rotation).view(x.shape)


@functools.cache
def hadamard(dim: int, device: str) -> Any:
    """An orthonormal Hadamard matrix [dim, dim], float32: Sylvester's on the largest power of
    two dividing `dim`, repeated down the diagonal for the rest (a head of 80 gets five of 16)."""
    import torch

    block = dim & -dim
    h = torch.ones(1, 1)
    while h.shape[0] < block:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)])
    h = torch.block_diag(*[h / block**0.5] * (dim // block))
    return h.to(device)
