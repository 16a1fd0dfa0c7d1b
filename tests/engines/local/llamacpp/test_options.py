"""LLAMACPP's `model.model_kwargs` (llamacpp/options.py): its own settings and the `Llama`
parameters it reads are checked as the config loads; any other key against `Llama`'s
signature when the engine starts, before the weights load."""

from __future__ import annotations

import inspect

import pytest

from lmpress.configs import load_config
from lmpress.engines.local.llamacpp.options import LlamaCppOptions
from lmpress.engines.options import typo_of
from lmpress.engines.registry import create_engine
from lmpress.vocabulary.errors import ConfigError, ModelLoadError


def config(model: str, **model_kwargs):
    overrides = {"model.model_name": model, "model.model_kwargs": model_kwargs}
    return load_config(overrides=overrides, engine="LLAMACPP")


def test_a_typo_of_a_llama_parameter_is_refused_before_the_weights(tmp_path):
    # A GGUF header and nothing else: a load that gets as far as the weights fails on it.
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + bytes(60))
    with pytest.raises(ConfigError) as caught:
        create_engine(config(str(broken), rope_freq_bas=10000.0))
    assert str(caught.value) == (
        "model.model_kwargs.rope_freq_bas: not a llama-cpp-python Llama parameter; "
        "did you mean 'rope_freq_base'?"
    )
    with pytest.raises(ModelLoadError, match="cannot load GGUF model"):
        create_engine(config(str(broken), rope_freq_base=10000.0))


def test_no_llama_parameter_is_taken_for_a_typo_of_a_setting():
    from llama_cpp import Llama

    names = LlamaCppOptions.names()
    parameters = set(inspect.signature(Llama.__init__).parameters) - {"self"}
    assert set(names) - {"filename", "mmproj", "kv_unified", "use_extra_bufts"} <= parameters
    mistaken = {k: typo_of(k, names) for k in parameters - set(names)}
    assert {k: v for k, v in mistaken.items() if v} == {}
