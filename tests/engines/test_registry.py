"""Engine names, lazy imports, plugins and the messages for engines that cannot run."""

from __future__ import annotations

import pytest

from lmpress.configs import load_config
from lmpress.engines.registry import (
    EngineSpec,
    check_engine,
    engine_names,
    engine_status,
    install_hint,
    load_engine_class,
    missing_modules,
)
from lmpress.vocabulary.errors import ConfigError, EngineUnavailableError, UnsupportedParamError
from tests.conftest import run_lmpress, with_plugin

RESERVED = ["NATIVE", "VLLM", "LLAMACPP", "OPENAI", "ANTHROPIC", "REMOTE", "REMOTE_VLLM", "GEMINI",
            "GOOGLE_VERTEX", "TOGETHER", "PARASAIL", "DEEPSEEK", "OPENROUTER", "FIREWORKS"]  # fmt: skip


def test_every_reserved_name_is_registered():
    assert set(RESERVED) <= set(engine_names())


def test_names_are_case_insensitive():
    assert load_engine_class("native") is load_engine_class("NATIVE")


def test_unknown_engine():
    with pytest.raises(EngineUnavailableError, match="unknown engine 'nope'"):
        load_engine_class("nope")


def test_missing_extra_gives_the_exact_install_command():
    spec = EngineSpec(
        "X",
        "lmpress.engines.local.native.engine:NativeEngine",
        "native",
        ("no_such_backend_mod",),
        "",
    )
    assert missing_modules(spec) == ["no_such_backend_mod"]
    assert install_hint(spec) == "pip install 'lmpress[native]'"


def test_native_status_here():
    status = engine_status("NATIVE")
    assert status.usable
    assert {"temperature", "top_p", "seed", "n", "stop_strings"} <= status.supported_params


def test_entry_point_plugin_is_listed_and_runs(echo_plugin):
    env = with_plugin(echo_plugin)
    listed = run_lmpress("engines", env=env)
    assert "ECHO" in listed.stdout and "plugin from lmpress_echo:EchoEngine" in listed.stdout
    run = run_lmpress("infer", "--engine", "echo", "hello", env=env)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("ECHO ")
    refused = run_lmpress(
        "infer", "--engine", "echo", "--generation.top_p", "0.5", "hello", env=env
    )
    assert refused.returncode == 2
    assert "engine ECHO does not support generation.top_p" in refused.stderr


@pytest.mark.parametrize(
    ("engine", "key", "value", "expected"),
    [
        ("NATIVE", "kv_cach_gb", "1", "model.model_kwargs.kv_cach_gb: not a NATIVE setting"),
        ("NATIVE", "prefix_reuse", "maybe", "model.model_kwargs.prefix_reuse: 'maybe' is not"),
        ("LLAMACPP", "n_ctxx", "512", "model.model_kwargs.n_ctxx: not a llama-cpp-python"),
        ("LLAMACPP", "seed", "1", "model.model_kwargs.seed: set generation.seed instead"),
        ("VLLM", "max_num_seq", "8", "model.model_kwargs.max_num_seq: not an engine argument"),
    ],
)
def test_the_engines_settings_are_checked_once_the_config_loads(engine, key, value, expected):
    with pytest.raises(ConfigError, match=f"^{expected}"):
        check_engine(load_config(overrides=[(f"model.model_kwargs.{key}", value)], engine=engine))


def test_unknown_engine_is_refused_with_a_suggestion():
    with pytest.raises(ConfigError, match=r"unknown engine 'NATIV'.*did you mean 'NATIVE'"):
        check_engine(load_config(engine="nativ"))


def test_adapters_on_an_engine_that_cannot_run_them_are_refused_once_the_config_loads():
    config = load_config(overrides=[("model.adapters.lora-a", "/adapters/a")], engine="OPENAI")
    with pytest.raises(UnsupportedParamError, match=r"^model.adapters: engine OPENAI cannot"):
        check_engine(config)


def test_an_adapter_model_an_engine_would_ignore_is_refused_once_the_config_loads():
    # LLAMACPP chooses adapters per row instead: it says so; a remote API merges none.
    config = load_config(overrides=[("model.adapter_model", "/adapters/a")], engine="LLAMACPP")
    with pytest.raises(UnsupportedParamError) as refused:
        check_engine(config)
    assert str(refused.value) == (
        "model.adapter_model: engine LLAMACPP cannot merge an adapter into its model; name it "
        "under model.adapters and choose it per row (its `adapter` column)"
    )
    config = load_config(overrides=[("model.adapter_model", "/adapters/a")], engine="OPENAI")
    with pytest.raises(UnsupportedParamError, match=r"^model.adapter_model: engine OPENAI"):
        check_engine(config)
