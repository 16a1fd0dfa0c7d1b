"""NATIVE's `model.model_kwargs` (native/options.py): its own settings are checked as the config
loads; the keys it hands to transformers' `from_pretrained` are checked against what that takes
once transformers is imported, before any weights are read."""

from __future__ import annotations

import asyncio
import shutil

import pytest

from lmpress.configs import load_config
from lmpress.engines.local.native.options import NativeOptions, from_pretrained_arguments
from lmpress.engines.options import typo_of
from lmpress.engines.registry import create_engine
from lmpress.vocabulary.errors import ConfigError, ModelLoadError
from lmpress.vocabulary.types import GenerationParams


def config(model: str, **model_kwargs):
    overrides = {"model.model_name": model, "model.model_kwargs": model_kwargs}
    return load_config(overrides=overrides, engine="NATIVE")


@pytest.fixture(scope="module")
def weightless(tiny_llama, tmp_path_factory) -> str:
    """The tiny model's directory without its weights file: a load that gets as far as the
    weights fails on it, so a refusal of a key proves the key was checked before they were."""
    directory = tmp_path_factory.mktemp("weightless") / "model"
    shutil.copytree(tiny_llama, directory, ignore=shutil.ignore_patterns("*.safetensors"))
    return str(directory)


def test_a_typo_of_a_from_pretrained_argument_is_refused_before_the_weights(weightless):
    with pytest.raises(ConfigError) as caught:
        create_engine(config(weightless, device_mapp="cpu"))
    assert str(caught.value) == (
        "model.model_kwargs.device_mapp: not a NATIVE setting, a transformers from_pretrained "
        "argument or a model config field; did you mean 'device_map'?"
    )
    # The same run with the argument spelt right passes the check and reaches the weights.
    with pytest.raises(ModelLoadError, match="cannot load model"):
        create_engine(config(weightless, low_cpu_mem_usage=True))


def test_settings_and_from_pretrained_arguments_still_load_and_answer(tiny_llama):
    # kv_cache_gb and prefix_reuse are NATIVE's; low_cpu_mem_usage goes to from_pretrained
    # (which accepts and drops it), use_cache overrides a field of the model's config.
    engine = create_engine(
        config(tiny_llama, kv_cache_gb=0.01, prefix_reuse=False, low_cpu_mem_usage=True,
               use_cache=True)
    )  # fmt: skip
    try:
        assert engine.kv_budget_tokens > 0 and engine.prefix_reuse is False
        [result] = engine.generate(["hello"], GenerationParams(max_new_tokens=3, min_tokens=3))
        assert result.ok and result.usage.completion_tokens == 3
    finally:
        asyncio.run(engine.aclose())


def test_no_argument_from_pretrained_takes_is_taken_for_a_typo_of_a_setting(tiny_llama):
    from transformers import AutoConfig

    names = NativeOptions.names()
    fields = AutoConfig.from_pretrained(tiny_llama).to_dict()
    assert "device_map" in from_pretrained_arguments()
    mistaken = {k: typo_of(k, names) for k in {*from_pretrained_arguments(), *fields}}
    assert {k: v for k, v in mistaken.items() if v and k not in names} == {}
