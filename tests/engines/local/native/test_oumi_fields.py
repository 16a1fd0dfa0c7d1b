"""Oumi's model fields on NATIVE: random weights, the sequence-length cap (compile:
test_compile.py)."""

from __future__ import annotations

import asyncio
import shutil

import pytest
import torch

from lmpress.configs import load_config
from lmpress.engines.registry import create_engine
from lmpress.vocabulary.errors import ModelLoadError
from lmpress.vocabulary.types import GenerationParams


def make(model: str, **overrides):
    return create_engine(load_config(overrides={"model.model_name": model, **overrides}))


@pytest.fixture
def config_only(tiny_llama, tmp_path):
    """The tiny model's directory without its weight file."""
    target = tmp_path / "no-weights"
    shutil.copytree(tiny_llama, target, ignore=shutil.ignore_patterns("*.safetensors"))
    return str(target)


def test_random_weights_need_only_the_config(config_only):
    with pytest.raises(ModelLoadError, match="cannot load model"):
        make(config_only)
    engine = make(config_only, **{"model.load_pretrained_weights": False})
    try:
        # random weights may pick EOS at any step: held back, every reply is cut at 4
        params = GenerationParams(max_new_tokens=4, min_tokens=4)
        (result,) = engine.generate(["hello"], params)
        assert result.ok and result.usage.completion_tokens == 4
    finally:
        asyncio.run(engine.aclose())


def test_random_weights_are_not_the_checkpoints(tiny_llama):
    trained = make(tiny_llama)
    fresh = make(tiny_llama, **{"model.load_pretrained_weights": False})
    try:
        name = "model.layers.0.self_attn.q_proj.weight"
        a, b = trained.model.state_dict()[name], fresh.model.state_dict()[name]
        assert a.shape == b.shape and not torch.equal(a, b)
    finally:
        asyncio.run(trained.aclose())
        asyncio.run(fresh.aclose())


def test_model_max_length_caps_the_prompt(tiny_llama):
    engine = make(tiny_llama, **{"model.model_max_length": 64})
    try:
        long, short = engine.generate(["word " * 100, "hi"], GenerationParams(max_new_tokens=2))
        assert long.error is not None and long.error.kind == "context_length_exceeded"
        assert "context is 64" in long.error.message
        assert short.ok
    finally:
        asyncio.run(engine.aclose())


TEMPLATE = (
    "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% if think %}<think>{% endif %}{% endif %}"
)


def test_chat_template_kwargs_reach_the_template(tiny_llama):
    from lmpress.vocabulary.types import Message, Request

    request = Request("r", [Message("user", "hi")], GenerationParams())
    prompts = {}
    for think in (True, False):
        engine = make(
            tiny_llama,
            **{"model.chat_template": TEMPLATE, "model.chat_template_kwargs": {"think": think}},
        )
        try:
            prompts[think] = engine.hf_tokenizer.decode(engine.encode(request))
        finally:
            asyncio.run(engine.aclose())
    assert prompts[True] == "<|user|>hi\n<|assistant|><think>"
    assert prompts[False] == "<|user|>hi\n<|assistant|>"


def test_tokenizer_pad_token_sets_the_pad_token(tiny_llama):
    engine = make(tiny_llama)
    try:
        chosen = engine.hf_tokenizer.convert_ids_to_tokens(5)
        assert engine.hf_tokenizer.pad_token != chosen
    finally:
        asyncio.run(engine.aclose())
    engine = make(tiny_llama, **{"model.tokenizer_pad_token": chosen})
    try:
        assert engine.hf_tokenizer.pad_token_id == 5
    finally:
        asyncio.run(engine.aclose())
