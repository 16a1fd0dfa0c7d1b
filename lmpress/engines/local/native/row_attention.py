"""Attention over the slot cache of NATIVE's decoding rows (batch_cache.py), one call a layer.

A decoding step passes the model its own attention mask, which carries the step's `StepMask`;
`use_row_attention` registers an attention function with transformers (its AttentionInterface)
that runs the model's own attention once over all rows' slots with that mask (the one for the
layer's sliding window, if it has one), and hands everything else (a prompt's prefill, a vision
tower) to the model's own attention unchanged.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

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
    mask = step.mask(kwargs.get("sliding_window"))
    if own is sdpa_attention_forward() and not set(kwargs) & SDPA_EXTRAS:
        # What sdpa_attention_forward does, without its checks and without copying the keys
        # for every query head (its repeat_kv, which it takes whenever there is a mask).
        import torch

        # From the module rather than the shapes: under torch.compile with symbolic sizes,
        # comparing the shapes gives a symbolic bool, which the kernel does not take.
        groups = getattr(module, "num_key_value_groups", None)
        gqa = groups > 1 if groups is not None else query.shape[1] != key.shape[1]
        out = torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, scale=kwargs.get("scaling"), enable_gqa=gqa
        )
        return out.transpose(1, 2).contiguous(), None
    return own(module, query, key, value, mask, **kwargs)


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
