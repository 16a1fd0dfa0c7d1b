"""Engine NAME -> engine class, imported on first use so that `--help` imports no backend.

A local engine is one row of `LOCAL` plus its folder under engines/local/; a remote provider is
one row of engines/remote/presets.py. Third-party engines register through the `lmpress.engines`
entry-point group (`MYENGINE = "my_package.engine:MyEngine"`). Nothing else in lmpress knows an
engine's name: what it needs to know it asks the class (engines/base.py).
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
from dataclasses import dataclass
from functools import cache
from importlib.metadata import entry_points

from lmpress.configs.loading import suggest
from lmpress.configs.schema import RunConfig
from lmpress.engines.base import Engine, check_adapters_taken, check_kv_cache_dtype, check_task
from lmpress.engines.options import Setting, check_model_kwargs
from lmpress.engines.remote import presets
from lmpress.vocabulary.embeddings import loads_for
from lmpress.vocabulary.errors import ConfigError, EngineUnavailableError, UnsupportedParamError

ENTRY_POINT_GROUP = "lmpress.engines"


@dataclass(frozen=True)
class EngineSpec:
    name: str
    target: str  # "module:Class"
    extra: str | None  # the lmpress extra that installs its backend
    requires: tuple[str, ...]  # importable modules the backend needs
    summary: str
    preset: bool = False  # a row of engines/remote/presets.py, bound onto its protocol class


LOCAL: tuple[EngineSpec, ...] = (
    EngineSpec(
        "NATIVE",
        "lmpress.engines.local.native.engine:NativeEngine",
        "native",
        ("torch", "transformers"),
        "Hugging Face transformers + PyTorch, CPU or CUDA",
    ),
    EngineSpec(
        "VLLM",
        "lmpress.engines.local.vllm.engine:VllmEngine",
        "vllm",
        ("vllm",),
        "vLLM's engine (on a GPU, or vLLM's CPU build)",
    ),
    EngineSpec(
        "LLAMACPP",
        "lmpress.engines.local.llamacpp.engine:LlamaCppEngine",
        "llamacpp",
        ("llama_cpp",),
        "GGUF models via llama-cpp-python",
    ),
)


# The remote engines, one per row of the providers table.
REMOTE: tuple[EngineSpec, ...] = tuple(
    EngineSpec(p.name, p.engine, p.extra, p.requires, p.summary, preset=True)
    for p in presets.PROVIDERS
)
BUILTIN = LOCAL + REMOTE


@cache
def _specs() -> dict[str, EngineSpec]:
    specs = {spec.name: spec for spec in BUILTIN}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        name = ep.name.upper()
        specs.setdefault(name, EngineSpec(name, ep.value, None, (), f"plugin from {ep.value}"))
    return specs


def engine_names() -> list[str]:
    return list(_specs())


def get_spec(name: str) -> EngineSpec:
    spec = _specs().get(name.upper())
    if spec is None:
        raise EngineUnavailableError(
            f"unknown engine '{name}'; run 'lmpress engines' to see them all"
        )
    return spec


def missing_modules(spec: EngineSpec) -> list[str]:
    missing = []
    for module in spec.requires:
        try:
            if importlib.util.find_spec(module) is None:
                missing.append(module)
        except ModuleNotFoundError:  # a parent package is missing
            missing.append(module)
    return missing


def install_hint(spec: EngineSpec) -> str:
    return f"pip install 'lmpress[{spec.extra}]'" if spec.extra else "install its package"


def load_engine_class(name: str) -> type[Engine]:
    spec = get_spec(name)
    missing = missing_modules(spec)
    if missing:
        raise EngineUnavailableError(
            f"engine {spec.name} needs {', '.join(missing)}, which is not installed: "
            f"{install_hint(spec)}"
        )
    return _engine_class(spec)


def engine_class(name: str) -> type[Engine]:
    """The class an engine name stands for, imported without checking for its backend: enough
    to ask it what the contract answers without one (`prompt_counter`, `dtype_in_use`) on a
    machine that cannot run it."""
    return _engine_class(get_spec(name))


def _engine_class(spec: EngineSpec) -> type[Engine]:
    if spec.preset:
        return presets.engine_class(spec.name)
    module_name, _, class_name = spec.target.partition(":")
    return getattr(importlib.import_module(module_name), class_name)


def check_engine(config: RunConfig) -> None:
    """Refuse, right after the config loads and before any backend is imported, an engine name
    no engine answers to and `model.model_kwargs` that the engine's typed settings
    (`Engine.options`) refuse: a typo, a wrong type; and `model.adapters` on an engine that
    cannot run them (`Engine.takes_adapters`). Every front calls it on the config it
    loaded (the commands through `cli.options.load_run_config`, serve, `LLM`), and
    `create_engine` on the config it is given."""
    names = engine_names()
    if config.engine not in names:
        raise ConfigError(
            f"engine: unknown engine '{config.engine}'{suggest(config.engine, names)} "
            f"Run 'lmpress engines' to see them all."
        )
    try:
        cls = engine_class(config.engine)
    except ImportError:  # a broken plugin: creating the engine says so
        return
    check_adapters_taken(cls, config)
    check_kv_cache_dtype(cls, config)
    options = cls.options
    if options is not None:
        check_model_kwargs(options, config.model.model_kwargs)


def engine_settings(name: str) -> tuple[list[Setting], str | None] | None:
    """The `model.model_kwargs` settings an engine reads (and what it hands the other keys
    to), for `lmpress engines NAME`; None where it declares none."""
    options = engine_class(name).options
    return None if options is None else (options.settings(), options.passes_to)


def with_model_task(config: RunConfig) -> RunConfig:
    """`config` with the task its model is made for (`Engine.model_task`: MiniLM embeds, a
    cross-encoder scores), where neither a recipe nor `--task` chose one."""
    if config.task_chosen():
        return config
    task = engine_class(config.engine).model_task(config)
    if task == config.task:
        return config
    return dataclasses.replace(config, task=task).mark_task_chosen(False)


def create_engine(config: RunConfig) -> Engine:
    """Build the engine a config names; its backend is imported and the model loaded here."""
    check_engine(config)
    cls = load_engine_class(config.engine)
    reason = cls.unavailable_reason()
    if reason:
        raise EngineUnavailableError(f"engine {cls.name} cannot run here: {reason}")
    if cls.takes_hub_ids:
        from lmpress.engines.common.hub import check_hub_model

        check_hub_model(config.model.model_name)
    if loads_for(config.task) != config.task:
        # A likelihood run's model loads to generate: it scores with its own next-token
        # logprobs. The run's task is checked against what the engine answers first.
        check_task(cls, config.task)
        if "prompt_logprobs" not in cls.supported_params:
            raise UnsupportedParamError(
                f"task: engine {cls.name} cannot {config.task} here: it returns no prompt "
                f"logprobs; use NATIVE"
            )
        config = dataclasses.replace(config, task=loads_for(config.task))
    return cls(config)


@dataclass
class EngineStatus:
    name: str
    summary: str
    usable: bool
    why: str
    supported_params: frozenset[str]
    tasks: frozenset[str] = frozenset({"generate"})  # what it answers (Engine.tasks)


def engine_status(name: str) -> EngineStatus:
    """Whether an engine can run here and what it supports, without importing its backend."""
    spec = get_spec(name)
    try:
        cls = _engine_class(spec)
    except Exception as exc:  # a broken plugin must not break the listing
        return EngineStatus(spec.name, spec.summary, False, f"cannot import: {exc}", frozenset())
    params, tasks = cls.supported_params, cls.tasks
    missing = missing_modules(spec)
    if missing:
        why = f"needs {', '.join(missing)}: {install_hint(spec)}"
        return EngineStatus(spec.name, spec.summary, False, why, params, tasks)
    reason = cls.unavailable_reason()
    if reason is None:
        reason_or_note = _missing_key_note(cls)
        return EngineStatus(spec.name, spec.summary, True, reason_or_note, params, tasks)
    return EngineStatus(spec.name, spec.summary, False, reason, params, tasks)


def _missing_key_note(cls: type) -> str:
    """For a remote engine whose key is required but not set: say which variable to set, so
    "usable" does not promise a run that would fail at its first request."""
    variable = getattr(cls, "default_key_env", None)
    if variable and getattr(cls, "key_required", False) and not os.environ.get(variable, ""):
        return f"the API key is missing: export {variable}=..."
    return ""
