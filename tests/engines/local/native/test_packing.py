"""NATIVE's linear layers on packed weights (packing.py), on a tiny Llama and a tiny GPT-2: the
layers a CPU engine multiplies by are packed, and the replies and logprobs are what the plain
layers give."""

from __future__ import annotations

import pytest

from lmpress.vocabulary.types import GenerationParams, Message, Request
from tests.engines.local.native.test_batching import close, make

QUESTIONS = [f"question {i}: " + "why " * (i % 5) for i in range(8)]


def answers(engine) -> list:
    params = GenerationParams(max_new_tokens=16, logprobs=True)
    requests = [Request(str(i), [Message("user", q)], params) for i, q in enumerate(QUESTIONS)]
    return engine.generate(requests)


@pytest.fixture(scope="module", params=["tiny_llama", "tiny_gpt2"])
def pair(request):
    """The same checkpoint loaded twice: packed (the default) and with pack_weights off."""
    model = request.getfixturevalue(request.param)
    packed, plain = make(model), make(model, pack_weights=False)
    yield packed, plain
    close(packed)
    close(plain)


def test_every_linear_layer_is_packed_by_default_and_none_when_turned_off(pair):
    import torch

    packed, plain = pair
    for engine, expected in ((packed, True), (plain, False)):
        linears = [m for m in engine.model.modules() if isinstance(m, torch.nn.Linear)]
        assert linears
        assert {hasattr(m, "lmpress_packed") for m in linears} == {expected}


def test_packed_layers_answer_as_the_plain_ones_do(pair):
    packed, plain = pair
    got, expected = answers(packed), answers(plain)
    assert all(r.ok for r in got + expected)
    assert [r.text for r in got] == [r.text for r in expected]
    for a, b in zip(got, expected, strict=True):
        assert [e.logprob for e in a.samples[0].logprobs] == pytest.approx(
            [e.logprob for e in b.samples[0].logprobs], abs=1e-3
        )
