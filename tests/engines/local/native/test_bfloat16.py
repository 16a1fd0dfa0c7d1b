"""NATIVE at bfloat16 (`model.torch_dtype_str: bfloat16`), on SmolLM2's real weights.

bfloat16 is a choice a user makes, never `auto`'s: a CPU's bfloat16 kernels round by its own
instructions (AVX512-BF16 on AMD, AMX on Intel), so its greedy text may differ from machine to
machine. The reference is therefore transformers' own `generate` on the same model object, on
this machine, at the same dtype; and the quality check asks what float32 answers.
"""

from __future__ import annotations

import re

import pytest

from lmpress.builtin_models.packaged import SMOLLM2
from tests.engines.local.test_real_weights import QUESTIONS, chat, close
from tests.engines.local.test_reference_equality import transformers_greedy

NEW_TOKENS = 40  # test_real_weights's: every answer is in by then


@pytest.fixture(scope="module")
def bf16():
    from lmpress.configs import load_config
    from lmpress.engines.registry import create_engine

    config = load_config(overrides={"engine": "NATIVE", "model.model_name": SMOLLM2,
                                    "model.torch_dtype_str": "bfloat16",
                                    "generation.batch_size": 16})  # fmt: skip
    engine = create_engine(config)
    yield engine
    close(engine)


def test_bfloat16_loads_the_weights_at_bfloat16(bf16):
    import torch

    assert {p.dtype for p in bf16.model.parameters()} == {torch.bfloat16}
    # Packed weights ran slower end to end at bfloat16 (packing.py): the layers stay plain.
    assert not any(hasattr(m, "lmpress_packed") for m in bf16.model.modules())


def test_bfloat16_answers_what_float32_answers_as_transformers_generate_does(bf16):
    """One batch of the ten questions float32 answers: all answered, and the first three's
    text and logprobs are transformers' own at bfloat16 (within bfloat16's precision: a logit
    near 16 is held to 1/16)."""
    from lmpress.vocabulary.types import GenerationParams

    params = GenerationParams(max_new_tokens=NEW_TOKENS, logprobs=True)
    results = bf16.generate([chat(q, params, str(i)) for i, (q, _) in enumerate(QUESTIONS)])
    wrong = [
        r.text for (_, pattern), r in zip(QUESTIONS, results, strict=True)
        if not re.search(pattern, r.text.lower())
    ]  # fmt: skip
    assert not wrong
    for (question, _), result in zip(QUESTIONS[:3], results[:3], strict=True):
        _, reply, steps, ends = transformers_greedy(
            bf16.model, bf16.hf_tokenizer, question, NEW_TOKENS
        )
        text = bf16.hf_tokenizer.decode(
            [t for t in reply if t not in ends], skip_special_tokens=True
        )
        assert result.text == text
        expected = [float(step[token]) for step, token in zip(steps, reply, strict=True)]
        got = [entry.logprob for entry in result.samples[0].logprobs]
        assert got == pytest.approx(expected, abs=0.2)
