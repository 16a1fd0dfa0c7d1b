"""lmpress's VLLM engine against vLLM itself on a tiny model built here (random weights, a
tokenizer trained here): `tiny:llama-head32`, whose 32-wide heads vLLM's CPU attention takes.
Random weights give replies no real model would, so equal text shows that both sides sent the
same tokens: chat rows through the same template, raw text as it is."""

from __future__ import annotations

import json

from lmpress.tinymodels import tiny_model
from tests.conftest import run_lmpress
from tests.engines.local.vllm_real.conftest import raw_vllm

CHATS = ["the cat runs over the moon", "why is the sky blue", "a quick brown fox"]
TEXTS = ["the cat runs over", "model data file line token"]


def test_batch_on_a_tiny_model_equals_vllm_and_a_row_too_long_fails_alone(tmp_path):
    directory = str(tiny_model("llama-head32"))
    greedy = {"temperature": 0, "max_tokens": 20}
    reference = raw_vllm(
        {
            "model": directory,
            "engine_args": {"dtype": "float32", "max_model_len": 512, "enforce_eager": True},
            "chat": [{"messages": [{"role": "user", "content": c}], "sampling": greedy}
                     for c in CHATS],
            "generate": [{"prompt": t, "sampling": greedy} for t in TEXTS],
        },
        tmp_path,
    )  # fmt: skip
    rows = [{"id": f"c{i}", "prompt": c} for i, c in enumerate(CHATS)]
    rows += [{"id": f"t{i}", "text": t} for i, t in enumerate(TEXTS)]
    too_long = {"id": "too-long", "prompt": " ".join(["the cat"] * 300)}
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in [*rows, too_long]))
    run = run_lmpress(
        "batch", "--engine", "VLLM", "--model.model_name", "tiny:llama-head32",
        "--model.model_max_length", "512", "--model.model_kwargs.enforce_eager", "true",
        "--generation.max_new_tokens", "20", "-i", str(source), "-o", str(out), timeout=600,
    )  # fmt: skip
    assert out.exists(), run.stderr[-2000:]
    written = {row["id"]: row["response"]["text"] for row in map(json.loads, out.open())}
    expected = [r[0]["text"] for r in reference["chat"] + reference["generate"]]
    assert [written[r["id"]] for r in rows] == expected
    assert len(set(expected)) == len(expected)  # the replies depend on the prompts
    failed = [json.loads(line) for line in (tmp_path / "out.errors.jsonl").open()]
    assert [row["id"] for row in failed] == ["too-long"]
    assert "context_length_exceeded" in json.dumps(failed[0])
