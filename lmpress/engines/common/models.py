"""Where a local engine's model comes from, and the dtype names recipes use for it.

`model.model_name` (and tokenizer_name, adapter_model) is a local path, one of lmpress's own
model names (a packaged model, a tiny model built on first use) or a hub id; `local_or_hub`
turns it into what a loader takes. NATIVE and VLLM both read `model.torch_dtype_str`, with the
same short forms and one rule for `auto` (`auto_dtype`): float32 on a CPU, bfloat16 on a CUDA
GPU (float16 on one without bfloat16), whatever the checkpoint's own dtype. So one recipe means
the same arithmetic on both engines; vLLM's own `auto` would take bfloat16 on a CPU, where
SmolLM2-135M then answers a different first token than in float32.
"""

from __future__ import annotations

from pathlib import Path

from lmpress.builtin_models.packaged import resolve_packaged_name
from lmpress.builtin_models.tiny import resolve_model_name
from lmpress.builtin_models.tiny_gguf import resolve_gguf_name
from lmpress.vocabulary.errors import ModelLoadError

# Short forms people write for torch's dtype names.
DTYPE_ALIASES = {
    "bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32",
    "float": "float32",
}  # fmt: skip
DTYPE_CHOICES = "auto, bfloat16, float16 or float32"  # what an error message suggests


def dtype_name(value: str) -> str:
    """torch's name for `model.torch_dtype_str`: a short form resolved, anything else as given."""
    return DTYPE_ALIASES.get(value, value)


def auto_dtype(*, cuda: bool, bf16_supported: bool) -> str:
    """What `model.torch_dtype_str: auto` means on NATIVE and VLLM: float32 on a CPU (where
    half precision is slower or emulated, and flips near-ties of small models), bfloat16 on a
    CUDA GPU, or float16 on one that lacks bfloat16."""
    if not cuda:
        return "float32"
    return "bfloat16" if bf16_supported else "float16"


def cuda_dtype_facts() -> tuple[bool, bool]:
    """Whether torch sees a CUDA GPU here, and whether it does bfloat16 (imports torch)."""
    import torch

    cuda = torch.cuda.is_available()
    return cuda, bool(cuda and torch.cuda.is_bf16_supported())


def dtype_in_use(chosen: str, device_map: str | None = None) -> str:
    """The dtype a model asked for in `chosen` (a `torch_dtype_str`, or vLLM's `dtype`) loads
    in on this machine, for `lmpress config show`: a short form resolved, `auto` by
    `auto_dtype`; a `device_map` naming a device says whether that is a GPU. Imports torch to
    see the GPU, not a backend."""
    chosen = dtype_name(chosen.lower())
    if chosen != "auto":
        return chosen
    cuda, bf16 = cuda_dtype_facts()
    if device_map not in (None, "auto"):
        cuda = device_map.startswith("cuda")
    return auto_dtype(cuda=cuda, bf16_supported=bf16)


def local_or_hub(name: str, key: str) -> str:
    """A local model path, expanded and checked to exist, or a hub id as given."""
    if not name:
        raise ModelLoadError(f"{key} is empty; give a model directory or a hub id")
    name = resolve_gguf_name(resolve_packaged_name(resolve_model_name(name)))
    path = Path(name).expanduser()
    if path.exists():
        return str(path)
    if name.startswith((".", "/", "~")):
        raise ModelLoadError(f"{key}: '{name}' does not exist")
    return name
