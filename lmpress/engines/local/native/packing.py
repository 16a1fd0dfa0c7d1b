"""NATIVE's linear layers on a CPU at float32, with their weights packed once for oneDNN.

`torch.nn.Linear` on a CPU multiplies by the weight as stored, row-major, at every call; a
decoding step of a few dozen tokens spends most of its time there, reading the weights. oneDNN
(bundled with PyTorch as mkldnn) can reorder a weight once into the blocked layout its kernels
read fastest and multiply by that from then on: what vLLM's CPU build and inductor's freezing
(`model.compile`) do. On SmolLM2-135M (2-core AMD EPYC, 48 chat prompts, 16 in flight, the same
greedy tokens both ways) the packed layers ran 1.28 to 1.30 times as fast at float32. At
bfloat16 they ran 0.81 to 0.93 times as fast end to end, though each matmul alone was faster,
so bfloat16 layers stay plain.

`pack_linears` packs every float32 `torch.nn.Linear` of a model on the CPU and points the
layer's forward at the packed weight; GPT-2's Conv1D layers, which store their weights
transposed, stay plain. The original weight stays: the model's parameters, tied embeddings and
anything reading `weight` see it unchanged, so the packed copy costs the linear weights' memory
once more. `model.model_kwargs.pack_weights: false` keeps the plain layers.
"""

from __future__ import annotations

import types
from typing import Any

# The tokens a call is expected to carry, a hint oneDNN picks its layout by: a decoding step's
# rows. Any other count is still multiplied correctly.
LAYOUT_TOKENS = 16


def pack_linears(model: Any) -> None:
    """Pack the weights of the model's float32 linear layers on the CPU (see the module
    docstring); none without oneDNN."""
    import torch

    if not torch.backends.mkldnn.is_available():
        return
    for module in model.modules():
        if not isinstance(module, torch.nn.Linear):
            continue
        weight = module.weight
        if weight.device.type != "cpu" or weight.dtype != torch.float32:
            continue
        with torch.no_grad():
            module.lmpress_packed = torch.ops.mkldnn._reorder_linear_weight(
                weight.detach(), LAYOUT_TOKENS
            )
        module.forward = types.MethodType(packed_forward, module)


def packed_forward(self: Any, x: Any) -> Any:
    """A packed layer's forward: the same product as `torch.nn.Linear.forward`, on the packed
    weight. An input of another dtype or device, or one that needs gradients, goes through the
    plain layer, which handles it as it would."""
    import torch

    if x.dtype != self.weight.dtype or x.device.type != "cpu" or torch.is_grad_enabled():
        return torch.nn.functional.linear(x, self.weight, self.bias)
    return torch.ops.mkldnn._linear_pointwise(x, self.lmpress_packed, self.bias, "none", [], "")
