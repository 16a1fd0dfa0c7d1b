"""NATIVE prefills the prompts that join the batch in one round together (packed_prefill.py):
each prompt's cache and logits are bit for bit those of the model's own forward pass over it
alone, a round of prompts sharing a system prompt takes two passes rather than one a prompt, and
through the engine each row's first token and its logprobs are the ones it gets alone.
"""

from __future__ import annotations

import asyncio

import pytest

from lmpress.configs import load_config
from lmpress.engines.local.native.batch_cache import (
    PrefixStore,
    cache_argument,
    dynamic_cache,
    layer_tensors,
)
from lmpress.engines.local.native.packed_prefill import PackedPrefill
from lmpress.engines.local.native.scoring_prefill import ScoringPrefill
from lmpress.engines.registry import create_engine
from lmpress.vocabulary.types import GenerationParams, Message, Request

SYSTEM = Message("system", "You are a careful assistant who answers in one short sentence.")
# Each begins with another letter, so that every two prompts share the system prompt and no more
# whatever the order they come in: which prompt a row's prefix is copied from changes nothing.
WORDS = ["Apples", "Bread", "Cats", "Dogs", "Eels", "Figs", "Goats", "Hills", "Ink", "Jam"]


@pytest.fixture(scope="module")
def engine(tiny_llama):
    made = create_engine(load_config(overrides={
        "engine": "NATIVE", "model.model_name": tiny_llama, "generation.batch_size": 16,
    }))  # fmt: skip
    yield made
    asyncio.run(made.aclose())


def prompt_ids(engine, messages: list[Message]) -> list[int]:
    chat = [{"role": m.role, "content": m.text()} for m in messages]
    ids = engine.hf_tokenizer.apply_chat_template(chat, add_generation_prompt=True)
    return ids if isinstance(ids, list) else ids["input_ids"]


def test_packed_prompts_get_what_the_models_own_pass_gives_each_and_share_the_system_prompt(
    engine,
):
    import torch

    model = engine.model
    prompts = [prompt_ids(engine, [SYSTEM, Message("user", f"{w} " + "sea " * i)])
               for i, w in enumerate(WORDS)]  # fmt: skip
    prompts += [prompt_ids(engine, [Message("user", "Hi")]), [5]]  # no system prompt; one token
    packed = PackedPrefill(ScoringPrefill(model, cache_argument(model), engine.device, 512))
    calls = 0

    def count(*_):
        nonlocal calls
        calls += 1

    with torch.inference_mode():
        packed.scoring.no_tokens()  # the shape of an empty cache, read once off a pass
        hook = model.register_forward_pre_hook(count)
        try:
            together = packed.prefill(prompts, None)  # each fed whole
            calls, before = 0, calls
            packed.prefill(prompts[:10], PrefixStore())
        finally:
            hook.remove()
        # Fed whole, all 12 in one pass; from the store, the first of the 10 alone, then the
        # other 9 after its cache of the system prompt.
        assert (before, calls) == (1, 2)
        for ids, (cache, logits) in zip(prompts, together, strict=True):
            own = dynamic_cache([])
            out = model(input_ids=torch.tensor([ids]), use_cache=True, logits_to_keep=1,
                        **{cache_argument(model): own})  # fmt: skip
            assert torch.equal(logits, out.logits[:, -1])
            for (k, v), (own_k, own_v) in zip(cache.layers, layer_tensors(own), strict=True):
                assert torch.equal(k, own_k) and torch.equal(v, own_v)


def test_a_rows_first_token_and_logprobs_are_the_ones_it_gets_alone(engine):
    first = GenerationParams(max_new_tokens=1, logprobs=True, top_logprobs=5)
    requests = [Request(w, [SYSTEM, Message("user", f"{w} " + "sea " * i)], first)
                for i, w in enumerate(WORDS)]  # fmt: skip
    together = engine.generate(requests)
    alone = [engine.generate([request])[0] for request in requests]
    assert all(r.ok for r in together + alone)
    assert [r.samples for r in together] == [r.samples for r in alone]
