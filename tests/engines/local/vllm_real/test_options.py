"""VLLM's typed settings (vllm/options.py) against the real AsyncEngineArgs: each is one of its
fields, and none of its other fields reads as a typo of one (which config loading would refuse
before vLLM is imported)."""

from __future__ import annotations

import dataclasses

from lmpress.engines.local.vllm.options import VllmOptions
from lmpress.engines.options import typo_of


def test_the_settings_are_real_engine_arguments_and_no_other_reads_as_their_typo():
    from vllm.engine.arg_utils import AsyncEngineArgs

    fields = {f.name for f in dataclasses.fields(AsyncEngineArgs)}
    names = VllmOptions.names()
    assert set(names) - {"kv_unified"} <= fields  # kv_unified is llama.cpp's, dropped
    mistaken = {k: typo_of(k, names) for k in fields - set(names)}
    assert {k: v for k, v in mistaken.items() if v} == {}
