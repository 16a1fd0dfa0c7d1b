"""NATIVE prefills the prompts that join the batch in one round together (packed_prefill.py): a
round of prompts sharing a system prompt takes two forward passes rather than one a prompt, and
each prompt's first token and its logprobs are bit for bit the ones it gets prefilled alone.
"""

from __future__ import annotations

import asyncio

import pytest

from lmpress.configs import load_config
from lmpress.engines.registry import create_engine
from lmpress.vocabulary.types import GenerationParams, Message, Request

SYSTEM = Message("system", "You are a careful assistant who answers in one short sentence.")


@pytest.fixture(scope="module")
def engine(tiny_llama):
    made = create_engine(load_config(overrides={
        "engine": "NATIVE", "model.model_name": tiny_llama, "generation.batch_size": 16,
    }))  # fmt: skip
    yield made
    asyncio.run(made.aclose())


def first_tokens(engine, requests: list[Request]) -> tuple[list, int]:
    """Each request's sample, and the forward passes the model took for them."""
    passes = 0

    def count(*_):
        nonlocal passes
        passes += 1

    hook = engine.model.register_forward_pre_hook(count)
    try:
        results = engine.generate(requests)
    finally:
        hook.remove()
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    return [r.samples for r in results], passes


def test_a_round_sharing_a_system_prompt_takes_two_passes_and_each_row_gets_its_own(engine):
    first = GenerationParams(max_new_tokens=1, logprobs=True, top_logprobs=5)
    requests = [
        Request(f"r{i}", [SYSTEM, Message("user", f"{i} " + "sea " * (i % 5))], first)
        for i in range(12)
    ]  # fmt: skip
    # The engine's first packed prefill takes one more pass, once, for the shape of an empty
    # cache (ScoringPrefill.no_tokens): two prompts of their own take it first.
    first_tokens(engine, [Request(word, [Message("user", word)], first) for word in ("a", "b")])
    together, passes = first_tokens(engine, requests)
    # The first prompt fed alone, then the other 11 from its cache of the system prompt in one
    # pass; one at a time, a pass a prompt.
    assert passes == 2
    alone = [first_tokens(engine, [request]) for request in requests]
    assert [passes for _, passes in alone] == [1] * 12
    assert together == [samples[0] for samples, _ in alone]
