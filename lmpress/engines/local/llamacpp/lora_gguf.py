"""LoRA adapters as llama.cpp loads them: a GGUF LoRA file, or a PEFT LoRA directory converted to
one once and kept in lmpress's cache.

A GGUF LoRA file says `general.type` "adapter", `adapter.type` "lora" and the architecture of
the model it was made for (llama.cpp refuses it on another), and holds a pair of tensors per
weight it changes, named after that weight: `blk.N.attn_q.weight.lora_a` of shape (rank, in)
and `.lora_b` of shape (out, rank), PEFT's own `lora_A` and `lora_B` orientation. llama.cpp adds
`lora_b @ (lora_a @ x)` times `adapter.lora.alpha / rank` to the weight's output, as PEFT adds
its delta times `lora_alpha / r`. Two things differ from PEFT's files and are converted here:
- names: transformers' module names become llama.cpp's (gguf's own name map for the base's
  architecture);
- order: llama.cpp's converter permutes the rows of the llama architecture's q and k weights
  (each head's two halves interleaved, for its rotary embedding), so their `lora_b` rows are
  permuted the same way, k's by the key-value heads.
A PEFT scale llama.cpp cannot express with one alpha (rsLoRA's `alpha / sqrt(r)`, or a module
of `alpha_pattern`) is folded into that module's `lora_b`. What llama.cpp cannot apply at all
(DoRA, biases, whole modules saved, embeddings) is a one-line error naming the adapter.

A converted file is named by a digest of the adapter's files and the base's facts it depends
on, written to a scratch file and renamed into place, so processes converting at once never
read half a file and a changed adapter is converted again.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmpress.vocabulary.errors import ConfigError

# Bump when what a converted file holds changes, so older conversions are not read.
CONVERTER_VERSION = 1
GGUF_MAGIC = b"GGUF"
# Architectures whose llama.cpp GGUF holds q and k rows permuted from transformers' order
# (convert_hf_to_gguf.py's LlamaModel and its subclasses that keep `undo_permute`).
PERMUTED_ARCHITECTURES = frozenset({"llama", "granite", "granitemoe"})
# PEFT config keys that change what the adapter computes beyond `lora_b @ lora_a * scale`.
_VARIANTS = {
    "use_dora": "DoRA",
    "lora_bias": "a bias on lora_B",
    "use_qalora": "QA-LoRA",
    "use_bdlora": "block-diagonal LoRA",
    "alora_invocation_tokens": "activated LoRA",
    "modules_to_save": "whole modules saved beside the adapter",
    "trainable_token_indices": "trained token embeddings",
    "target_parameters": "LoRA on parameters rather than modules",
    "layer_replication": "replicated layers",
}


@dataclass(frozen=True)
class BaseFacts:
    """What a conversion needs of the base model, read from its GGUF metadata."""

    architecture: str
    n_head: int
    n_head_kv: int
    n_blocks: int

    @classmethod
    def of(cls, metadata: dict[str, str]) -> BaseFacts:
        arch = metadata.get("general.architecture", "")
        n_head = int(metadata.get(f"{arch}.attention.head_count", "0") or 0)
        n_head_kv = int(metadata.get(f"{arch}.attention.head_count_kv", "0") or 0) or n_head
        return cls(arch, n_head, n_head_kv, int(metadata.get(f"{arch}.block_count", "0") or 0))


def lora_file(name: str, path: str, base: BaseFacts, cache_dir: Path | None = None) -> Path:
    """The GGUF LoRA file for `model.adapters.NAME`: `path` itself if it is one (checked to be
    a LoRA adapter for the base's architecture), else its PEFT directory converted (cached)."""
    key = f"model.adapters.{name}"
    source = Path(path).expanduser()
    if source.is_file():
        check_gguf_lora(key, source, base.architecture)
        return source
    if not (source / "adapter_config.json").is_file():
        raise ConfigError(
            f"{key}: '{path}' is neither a GGUF LoRA file nor a PEFT LoRA directory (one with "
            f"adapter_config.json)"
        )
    config = json.loads((source / "adapter_config.json").read_text())
    check_peft_config(key, config)
    weights = _weights_file(key, source)
    from lmpress.builtin_models.tiny import cache_root

    digest = hashlib.sha256(repr((CONVERTER_VERSION, base)).encode())
    for part in (source / "adapter_config.json", weights):
        digest.update(part.read_bytes())
    target = (cache_dir or cache_root()) / "lora-gguf" / f"{digest.hexdigest()[:24]}.gguf"
    if not target.exists():
        tensors = lora_tensors(key, _read_weights(weights), config, base)
        _write_atomically(target, base.architecture, float(config["lora_alpha"]), tensors)
    return target


def check_gguf_lora(key: str, path: Path, architecture: str) -> None:
    """A GGUF file given as an adapter: a LoRA adapter made for `architecture`."""
    with path.open("rb") as f:
        if f.read(4) != GGUF_MAGIC:
            raise ConfigError(f"{key}: '{path}' is not a GGUF file (nor a PEFT LoRA directory)")
    from gguf import GGUFReader

    fields = GGUFReader(path).fields

    def text(field: str) -> str:
        value = fields.get(field)
        return value.contents() if value is not None else ""

    if text("general.type") != "adapter" or text("adapter.type") != "lora":
        raise ConfigError(f"{key}: '{path}' is a GGUF file but not a LoRA adapter")
    if text("general.architecture") != architecture:
        raise ConfigError(
            f"{key}: '{path}' is a LoRA adapter for the {text('general.architecture')!r} "
            f"architecture; the model is {architecture!r}"
        )


def check_peft_config(key: str, config: dict[str, Any]) -> None:
    """A PEFT config whose adapter llama.cpp can apply: a plain LoRA."""
    if config.get("peft_type", "LORA") != "LORA":
        raise ConfigError(f"{key}: a {config['peft_type']} adapter; llama.cpp applies LoRA only")
    if config.get("bias", "none") != "none":
        raise ConfigError(
            f"{key}: the adapter trains biases (bias: {config['bias']}); llama.cpp applies "
            f"LoRA matrices only: train it with bias 'none'"
        )
    for field, what in _VARIANTS.items():
        if config.get(field):
            raise ConfigError(
                f"{key}: the adapter uses {what} ({field}), which llama.cpp cannot apply; "
                f"merge it into the model, or run it on the NATIVE engine"
            )


def lora_tensors(
    key: str, state: dict[str, Any], config: dict[str, Any], base: BaseFacts
) -> Iterator[tuple[str, Any]]:
    """The GGUF LoRA tensors of a PEFT state dict (float32 numpy arrays), by llama.cpp name."""
    import gguf
    import numpy as np

    arches = {name: arch for arch, name in gguf.MODEL_ARCH_NAMES.items()}
    if base.architecture not in arches:
        raise ConfigError(f"{key}: the gguf package does not know the {base.architecture!r} model")
    names = gguf.get_tensor_name_map(arches[base.architecture], base.n_blocks)
    alpha = float(config["lora_alpha"])
    for module, (a, b) in _pairs(key, state).items():
        gguf_name = names.get_name(module)
        if gguf_name is None or gguf_name == "token_embd":
            raise ConfigError(
                f"{key}: the adapter changes '{module}', which llama.cpp's {base.architecture} "
                f"model has no LoRA place for"
            )
        a, b = np.asarray(a, dtype=np.float32), np.asarray(b, dtype=np.float32)
        rank = a.shape[0]
        wanted = _peft_scale(module, config, rank)
        if wanted != (alpha / rank if alpha else 1.0):  # llama.cpp's scale for this rank
            b = b * (wanted / (alpha / rank if alpha else 1.0))
        if base.architecture in PERMUTED_ARCHITECTURES and gguf_name.endswith(".attn_q"):
            b = permute_rows(b, base.n_head)
        elif base.architecture in PERMUTED_ARCHITECTURES and gguf_name.endswith(".attn_k"):
            b = permute_rows(b, base.n_head_kv)
        yield f"{gguf_name}.weight.lora_a", np.ascontiguousarray(a)
        yield f"{gguf_name}.weight.lora_b", np.ascontiguousarray(b)


def permute_rows(weight: Any, n_head: int) -> Any:
    """transformers' q or k rows in llama.cpp's order: in each head, the rows of its first half
    and of its second half interleaved (row i of the first half, then row i of the second)."""
    rows = weight.shape[0]
    per_half = rows // n_head // 2
    heads = weight.reshape(n_head, 2, per_half, *weight.shape[1:])
    return heads.swapaxes(1, 2).reshape(weight.shape)


def _peft_scale(module: str, config: dict[str, Any], rank: int) -> float:
    """PEFT's scale for one module: its alpha (alpha_pattern, else lora_alpha) over its rank,
    or over the rank's square root with rsLoRA."""
    alpha = float(config["lora_alpha"])
    for pattern, value in (config.get("alpha_pattern") or {}).items():
        if re.match(rf"(.*\.)?({pattern})$", module):
            alpha = float(value)
            break
    return alpha / (math.sqrt(rank) if config.get("use_rslora") else rank)


def _pairs(key: str, state: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """Each adapted module's (lora_A, lora_B), by transformers' module name."""
    halves: dict[str, dict[str, Any]] = {}
    for name, tensor in state.items():
        match = re.fullmatch(r"(?:base_model\.model\.)?(.+)\.lora_(A|B|embedding_A|embedding_B)(?:\.weight)?", name)  # fmt: skip
        if match is None:
            raise ConfigError(f"{key}: the adapter holds '{name}', which is not a LoRA matrix")
        module, half = match.groups()
        halves.setdefault(module, {})[half[-1]] = tensor
    pairs = {}
    for module, found in halves.items():
        if set(found) != {"A", "B"}:
            raise ConfigError(f"{key}: '{module}' has lora_A or lora_B but not both")
        pairs[module] = (found["A"], found["B"])
    return pairs


def _weights_file(key: str, source: Path) -> Path:
    for name in ("adapter_model.safetensors", "adapter_model.bin"):
        if (source / name).is_file():
            return source / name
    raise ConfigError(f"{key}: '{source}' has no adapter_model.safetensors (nor .bin)")


def _read_weights(path: Path) -> dict[str, Any]:
    if path.suffix == ".safetensors":
        from safetensors.numpy import load_file

        try:
            return load_file(str(path))
        except Exception:  # bfloat16, which numpy has not: read through torch
            from safetensors.torch import load_file as load_torch

            return {k: v.float().numpy() for k, v in load_torch(str(path)).items()}
    import torch

    return {k: v.float().numpy() for k, v in torch.load(path, weights_only=True).items()}


def _write_atomically(
    target: Path, architecture: str, alpha: float, tensors: Iterator[tuple[str, Any]]
) -> None:
    import gguf

    target.parent.mkdir(parents=True, exist_ok=True)
    handle, scratch = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}-")
    os.close(handle)
    try:
        writer = gguf.GGUFWriter(scratch, architecture)
        writer.add_type(gguf.GGUFType.ADAPTER)
        writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
        writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, alpha)
        for name, tensor in tensors:
            writer.add_tensor(name, tensor)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(scratch, target)
    finally:
        if os.path.exists(scratch):
            os.remove(scratch)
