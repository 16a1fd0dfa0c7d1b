"""NATIVE's draft-model speculation (`model.draft_model`) on SmolLM2's real weights: the draft is
a smaller model with SmolLM2's tokenizer, made here from SmolLM2's own first 24 of 30 layers
(no smaller SmolLM2 can be had offline). Its drafts are kept at some positions and refused at
others, so both of a row's paths after a verify (every draft kept: two tokens pending in the
draft cache; one refused: the draft cache cut back) run; no row's tokens, logprobs or ending
change against decoding without speculation (itself checked against transformers' own
`generate` in test_speculation.py).

One engine is loaded for the module; each run turns its scheduler's speculation on or off for
the rows it submits (rows take their drafting when they join)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from lmpress.builtin_models.packaged import SMOLLM2
from lmpress.configs import load_config
from lmpress.engines.registry import create_engine
from lmpress.vocabulary.errors import ConfigError
from lmpress.vocabulary.types import GenerationParams
from tests.engines.local.native.test_speculation import (
    COPY,
    NEW_TOKENS,
    chat,
    greedy_rows_on_and_off,
    run,
    samples,
)
from tests.engines.local.test_reference_equality import MIXED

DRAFT_LAYERS = 24


def first_layers(path: Path, layers: int) -> str:
    """SmolLM2 cut to its first `layers` layers, with its tokenizer, saved at `path`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lmpress.engines.common.dequantized import dequantized_copy
    from lmpress.engines.common.models import local_or_hub

    source = dequantized_copy(Path(local_or_hub(SMOLLM2, "model.model_name")))
    model = AutoModelForCausalLM.from_pretrained(source)
    model.model.layers = model.model.layers[:layers]
    model.config.num_hidden_layers = layers
    model.save_pretrained(path)
    AutoTokenizer.from_pretrained(source).save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    draft = first_layers(tmp_path_factory.mktemp("draft"), DRAFT_LAYERS)
    config = load_config(
        overrides={
            "engine": "NATIVE",
            "model.model_name": SMOLLM2,
            "generation.batch_size": 16,
            "model.draft_model": draft,
        }
    )
    engine = create_engine(config)
    yield engine
    asyncio.run(engine.aclose())


def test_greedy_rows_equal_decoding_without_speculation(smollm2):
    """Copy prompts (twice over) and free-text questions side by side. Decoding without
    speculation is the same path as in test_speculation.py, which checks it against
    transformers' own `generate` on these prompts."""
    assert smollm2.draft_model.config.num_hidden_layers == DRAFT_LAYERS
    drafted, accepted = greedy_rows_on_and_off(smollm2, against_transformers=False)
    # The draft's tokens were verified, and kept at some positions but not all.
    assert drafted > 50
    assert 0 < accepted < drafted


def test_limits_stop_strings_and_logprobs_are_unchanged_by_a_draft_model(smollm2):
    """Limits that fall inside a kept draft end each row at exactly its max_new_tokens; a stop
    string in a copied stretch, and logprobs with their alternatives, come out as without."""
    limits = [5, 7, 11, 16]
    requests = [
        chat(COPY[i % len(COPY)], GenerationParams(max_new_tokens=m), str(i))
        for i, m in enumerate(limits)
    ]
    requests += [
        chat(COPY[0], GenerationParams(max_new_tokens=NEW_TOKENS, stop_strings=["harbour"]), "s"),
        chat(COPY[2], GenerationParams(max_new_tokens=24, logprobs=True, top_logprobs=3), "l"),
    ]
    on, drafted, _ = run(smollm2, requests, on=True)
    off, _, _ = run(smollm2, requests, on=False)
    assert drafted > 0
    assert [r.usage.completion_tokens for r in on[: len(limits)]] == limits
    assert samples(on) == samples(off)
    assert on[4].samples[0].stop_sequence == "harbour"
    got, want = on[5].samples[0].logprobs, off[5].samples[0].logprobs
    assert [e.token for e in got] == [e.token for e in want]
    assert [e.logprob for e in got] == pytest.approx([e.logprob for e in want], abs=1e-4)


def test_seeded_sampled_rows_keep_their_tokens_with_a_draft_model(smollm2):
    """The draft model's greedy tokens are one-hot drafts: a sampled row draws once per token
    emitted, from the model's own distribution, so a seeded row whose sampler cuts the tail
    gives the same tokens (test_speculation.py says why full-vocabulary rows may not,
    by a rounding)."""
    requests = [
        chat(COPY[i % len(COPY)], GenerationParams(max_new_tokens=24, seed=90 + i, **s), str(i))
        for i, s in enumerate(MIXED)
    ]
    on, drafted, _ = run(smollm2, requests, on=True)
    off, _, _ = run(smollm2, requests, on=False)
    assert drafted > 0
    for settings, a, b in zip(MIXED, samples(on), samples(off), strict=True):
        if settings["temperature"] == 0 or set(settings) & {"top_k", "top_p", "min_p"}:
            assert a == b, settings


def test_a_draft_model_with_another_vocabulary_is_refused_by_name(tiny_llama):
    config = load_config(
        overrides={"engine": "NATIVE", "model.model_name": SMOLLM2, "model.draft_model": tiny_llama}
    )
    with pytest.raises(ConfigError) as err:
        create_engine(config)
    assert str(err.value).startswith(f"model.draft_model: '{tiny_llama}' has a vocabulary of ")
    assert "must share the model's tokenizer" in str(err.value)
