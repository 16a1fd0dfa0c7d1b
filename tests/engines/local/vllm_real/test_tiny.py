"""lmpress's VLLM engine against vLLM itself on a tiny model built here (random weights, a
tokenizer trained here): `tiny:llama-head32`, whose 32-wide heads vLLM's CPU attention takes.
Random weights give replies no real model would, so equal text shows that both sides sent the
same tokens: chat rows through the same template, raw text as it is.

The batch runs with a LoRA adapter written here (random rank-8 matrices on q_proj and v_proj,
in PEFT's layout), which vLLM's CPU backend applies: one engine start proves both."""

from __future__ import annotations

import json
from pathlib import Path

from lmpress.builtin_models.tiny import tiny_model
from tests.conftest import run_lmpress
from tests.engines.local.vllm_real.conftest import raw_vllm_beside

CHATS = ["the cat runs over the moon", "why is the sky blue", "a quick brown fox"]
TEXTS = ["the cat runs over", "model data file line token"]


def write_lora_adapter(out: Path) -> Path:
    """A PEFT LoRA adapter for tiny:llama-head32 (hidden 64, one 32-wide KV head), random."""
    import torch
    from safetensors.torch import save_file

    generator = torch.Generator().manual_seed(0)
    tensors = {}
    for layer in range(2):
        for name, width in (("q_proj", 64), ("v_proj", 32)):
            base = f"base_model.model.model.layers.{layer}.self_attn.{name}"
            tensors[f"{base}.lora_A.weight"] = torch.randn(8, 64, generator=generator) * 0.5
            tensors[f"{base}.lora_B.weight"] = torch.randn(width, 8, generator=generator) * 0.5
    out.mkdir(parents=True)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": 8, "lora_alpha": 16,
              "lora_dropout": 0.0, "target_modules": ["q_proj", "v_proj"], "bias": "none"}  # fmt: skip
    (out / "adapter_config.json").write_text(json.dumps(config))
    return out


def test_batch_with_a_lora_adapter_equals_vllm_and_a_row_too_long_fails_alone(tmp_path):
    directory = str(tiny_model("llama-head32"))
    adapter = write_lora_adapter(tmp_path / "adapter")
    greedy = {"temperature": 0, "max_tokens": 20}
    cases = {
        "model": directory,
        "lora": str(adapter),
        "engine_args": {"dtype": "float32", "max_model_len": 512, "enforce_eager": True,
                        "enable_lora": True, "max_lora_rank": 8},
        "chat": [{"messages": [{"role": "user", "content": c}], "sampling": greedy}
                 for c in CHATS],
        "generate": [{"prompt": t, "sampling": greedy} for t in TEXTS],
    }  # fmt: skip
    rows = [{"id": f"c{i}", "prompt": c} for i, c in enumerate(CHATS)]
    rows += [{"id": f"t{i}", "text": t} for i, t in enumerate(TEXTS)]
    too_long = {"id": "too-long", "prompt": " ".join(["the cat"] * 300)}
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in [*rows, too_long]))
    # vLLM's own answers, from a process started while the lmpress job runs. The job runs
    # vLLM's model worker in its engine-core process (the serve and failure tests keep
    # vLLM's default processes): one vLLM and torch import fewer.
    with raw_vllm_beside(cases, tmp_path) as raw_answers:
        run = run_lmpress(
            "batch", "--engine", "VLLM", "--model.model_name", "tiny:llama-head32",
            "--model.model_max_length", "512", "--model.model_kwargs.enforce_eager", "true",
            "--model.adapter_model", str(adapter), "--generation.max_new_tokens", "20",
            "-i", str(source), "-o", str(out), timeout=600,
            env={"VLLM_ENABLE_V1_MULTIPROCESSING": "0"},  # see worker_in_the_engine_core
        )  # fmt: skip
        reference = raw_answers()
    assert out.exists(), run.stderr[-2000:]
    written = {row["id"]: row["response"]["text"] for row in map(json.loads, out.open())}
    expected = [r[0]["text"] for r in reference["lora_chat"] + reference["lora_generate"]]
    assert [written[r["id"]] for r in rows] == expected
    assert len(set(expected)) == len(expected)  # the replies depend on the prompts
    without = [r[0]["text"] for r in reference["chat"] + reference["generate"]]
    assert all(a != b for a, b in zip(expected, without, strict=True))  # and on the adapter
    failed = [json.loads(line) for line in (tmp_path / "out.jsonl.errors.jsonl").open()]
    assert [row["id"] for row in failed] == ["too-long"]
    assert "context_length_exceeded" in json.dumps(failed[0])
