"""LoRA adapters chosen per row on lmpress's VLLM engine, against vLLM itself, on real weights:
SmolLM2-135M-Instruct and its two adapters made offline (builtin_models/lora.py).

48 chat rows mixed at random over lora-a, lora-b and the base model go to one lmpress engine
at once, so vLLM batches them together; raw vLLM (raw_vllm.py, a process of its own) answers
the same rows in one `LLM.chat` call with a LoRARequest a prompt, and the base rows again in
a call of their own. One engine start a side.
"""

from __future__ import annotations

import asyncio
import random

import pytest

from lmpress.builtin_models.lora import smollm2_adapters
from lmpress.builtin_models.packaged import SMOLLM2
from lmpress.configs import load_config
from lmpress.engines.registry import create_engine
from lmpress.vocabulary.types import Message, Request
from tests.engines.local.vllm_real.conftest import raw_vllm_beside, worker_in_the_engine_core

MAX_MODEL_LEN = 512
MAX_TOKENS = 16
QUESTIONS = [
    "Name three colours.",
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "What is 2+2?",
    "Who wrote Romeo and Juliet?",
    "Give me a word that rhymes with cat.",
    "What do bees make?",
    "Describe a cat in one sentence.",
    "What is the boiling point of water?",
    "Name a planet.",
    "How many legs does a spider have?",
    "Say hello in Spanish.",
    "What is the opposite of hot?",
    "Suggest a name for a dog.",
    "What season comes after winter?",
    "Why is the sky blue?",
]
ADAPTERS = [None, "lora-a", "lora-b"]
# Every question under every adapter and the base model, in an order drawn once.
ROWS = [(q, a) for q in QUESTIONS for a in ADAPTERS]
random.Random(54).shuffle(ROWS)


@pytest.fixture(scope="module")
def adapters() -> dict[str, str]:
    return {name: str(path) for name, path in smollm2_adapters().items()}


@pytest.fixture(scope="module")
def runs(adapters, tmp_path_factory):
    """lmpress's replies to ROWS and one row naming no adapter it holds, those of `reload`,
    the engine's arguments, and vLLM's own answers (its process started first and run
    beside)."""
    from lmpress.engines.local.vllm.translate import model_directory

    greedy = {"temperature": 0, "max_tokens": MAX_TOKENS}
    cases = {
        "model": model_directory(SMOLLM2, "model.model_name"),
        "adapters": adapters,
        # Three slots for two adapters: on vLLM's CPU build a base row batched beside adapter
        # rows gets the last slot's adapter (lmpress/engines/local/vllm/lora.py), so the last
        # stays empty, as lmpress leaves it.
        "engine_args": {"dtype": "float32", "max_model_len": MAX_MODEL_LEN,
                        "enforce_eager": True, "enable_lora": True, "max_loras": 3,
                        "max_lora_rank": 8},
        "adapter_chat": [{"messages": [{"role": "user", "content": q}], "adapter": a,
                          "sampling": greedy} for q, a in ROWS],
    }  # fmt: skip
    overrides = {
        "engine": "VLLM",
        "model.model_name": SMOLLM2,
        "model.model_max_length": MAX_MODEL_LEN,
        "model.model_kwargs": {"enforce_eager": True},
        "model.adapters": adapters,
        "generation.max_new_tokens": MAX_TOKENS,
    }
    with raw_vllm_beside(cases, tmp_path_factory.mktemp("raw-adapters")) as raw_answers:
        with worker_in_the_engine_core():
            engine = create_engine(load_config(overrides=overrides))
        try:
            params = engine.config.generation
            requests = [
                Request(f"r{i}", [Message("user", q)], params, adapter=a)
                for i, (q, a) in enumerate(ROWS)
            ]
            requests.append(Request("unknown", [Message("user", "Hi")], params, adapter="lora-c"))
            results = engine.generate(requests)
            reloaded = asyncio.run(reload(engine, adapters["lora-b"], params))
            args = dict(engine.settings.args)
        finally:
            asyncio.run(engine.aclose())
        return results, reloaded, args, raw_answers()


async def reload(engine, path: str, params) -> list:
    """lora-b unloaded while the engine runs, then loaded again as lora-z: a row naming lora-b
    after, and the first question asked of lora-z and of the base model in one batch."""
    question = [Message("user", QUESTIONS[0])]
    await engine.unload_adapter("lora-b")
    gone = await engine.complete(Request("gone", question, params, adapter="lora-b"))
    await engine.load_adapter("lora-z", path)
    again = [Request(f"again-{a}", question, params, adapter=a) for a in ("lora-z", None)]
    return [gone, *await asyncio.gather(*map(engine.complete, again))]


def test_rows_mixed_over_adapters_equal_vllms_own_lora_requests(runs):
    results, _, args, reference = runs
    *rows, unknown = results
    assert (args["enable_lora"], args["max_loras"], args["max_lora_rank"]) == (True, 3, 8)
    for result in rows:
        assert result.ok, f"{result.request_id}: {result.error}"
    ours = [(r.text, r.samples[0].completion_tokens) for r in rows]
    mixed = [(raw[0]["text"], len(raw[0]["token_ids"])) for raw in reference["adapter_chat"]]
    base = [(raw[0]["text"], len(raw[0]["token_ids"])) for raw in reference["adapter_chat_base"]]
    assert ours == mixed
    # Base rows beside adapter rows get the base model's replies, as vLLM gives them with no
    # adapter in the batch (on a CPU, thanks to the spare slot: lora.py).
    assert [o for o, (_, a) in zip(ours, ROWS, strict=True) if a is None] == base
    # The adapters change the replies: each adapter's differ from the base model's and from
    # the other adapter's on most questions (a short factual reply may coincide).
    reply = {row: text for row, (text, _) in zip(ROWS, ours, strict=True)}
    differ = {
        (a, b): sum(reply[q, a] != reply[q, b] for q in QUESTIONS)
        for a, b in [("lora-a", None), ("lora-b", None), ("lora-a", "lora-b")]
    }
    assert min(differ.values()) >= 12, differ
    # A row naming an adapter the engine does not hold fails alone, with vLLM's 404.
    assert not unknown.ok
    assert (unknown.error.kind, unknown.error.status) == ("not_found", 404)
    assert "'lora-c' does not exist" in unknown.error.message


def test_an_adapter_unloaded_and_loaded_again_at_run_time(runs):
    _, (gone, lora_z, base), _, reference = runs
    assert (gone.error.kind, gone.error.status) == ("not_found", 404)
    mixed = dict(zip(ROWS, reference["adapter_chat"], strict=True))
    assert lora_z.text == mixed[QUESTIONS[0], "lora-b"][0]["text"]
    assert base.text == mixed[QUESTIONS[0], None][0]["text"]
