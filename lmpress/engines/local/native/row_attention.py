"""Attention over the slot cache of NATIVE's decoding rows (batch_cache.py), one call a layer.

A decoding step passes the model its own attention mask, which carries the step's `StepMask`;
`use_row_attention` registers an attention function with transformers (its AttentionInterface)
that runs the model's own attention once over all rows' slots with that mask (the one for the
layer's sliding window, if it has one), and hands everything else (a prompt's prefill, a vision
tower) to the model's own attention unchanged. Over an int8 cache, whose keys are held rotated
(int8_slots.py), it turns the query by the same rotation.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

from lmpress.engines.local.native.int8_slots import rotate
from lmpress.vocabulary.errors import ModelLoadError

PREFIX = "lmpress_rows_"
# Arguments sdpa_attention_forward acts on beyond the scale; a model passing any of them goes
# through it.
SDPA_EXTRAS = {"softcap", "position_bias", "s_aux", "sinks", "is_causal"}


def use_row_attention(model: Any) -> None:
    """Route the text model's attention through `row_attention`, around the implementation it
    was loaded with."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    config = model.config.get_text_config()
    own = config._attn_implementation or "eager"
    if own.startswith(PREFIX):
        return
    masks = ALL_MASK_ATTENTION_FUNCTIONS._global_mapping
    if own not in masks or (own != "eager" and own not in AttentionInterface._global_mapping):
        raise ModelLoadError(
            f"NATIVE cannot batch rows on attention '{own}' "
            "(set model.attn_implementation to sdpa or eager)"
        )
    name = PREFIX + own
    AttentionInterface.register(name, row_attention)
    AttentionMaskInterface.register(name, masks[own])
    config._attn_implementation = name


def row_attention(
    module: Any, query: Any, key: Any, value: Any, attention_mask: Any, **kwargs: Any
) -> tuple[Any, None]:
    own = own_attention(module)
    step = getattr(attention_mask, "lmpress_step", None)
    if step is None:
        return own(module, query, key, value, attention_mask, **kwargs)
    if step.apart is not None:
        return rows_apart(module, own, query, key, value, step, kwargs), None
    ragged, rotations = step.ragged, step.rotations
    if ragged is not None:
        query = ragged.to_rows(query)
    if rotations is not None:  # an int8 cache's keys are rotated (int8_slots.py)
        query = rotate(query, rotations[query.shape[-1]]).to(query.dtype)
    window = kwargs.get("sliding_window")
    if own is sdpa_attention_forward() and not set(kwargs) & SDPA_EXTRAS:
        # From the module rather than the shapes where it can: under torch.compile with symbolic
        # sizes, dividing the shapes gives a symbolic size, which the mask's cache cannot key on.
        group = getattr(module, "num_key_value_groups", None) or query.shape[1] // key.shape[1]
        mask = step.mask(window, group)
        out = grouped_attention(query, key, value, mask, group, kwargs.get("scaling"))
    else:
        out, _ = own(module, query, key, value, step.mask(window), **kwargs)
    return (out if ragged is None else ragged.to_sequence(out)), None


def rows_apart(
    module: Any, own: Any, query: Any, key: Any, value: Any, step: Any, kwargs: dict[str, Any]
) -> Any:
    """A packed prefill's pass (packed_prefill.py): each row's new tokens attend to its own
    columns through the model's own attention, with the mask transformers gives a prompt fed
    alone after the tokens it has cached (StepMask.apart_masks), on tensors of the shapes it
    gets alone. So each prompt's numbers are the ones its prefill alone gives, whatever it is
    packed with. Returns the rows' outputs in the step's layout."""
    import torch

    ragged = step.ragged is not None  # the rows' tokens one sequence, [1, heads, total, dim]
    positions = kwargs.pop("position_ids", None)
    outs, start = [], 0
    for row, ((cached, new), mask) in enumerate(zip(step.apart, step.apart_masks, strict=True)):
        length, end = cached + new, start + new
        if positions is not None:
            kwargs["position_ids"] = positions[:, start:end] if ragged else positions[row : row + 1]
        out, _ = own(
            module,
            query[:, :, start:end] if ragged else query[row : row + 1],
            key[row : row + 1, :, :length].contiguous(),
            value[row : row + 1, :, :length].contiguous(),
            mask,
            **kwargs,
        )
        outs.append(out)
        start = end
    return torch.cat(outs, dim=1 if ragged else 0)


def grouped_attention(query: Any, key: Any, value: Any, mask: Any, group: int, scale: Any) -> Any:
    """What sdpa_attention_forward computes, for a decoding step's few new tokens a row: each
    key head's query heads are stacked as one head with `group` times the new tokens, so no
    key is copied for every query head (sdpa_attention_forward's repeat_kv, which it takes
    whenever there is a mask) and the CPU's flash kernel gets more than one query a head, the
    shape it is fast on (at bfloat16 and one new token a row, the unstacked call took seven
    times as long; at float32 and three tokens, nearly twice). The same kernel, so the same
    numbers.

    query: [rows, heads, new, dim]; key, value: [rows, kv_heads, columns, dim]; mask: the
    step's, stacked likewise (StepMask.mask). Returns [rows, new, heads, dim], as the attention
    functions do."""
    import torch

    rows, heads, new, dim = query.shape
    stacked = query.reshape(rows, key.shape[1], group * new, dim)
    out = torch.nn.functional.scaled_dot_product_attention(
        stacked, key, value, attn_mask=mask, scale=scale
    )
    return out.view(rows, heads, new, dim).transpose(1, 2).contiguous()


def own_attention(module: Any) -> Any:
    """The attention function the module's model was loaded with: a registered one, or the
    eager one of the module's modeling file."""
    from transformers import AttentionInterface

    own = module.config._attn_implementation.removeprefix(PREFIX)
    if own != "eager":
        return AttentionInterface._global_mapping[own]
    return sys.modules[type(module).__module__].eager_attention_forward


@functools.cache
def sdpa_attention_forward() -> Any:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward


def own_attention_back(model: Any) -> None:
    """Undo `use_row_attention`: the text model's attention is the one it was loaded with, for
    code that runs the model itself (`model.generate`, `generate_batch`)."""
    config = model.config.get_text_config()
    config._attn_implementation = config._attn_implementation.removeprefix(PREFIX)
