"""LLAMACPP's `model.model_kwargs`: lmpress's own settings and the `Llama` parameters it reads,
typed (engines/options.py). Every other key goes to llama-cpp-python's `Llama` constructor,
checked against its signature when the engine starts, before the weights load
(loading.llama_kwargs): `Llama` itself ignores a key it does not know.
"""

from __future__ import annotations

from dataclasses import dataclass

from lmpress.engines.options import EngineOptions, setting

# `Llama` parameters that mean nothing here, with what to do instead.
REFUSED_KWARGS = {
    "model_path": "set model.model_name instead",
    "seed": "set generation.seed instead (lmpress seeds every row)",
    "chat_format": "set model.chat_template instead (a Jinja template, a file, or 'chatml')",
    "chat_handler": "set model.chat_template instead",
    "tokenizer": "lmpress uses the GGUF file's own tokenizer",
    "draft_model": "set model.draft_model instead (a GGUF file sharing the model's tokenizer)",
    "embedding": "the LLAMACPP engine generates text; it does not compute embeddings",
    "vocab_only": "the LLAMACPP engine needs the model's weights",
    "logits_all": "not needed: generation.logprobs works without it",
    "lora_path": "name LoRA adapters in model.adapters instead (GGUF files or PEFT directories; "
    "each row chooses one)",
    "lora_base": "name LoRA adapters in model.adapters instead",
    "lora_scale": "name LoRA adapters in model.adapters instead (each applies at PEFT's scale)",
    "spm_infill": "infill is not supported by the LLAMACPP engine",
}


@dataclass
class LlamaCppOptions(EngineOptions):
    passes_to = "llama-cpp-python's Llama"
    known_as = "a llama-cpp-python Llama parameter"
    refused = REFUSED_KWARGS

    filename: str | None = setting(
        None, "the .gguf file in model_name's directory or cached hub repo (Oumi's form)"
    )
    mmproj: str | None = setting(
        None, "the model's projector GGUF (a path or tiny-gguf: name): rows may carry images"
    )
    kv_unified: bool = setting(
        False, "the sequences share one KV cache of n_ctx tokens rather than equal parts of it"
    )
    use_extra_bufts: bool | None = setting(
        None, "llama.cpp's extra weight buffer types (null: on unless the build has AMX kernels)"
    )
    n_ctx: int = setting(0, "the KV cache in tokens, for all sequences (0: the model's context)")
    n_batch: int = setting(512, "the most prompt tokens llama.cpp decodes in one call")
    n_ubatch: int | None = setting(
        None, "the most tokens in one pass over the weights (null: 63 over a shared cache)"
    )
    n_threads: int | None = setting(None, "CPU threads (null: llama-cpp-python's, half the cores)")
    n_gpu_layers: int = setting(0, "layers offloaded to a GPU (-1: all)")
    flash_attn: bool | None = setting(None, "flash attention (null: llama.cpp's auto)")
    last_n_tokens_size: int | None = setting(
        None, "tokens the repetition penalties look back over (null: the whole sequence)"
    )
    pooling_type: int | None = setting(
        None, "an embedding model's pooling: 1 mean, 2 cls, 3 last (null: the model's own)"
    )
