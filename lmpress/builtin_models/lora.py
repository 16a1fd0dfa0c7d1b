"""LoRA adapters for SmolLM2-135M-Instruct, made offline, for tests, examples and benchmarks.

Each is a PEFT LoRA directory (rank 8 on the attention's q_proj and v_proj, PEFT's default for
the llama architecture) with random weights from a fixed seed: both halves keep nn.Linear's
initial weights, where PEFT's own initialisation would leave B zero, so each adapter changes
the model's replies (asked for three colours, one lists "red, blue, green, blue, ...", the
other talks of a colour wheel) while they stay words. Made once into lmpress's cache.

    python -m lmpress.builtin_models.lora          # prints each adapter's directory
"""

from __future__ import annotations

import sys
from pathlib import Path

# Bump when the recipe changes, so cached adapters are rebuilt.
BUILDER_VERSION = 1
RANK = 8
ALPHA = 16
TARGETS = ("q_proj", "v_proj")
BASE = "HuggingFaceTB/SmolLM2-135M-Instruct"  # as the adapters' config names their base
SEEDS = {"lora-a": 1, "lora-b": 2}  # the adapters' names, and the seed each is drawn from


def smollm2_adapters(cache_dir: Path | None = None) -> dict[str, Path]:
    """Every adapter's directory, by name, made on first use."""
    return {name: smollm2_adapter(name, cache_dir) for name in SEEDS}


def smollm2_adapter(name: str, cache_dir: Path | None = None) -> Path:
    from lmpress.builtin_models.tiny import built_once, cache_root

    target = (cache_dir or cache_root()) / "lora" / f"smollm2-{name}-v{BUILDER_VERSION}"
    return built_once(target, lambda out: _build(SEEDS[name], out), "adapter_config.json")


def _build(seed: int, out: Path) -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    # An adapter's weights depend on the base's shapes only, not its weights: a model of
    # SmolLM2-135M's shape (its vocabulary cut, since no adapter touches the embeddings).
    shape = LlamaConfig(
        hidden_size=576,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        intermediate_size=1536,
        vocab_size=64,
    )
    base = LlamaForCausalLM(shape)
    config = LoraConfig(
        r=RANK,
        lora_alpha=ALPHA,
        target_modules=list(TARGETS),
        init_lora_weights=False,
        task_type="CAUSAL_LM",
    )
    torch.manual_seed(seed)
    model = get_peft_model(base, config)
    model.peft_config["default"].base_model_name_or_path = BASE
    # Not "auto", which looks the base model up online to see whether its vocabulary grew (the
    # adapters touch no embedding; the files are the same bytes).
    model.save_pretrained(out, save_embedding_layers=False)


if __name__ == "__main__":
    for adapter_name, path in smollm2_adapters().items():
        print(adapter_name, path)
    sys.exit(0)
