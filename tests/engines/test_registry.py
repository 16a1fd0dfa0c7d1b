"""Engine names, lazy imports, plugins and the messages for engines that cannot run."""

from __future__ import annotations

import pytest

from lmpress.engines.registry import (
    EngineSpec,
    engine_names,
    engine_status,
    install_hint,
    load_engine_class,
    missing_modules,
)
from lmpress.vocabulary.errors import EngineUnavailableError
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
