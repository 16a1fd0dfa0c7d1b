"""A run's config: typed defaults, then a recipe, then dotted overrides, then validation.

Every error names where the bad value came from (the recipe file or the `--flag`) and the
dotted key, and for an unknown key the closest valid one.
"""

from __future__ import annotations

import dataclasses
import difflib
import sys
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from lmpress.configs.schema import (
    ENGINE_ALIASES,
    RANGE_CHECKS,
    TRAINING_ONLY,
    RunConfig,
    check_range,
)
from lmpress.vocabulary.embeddings import TASKS
from lmpress.vocabulary.errors import ConfigError, first_line

RECIPE_SUFFIXES = (".yaml", ".yml")


def recipe_dirs() -> list[Path]:
    """Where bundled recipes live: beside the package in a checkout, inside it when installed."""
    package = Path(__file__).resolve().parent.parent
    return [d for d in (package.parent / "recipes", package / "_recipes") if d.is_dir()]


def bundled_recipes() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for directory in recipe_dirs():
        for path in sorted(directory.iterdir()):
            if path.suffix in RECIPE_SUFFIXES:
                found.setdefault(path.stem, path)
    return found


def resolve_recipe(name_or_path: str) -> Path:
    """A recipe path as given, or the bundled recipe of that name."""
    path = Path(name_or_path).expanduser()
    if path.is_file():
        return path
    bundled = bundled_recipes()
    stem = Path(name_or_path).stem if path.suffix in RECIPE_SUFFIXES else name_or_path
    if stem in bundled and (path.suffix == "" or not path.parent.parts):
        return bundled[stem]
    close = difflib.get_close_matches(stem, list(bundled), n=1, cutoff=0.5)
    hint = f" Did you mean the bundled recipe '{close[0]}'?" if close else ""
    names = ", ".join(bundled) or "none"
    raise ConfigError(
        f"recipe '{name_or_path}': no such file and no bundled recipe of that name.{hint} "
        f"Bundled recipes: {names}."
    )


def parse_overrides(args: Sequence[str]) -> tuple[list[tuple[str, str]], list[str]]:
    """Split command-line words into dotted overrides and positional words.

    `--generation.temperature 0.7` and `--generation.temperature=0.7` both give
    ("generation.temperature", "0.7"). Any `--word` whose first segment is a config section or
    top-level key is an override; other `--words` are an error.
    """
    top_level = {f.name for f in dataclasses.fields(RunConfig)}
    overrides: list[tuple[str, str]] = []
    positional: list[str] = []
    i = 0
    while i < len(args):
        word = args[i]
        if word == "--":
            positional.extend(args[i + 1 :])
            break
        if word.startswith("--") and len(word) > 2:
            key, eq, value = word[2:].partition("=")
            if key.split(".")[0] not in top_level:
                raise ConfigError(f"unknown option '--{key}'{suggest(key, _all_keys(), '--')}")
            if not eq:
                if i + 1 >= len(args):
                    raise ConfigError(f"option '--{key}' needs a value")
                i += 1
                value = args[i]
            overrides.append((key, value))
        else:
            positional.append(word)
        i += 1
    return overrides, positional


def load_config(
    recipe: str | None = None,
    overrides: Iterable[tuple[str, str]] | Mapping[str, Any] = (),
    engine: str | None = None,
) -> RunConfig:
    """Merge the defaults, a recipe (a path or a bundled name) and overrides into a RunConfig.

    Override values given as strings are read as YAML scalars ("0.7" is a float, "null" is
    None, "[a, b]" is a list), as on the command line. Whether the engine exists and takes
    `model.model_kwargs` is checked next, by the front (`engines.registry.check_engine`).
    """
    layers: list[tuple[str, dict[str, Any]]] = []
    if recipe:
        path = resolve_recipe(recipe)
        layers.append((str(path), _read_recipe(path)))
    pairs = overrides.items() if isinstance(overrides, Mapping) else overrides
    for key, value in pairs:
        parsed = parse_scalar(value) if isinstance(value, str) else value
        layers.append((f"--{key}", _nest(key, parsed)))
    if engine:
        layers.append(("--engine", {"engine": engine}))

    cfg = OmegaConf.structured(RunConfig)
    explicit: set[str] = set()
    for source, data in layers:
        _check_keys(data, RunConfig, source, prefix="")
        explicit |= set(data.get("generation") or {})
        data = _coerce_lists(data, RunConfig)
        try:
            cfg = OmegaConf.merge(cfg, data)
        except OmegaConfBaseException as exc:
            raise ConfigError(f"{source}: {_omegaconf_message(exc, source)}") from exc
    # GenerationParams refuses a value it cannot hold with a bare ValueError when built; the
    # range checks say the same naming the key, so they run on the merged values first.
    _check_ranges(cfg.generation, "generation")
    try:
        config: RunConfig = OmegaConf.to_object(cfg)  # type: ignore[assignment]
    except OmegaConfBaseException as exc:
        raise ConfigError(_omegaconf_message(exc)) from exc
    config.engine = config.engine.upper()
    config.engine = ENGINE_ALIASES.get(config.engine, config.engine)
    config.generation.mark_explicit(explicit)
    config.mark_task_chosen(any("task" in data for _, data in layers))
    # YAML reads an unquoted `off` as false (and `on` as true), which a str field holds as
    # "False": `prompt_cache: off`, `speculative_method: off` and `cache: on` mean what they say.
    for (section, name), (on, off) in SWITCHES.items():
        part = getattr(config, section)
        value = getattr(part, name)
        setattr(part, name, {"True": on or value, "False": off}.get(value, value))
    validate(config)
    ignored = training_only_fields(config)
    if ignored:
        print(
            f"lmpress: note: ignoring training-only fields {', '.join(ignored)} "
            f"(inference does not read them)",
            file=sys.stderr,
        )
    return config


# String fields whose values include on or off: what YAML's true and false stand for in each.
# None: `on` means nothing there (and is refused as it is).
SWITCHES = {
    ("remote_params", "prompt_cache"): ("auto", "off"),
    ("serve", "cache"): ("on", "off"),
    ("model", "speculative_method"): (None, "off"),
}


def training_only_fields(config: RunConfig) -> list[str]:
    """The Oumi training-only fields a config sets away from their defaults."""
    defaults = RunConfig()
    ignored = []
    for dotted in TRAINING_ONLY:
        section, name = dotted.split(".")
        if getattr(getattr(config, section), name) != getattr(getattr(defaults, section), name):
            ignored.append(dotted)
    return ignored


def _check_ranges(section_value: Any, section: str) -> None:
    for dotted in RANGE_CHECKS:
        if dotted.startswith(f"{section}."):
            check_range(section_value, dotted)


def validate(config: RunConfig) -> None:
    """Refuse impossible values, naming the dotted key. The engine's name and its
    `model.model_kwargs` are the registry's to check (`engines.registry.check_engine`): configs
    sit below engines and know no engine."""
    if config.task not in TASKS:
        raise ConfigError(
            f"task: unknown task '{config.task}'{suggest(config.task, list(TASKS))}; use one "
            f"of {', '.join(TASKS)}"
        )
    for section in ("model", "generation", "remote_params", "serve", "ray"):
        _check_ranges(getattr(config, section), section)
    if config.generation.top_logprobs and not config.generation.logprobs:
        raise ConfigError("generation.top_logprobs: needs generation.logprobs: true")


def config_to_yaml(config: RunConfig) -> str:
    """The config as YAML, with any literal API key replaced by a mark."""
    data = OmegaConf.to_container(OmegaConf.structured(config))
    assert isinstance(data, dict)
    if data["remote_params"].get("api_key"):
        data["remote_params"]["api_key"] = "***redacted***"
    return yaml.safe_dump(data, sort_keys=False)


# --- helpers -------------------------------------------------------------------------------


def _read_recipe(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "not valid YAML"
        raise ConfigError(f"{path}{where}: {problem}") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read recipe ({exc})") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a recipe is a mapping of sections, got {type(data).__name__}")
    if {"resources", "run"} <= set(data) and "engine" not in data:
        raise ConfigError(
            f"{path}: an Oumi job config (for `oumi launch`: resources, setup, run), not an "
            f"inference config; give the inference config its run command names"
        )
    return data


def parse_scalar(text: str) -> Any:
    """A command-line value read as a YAML scalar: "0.7" a float, "null" None, "[a, b]" a list."""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    if value is None and text.strip() not in ("", "~", "null", "Null", "NULL"):
        return text  # "###" is a YAML comment, but on a command line it is a value
    return value


def _nest(dotted: str, value: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    node = out
    parts = dotted.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    return out


def _unwrap_optional(tp: Any) -> Any:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0] if len(args) == 1 else tp
    return tp


def _field_types(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: _unwrap_optional(hints[f.name]) for f in dataclasses.fields(cls)}


def _all_keys(cls: type = RunConfig, prefix: str = "") -> list[str]:
    keys = []
    for name, tp in _field_types(cls).items():
        dotted = f"{prefix}{name}"
        keys.append(dotted)
        if dataclasses.is_dataclass(tp):
            keys.extend(_all_keys(tp, f"{dotted}."))
    return keys


def suggest(key: str, candidates: Sequence[str], dashes: str = "") -> str:
    """' (did you mean ...)', spelled as the user spelled the key: with `--` on the command
    line, so the suggestion can be pasted back as it is."""
    # The right name in the wrong section first: generation.api_url -> remote_params.api_url.
    leaf = key.rsplit(".", 1)[-1]
    close = [c for c in candidates if c != key and c.rsplit(".", 1)[-1] == leaf][:1]
    if not close:
        close = difflib.get_close_matches(key, candidates, n=1, cutoff=0.6)
    return f" (did you mean '{dashes}{close[0]}'?)" if close else ""


def _check_keys(data: Mapping[str, Any], cls: type, source: str, prefix: str) -> None:
    fields = _field_types(cls)
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if key not in fields:
            dashes = "--" if source.startswith("--") else ""
            hint = suggest(dotted, _all_keys(), dashes)
            what = "unknown key" if source == f"--{dotted}" else f"unknown key '{dotted}'"
            raise ConfigError(f"{source}: {what}{hint}")
        tp = fields[key]
        if dataclasses.is_dataclass(tp):
            if value is None:
                continue
            if not isinstance(value, Mapping):
                raise ConfigError(f"{source}: '{dotted}' is a section; give it a mapping of keys")
            _check_keys(value, tp, source, prefix=f"{dotted}.")


def _coerce_lists(data: Mapping[str, Any], cls: type) -> dict[str, Any]:
    """A single value given for a list field becomes a one-item list."""
    fields = _field_types(cls)
    out: dict[str, Any] = {}
    for key, value in data.items():
        tp = fields[key]
        if dataclasses.is_dataclass(tp) and isinstance(value, Mapping):
            value = _coerce_lists(value, tp)
        elif typing.get_origin(tp) is list and value is not None and not isinstance(value, list):
            value = [value]
        out[key] = value
    return out


def _omegaconf_message(exc: OmegaConfBaseException, source: str = "") -> str:
    """OmegaConf's first line, prefixed with the key unless the source already names it."""
    key = getattr(exc, "full_key", None)
    text = first_line(exc)
    return f"{key}: {text}" if key and source != f"--{key}" else text
