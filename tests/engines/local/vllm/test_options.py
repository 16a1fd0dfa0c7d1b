"""VLLM's `model.model_kwargs` (vllm/options.py): the engine arguments lmpress documents and reads,
checked as the config loads with vLLM's own messages; the rest checked against AsyncEngineArgs'
fields once vLLM is imported (test_engine_contract.py)."""

from __future__ import annotations

import dataclasses

import pytest

from lmpress.configs import load_config
from lmpress.engines.local.vllm.options import VllmOptions
from lmpress.engines.local.vllm.translate import engine_settings
from lmpress.engines.options import typo_of
from lmpress.vocabulary.errors import ConfigError
from tests.engines.local.vllm.contract_support import model_dir, standin

__all__ = ["model_dir", "standin"]  # fixtures


def config(model: str, **model_kwargs):
    overrides = {"model.model_name": model, "model.model_kwargs": model_kwargs}
    return load_config(overrides=overrides, engine="VLLM")


def test_a_documented_argument_of_the_wrong_kind_is_refused_as_the_config_loads(model_dir):
    with pytest.raises(ConfigError) as caught:
        config(model_dir, max_num_seqs=0)
    assert str(caught.value) == (
        "model.model_kwargs.max_num_seqs: 0 must be a number of sequences, at least 1"
    )


def test_null_leaves_a_setting_to_vllm(model_dir):
    args = engine_settings(config(model_dir, gpu_memory_utilization=None, max_num_seqs=8)).args
    assert "gpu_memory_utilization" not in args and args["max_num_seqs"] == 8


def test_the_settings_are_engine_arguments_and_no_other_argument_reads_as_their_typo(standin):
    from vllm.engine.arg_utils import AsyncEngineArgs

    fields = {f.name for f in dataclasses.fields(AsyncEngineArgs)}
    names = VllmOptions.names()
    # kv_unified is llama.cpp's; reasoning_parser is in newer vLLMs than the stand-in's.
    assert set(names) - {"kv_unified", "reasoning_parser"} <= fields
    mistaken = {k: typo_of(k, names) for k in fields - set(names)}
    assert {k: v for k, v in mistaken.items() if v} == {}
