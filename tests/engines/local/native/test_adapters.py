"""NATIVE's LoRA adapters chosen row by row (engines/local/native/adapters.py), on SmolLM2's real
weights and two adapters made offline: rows of both adapters and of the base model, mixed at
random in one continuous batch, each equal token for token to PEFT's own model with that adapter
set (the base with adapters disabled), through transformers' `generate`. A row naming an
adapter the engine does not hold fails alone with 404; an adapter unloaded and loaded again
while the engine runs answers as before; what cannot combine with adapters is refused before
any weight loads."""

from __future__ import annotations

import asyncio
import contextlib
import random

import pytest

from lmpress.builtin_models.lora import smollm2_adapters
from lmpress.builtin_models.packaged import SMOLLM2
from lmpress.configs import load_config
from lmpress.configs.schema import ModelParams
from lmpress.engines.common.checkpoints import model_source
from lmpress.engines.registry import create_engine
from lmpress.vocabulary.errors import ModelLoadError, UnsupportedParamError
from lmpress.vocabulary.types import GenerationParams, Message, Request

NEW_TOKENS = 12
QUESTIONS = ["Name three colours.", "Tell me about rivers.", "Why do people like fruit?",
             "Write one line about birds.", "What are metals made of?", "Name two planets.",
             "Describe a tree.", "Who was a famous poet?"]  # fmt: skip
CHOICES = [None, "lora-a", "lora-b"]


def config(adapters: dict, **overrides):
    return load_config(
        overrides={
            "engine": "NATIVE",
            "model.model_name": SMOLLM2,
            "model.torch_dtype_str": "float32",
            **{f"model.adapters.{name}": str(path) for name, path in adapters.items()},
            **overrides,
        }
    )


@pytest.fixture(scope="module")
def adapters():
    return smollm2_adapters()


@pytest.fixture(scope="module")
def engine(adapters):
    engine = create_engine(config(adapters, **{"generation.batch_size": 48}))
    yield engine
    asyncio.run(engine.aclose())


@pytest.fixture(scope="module")
def reference(adapters, engine):
    """PEFT's own model over the same weights, both adapters loaded."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    name, _ = model_source(ModelParams(model_name=SMOLLM2))
    base = AutoModelForCausalLM.from_pretrained(name, dtype=torch.float32).eval()
    model = PeftModel.from_pretrained(base, str(adapters["lora-a"]), adapter_name="lora-a")
    model.load_adapter(str(adapters["lora-b"]), adapter_name="lora-b")
    return model.eval()


def rows() -> list[Request]:
    """48 chat rows, each a question and an adapter or none drawn at random (a fixed seed),
    so that a question comes with several adapters (their prompts' caches must not be shared)
    and a pair repeats; the first three ask the same question of all three."""
    draw = random.Random(54)
    params = GenerationParams(max_new_tokens=NEW_TOKENS)
    pairs = [(QUESTIONS[0], c) for c in CHOICES]
    pairs += [(draw.choice(QUESTIONS), draw.choice(CHOICES)) for _ in range(45)]
    return [Request(str(i), [Message("user", q)], params, adapter=a) for i, (q, a) in enumerate(pairs)]  # fmt: skip


def peft_replies(model, prompts: set[tuple[tuple[int, ...], str | None]], pad: int) -> dict:
    """PEFT's greedy reply to each (prompt ids, adapter): its ids, up to and including an end
    token (`pad` may follow). One `generate` an adapter, its prompts left-padded, rather than one
    a prompt: the same ids (measured on these rows: every logit within 9e-5 of the prompt's
    alone, the nearest tie in their replies 0.015 apart), in a third of the time."""
    import torch

    replies = {}
    for adapter in CHOICES:
        group = sorted(ids for ids, a in prompts if a == adapter)
        width = max(map(len, group))
        padded = torch.tensor([[pad] * (width - len(ids)) + list(ids) for ids in group])
        mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in group])
        if adapter is not None:
            model.set_adapter(adapter)
        base = model.disable_adapter() if adapter is None else contextlib.nullcontext()
        with torch.inference_mode(), base:
            out = model.generate(input_ids=padded, attention_mask=mask, do_sample=False,
                                 max_new_tokens=NEW_TOKENS)  # fmt: skip
        for ids, reply in zip(group, out[:, width:].tolist(), strict=True):
            replies[ids, adapter] = reply
    return replies


def test_mixed_adapter_rows_in_one_batch_equal_peft_with_each_adapter_set(engine, reference):
    requests = rows()
    missing = Request("z", [Message("user", "Hi")], requests[0].params, adapter="lora-z")
    results = engine.generate([*requests, missing])
    assert {r.adapter for r in requests} == set(CHOICES)
    assert all(r.ok for r in results[:-1]), [r.error for r in results[:-1] if not r.ok][:1]
    pairs = {(tuple(r.prompt_ids), q.adapter) for q, r in zip(requests, results, strict=False)}
    references = peft_replies(reference, pairs, engine.hf_tokenizer.pad_token_id)
    eos = engine.eos_ids
    for request, result in zip(requests, results, strict=False):
        reply = references[tuple(result.prompt_ids), request.adapter]
        ends = next((i + 1 for i, t in enumerate(reply) if t in eos), len(reply))
        text = engine.hf_tokenizer.decode(reply[:ends], skip_special_tokens=True)
        assert (result.text, result.usage.completion_tokens) == (text, ends), request.adapter
    # The same question differs by adapter: each adapter did change the replies.
    assert len({r.text for r in results[:3]}) == 3
    # The unknown adapter failed alone, as vLLM's unknown model does.
    error = results[-1].error
    assert (error.kind.value, error.status) == ("not_found", 404)
    assert "'lora-z' does not exist" in error.message and "'lora-a'" in error.message


def test_an_adapter_unloaded_and_loaded_again_answers_as_before(engine, adapters):
    ask = [Request("b", [Message("user", "Name three colours.")], GenerationParams(max_new_tokens=NEW_TOKENS), adapter="lora-b")]  # fmt: skip
    before = engine.generate(ask)[0].text
    asyncio.run(engine.unload_adapter("lora-b"))
    assert engine.adapter_names == {"lora-a"}
    gone = engine.generate(ask)[0]
    assert gone.error is not None and gone.error.status == 404
    asyncio.run(engine.load_adapter("lora-b", str(adapters["lora-b"])))
    assert engine.generate(ask)[0].text == before


@pytest.mark.parametrize(
    ("overrides", "refused"),
    [
        ({"model.speculative_method": "ngram"}, "model.speculative_method"),
        ({"model.compile": "true"}, "model.compile"),
        ({"model.adapter_model": "/somewhere"}, "model.adapter_model"),
    ],
)
def test_what_cannot_combine_with_adapters_is_refused_before_loading(adapters, overrides, refused):
    with pytest.raises(UnsupportedParamError, match=f"^model.adapters: .* with {refused}"):
        create_engine(config(adapters, **overrides))


def test_a_missing_adapter_directory_is_one_line_naming_it(tmp_path):
    with pytest.raises(ModelLoadError, match=r"^model.adapters.mine: '.*nowhere' is not a PEFT"):
        create_engine(config({"mine": tmp_path / "nowhere"}))
