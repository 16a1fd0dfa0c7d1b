"""Contract tests of LoRA adapters on the VLLM engine (lmpress/engines/local/vllm/lora.py):
the engine arguments lmpress derives from `model.adapters` and `model.adapter_model`, and the
LoRARequest each request reaches vLLM with, against the stand-in (contract_support.py). They
prove the translation, not vLLM: tests/engines/local/vllm_real/test_adapters.py runs adapters
chosen per row through vLLM's CPU build against vLLM's own LoRARequests.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path

import pytest

from lmpress.configs import load_config
from lmpress.engines.local.vllm.translate import engine_settings
from lmpress.engines.registry import create_engine
from lmpress.vocabulary.errors import (
    ConfigError,
    ModelLoadError,
    RequestError,
    UnsupportedParamError,
)
from lmpress.vocabulary.types import GenerationParams, Message, Request
from tests.engines.local.vllm.contract_support import model_dir, standin

__all__ = ["model_dir", "standin"]  # fixtures


def config_with(model_dir: str, **model_fields):
    overrides = {"model.model_name": model_dir}
    overrides.update({f"model.{k}": v for k, v in model_fields.items()})
    return load_config(None, overrides, engine="VLLM")


def write_adapter(path: Path, **peft) -> str:
    path.mkdir(parents=True)
    (path / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", **peft}))
    return str(path)


def test_adapter_enables_lora_with_its_rank_rounded_up(tmp_path, model_dir):
    adapter = write_adapter(tmp_path / "my-lora", r=4)
    settings = engine_settings(config_with(model_dir, adapter_model=adapter))
    assert (settings.args["enable_lora"], settings.args["max_lora_rank"]) == (True, 8)
    assert "max_loras" not in settings.args  # vLLM's one slot holds it: every row runs on it
    assert settings.adapter == adapter
    patterned = write_adapter(tmp_path / "patterned", r=16, rank_pattern={"q_proj": 64})
    assert (
        engine_settings(config_with(model_dir, adapter_model=patterned)).args["max_lora_rank"] == 64
    )


def test_adapters_give_a_slot_each_and_the_largest_rank(tmp_path, model_dir):
    adapters = {
        "small": write_adapter(tmp_path / "small", r=4),
        "large": write_adapter(tmp_path / "large", r=12),
    }
    settings = engine_settings(config_with(model_dir, adapters=adapters))
    assert settings.adapters == adapters
    picked = {k: settings.args[k] for k in ("enable_lora", "max_loras", "max_lora_rank")}
    assert picked == {"enable_lora": True, "max_loras": 2, "max_lora_rank": 16}
    # vLLM's CPU build: one slot more, left empty for the base rows batched beside them.
    on_cpu = engine_settings(config_with(model_dir, adapters=adapters), spare_lora_slot=True)
    assert on_cpu.args["max_loras"] == 3
    # Set by hand, each wins (the spare slot still added on a CPU).
    by_hand = config_with(
        model_dir, adapters=adapters, model_kwargs={"max_loras": 1, "max_lora_rank": 64}
    )
    args = engine_settings(by_hand, spare_lora_slot=True).args
    assert (args["max_loras"], args["max_lora_rank"]) == (2, 64)


def test_unusable_adapters(tmp_path, model_dir):
    huge = write_adapter(tmp_path / "huge", r=1024)
    with pytest.raises(ModelLoadError, match="LoRA rank 1024 is above the 512 vLLM supports"):
        engine_settings(config_with(model_dir, adapter_model=huge))
    with pytest.raises(ModelLoadError, match="model.adapters.big: LoRA rank 1024 is above"):
        engine_settings(config_with(model_dir, adapters={"big": huge}))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ModelLoadError, match="adapter_config.json is not a PEFT LoRA config"):
        engine_settings(config_with(model_dir, adapter_model=str(empty)))
    with pytest.raises(ModelLoadError, match="model.adapter_model: './nowhere' does not exist"):
        engine_settings(config_with(model_dir, adapter_model="./nowhere"))
    with pytest.raises(ModelLoadError, match="model.adapters.gone: './nowhere' does not exist"):
        engine_settings(config_with(model_dir, adapters={"gone": "./nowhere"}))
    small = write_adapter(tmp_path / "small", r=4)
    with pytest.raises(ConfigError, match="vLLM applies one LoRA adapter to a request"):
        engine_settings(config_with(model_dir, adapter_model=small, adapters={"small": small}))


def test_each_row_reaches_vllm_with_its_adapters_lora_request(standin, tmp_path, model_dir):
    adapters = {
        "lora-a": write_adapter(tmp_path / "a", r=8),
        "lora-b": write_adapter(tmp_path / "b", r=8),
    }
    config = load_config(
        None, {"model.model_name": model_dir, "model.adapters": adapters}, engine="VLLM"
    )
    engine = create_engine(config)
    try:
        params = GenerationParams(max_new_tokens=4)
        chosen = ["lora-b", None, "lora-a", "lora-b", "lora-c"]
        requests = [
            Request(f"r{i}", [Message("user", "hi there")], params, adapter=name)
            for i, name in enumerate(chosen)
        ]
        results = engine.generate(requests)
        from vllm.v1.engine.async_llm import ENGINES

        sent = {r.request_id.rsplit("-", 1)[0]: r.lora_request for r in ENGINES[-1].requests}
    finally:
        asyncio.run(engine.aclose())
    assert engine.adapter_names == {"lora-a", "lora-b"}
    assert [r.ok for r in results] == [True, True, True, True, False]
    named = {
        rid: None if lora is None else (lora.lora_name, lora.lora_path)
        for rid, lora in sent.items()
    }
    assert named == {
        "r0": ("lora-b", adapters["lora-b"]),
        "r1": None,  # the base model
        "r2": ("lora-a", adapters["lora-a"]),
        "r3": ("lora-b", adapters["lora-b"]),
    }
    # One id an adapter, the same on each of its requests.
    assert sent["r0"].lora_int_id == sent["r3"].lora_int_id != sent["r2"].lora_int_id
    # An adapter the engine does not hold: that row fails alone, with vLLM's 404.
    error = results[-1].error
    assert (error.kind, error.status) == ("not_found", 404)
    assert "'lora-c' does not exist" in error.message


def test_adapters_load_and_unload_at_run_time(standin, tmp_path, model_dir):
    adapters = {"lora-a": write_adapter(tmp_path / "a", r=8)}
    late = write_adapter(tmp_path / "late", r=4)
    config = load_config(
        None, {"model.model_name": model_dir, "model.adapters": adapters}, engine="VLLM"
    )
    engine = create_engine(config)
    hi = Request("hi", [Message("user", "hi")], GenerationParams(max_new_tokens=2))

    async def scenario() -> list:
        from vllm.v1.engine.async_llm import ENGINES

        vllm = ENGINES[-1]
        await engine.load_adapter("late", late)
        loaded = (dict(vllm.loras), engine.adapter_names)
        chosen = await engine.complete(replace(hi, adapter="late"))
        refusals = []
        for name, path in [("late", late), ("big", write_adapter(tmp_path / "big", r=64)),
                           ("gone", str(tmp_path / "gone"))]:  # fmt: skip
            with pytest.raises(RequestError) as refused:
                await engine.load_adapter(name, path)
            refusals.append((refused.value.status, str(refused.value)))
        await engine.unload_adapter("late")
        after = await engine.complete(replace(hi, adapter="late"))
        with pytest.raises(RequestError) as missing:
            await engine.unload_adapter("late")
        await engine.aclose()
        return [loaded, chosen, refusals, vllm.loras, after, missing.value.status]

    (held, names), chosen, refusals, left, after, missing = asyncio.run(scenario())
    [request] = held.values()
    assert (request.lora_name, request.lora_path, request.lora_int_id) == ("late", late, 2)
    assert names == {"lora-a", "late"}
    assert chosen.ok
    assert [status for status, _ in refusals] == [400, 400, 400]
    assert "'late' is loaded already" in refusals[0][1]
    assert "LoRA rank 64 is above the 8 the engine started with" in refusals[1][1]
    assert "does not exist" in refusals[2][1]
    assert left == {}  # unloaded in vLLM too
    assert (after.error.kind, after.error.status) == ("not_found", 404)
    assert missing == 404


def test_an_engine_started_without_lora_loads_no_adapter(standin, tmp_path, model_dir):
    engine = create_engine(config_with(model_dir))
    try:
        with pytest.raises(UnsupportedParamError, match="started without LoRA"):
            asyncio.run(engine.load_adapter("late", write_adapter(tmp_path / "late", r=8)))
    finally:
        asyncio.run(engine.aclose())
