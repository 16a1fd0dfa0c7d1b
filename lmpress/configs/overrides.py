"""One row's (or one chat `/set`'s) generation overrides, applied as a typed replace.

A run's config goes through OmegaConf once (`configs.loading`). Overrides come with every
OpenAI Batch line, and OmegaConf's structured merge cost about 3.7 ms a row there, more than a
remote engine spends sending the row. So each value is converted here by its field's type, the
way OmegaConf converts it ("0.5" is a float, a single stop string a one-item list, "yes" true),
refused with OmegaConf's words and the key's name when it cannot be, range-checked with the
recipe's own checks, and applied with `GenerationParams.replace`.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from collections.abc import Callable, Mapping
from functools import cache
from typing import Any

from lmpress.configs.schema import ModelParams, RemoteParams, RunConfig, check_range
from lmpress.vocabulary.errors import ConfigError
from lmpress.vocabulary.types import GenerationParams

Convert = Callable[[str, Any], Any]  # (the key as shown, the value) -> the field's value
TRUE_WORDS = ("y", "yes", "true", "on", "1")
FALSE_WORDS = ("n", "no", "false", "off", "0")
INTEGER = re.compile(r"[+-]?[0-9][0-9_]*")


class BadValue(ValueError):
    """A value its field's type cannot hold; the message names the key."""


# The config sections whose fields a setting may name without its section.
SECTIONS: dict[str, type] = {
    "generation": GenerationParams,
    "model": ModelParams,
    "remote_params": RemoteParams,
}


def dotted_key(key: str, where: str) -> str:
    """A setting's dotted config key, as `LLM(**settings)` names settings (`where`): as given
    when dotted, else the section that has it; a ConfigError naming the likeliest one."""
    if "." in key or key in {f.name for f in dataclasses.fields(RunConfig)}:
        return key
    known = {
        f.name: f"{section}.{f.name}"
        for section, cls in SECTIONS.items()
        for f in dataclasses.fields(cls)
    }
    if key in known:
        return known[key]
    close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
    if close:
        hint = f" (did you mean {close[0]}=..., {known[close[0]]}?)"
        raise ConfigError(f"{where}: unknown setting '{key}'{hint}")
    raise ConfigError(f"{where}: unknown setting '{key}'; give a dotted key such as 'model.{key}'")


def generation_with_overrides(
    base: GenerationParams, overrides: Mapping[str, Any], source: str = "generation"
) -> GenerationParams:
    """`base` with one row's (or one request's) overrides, type-checked and range-checked."""
    if not overrides:
        return base
    converters = field_converters()
    changes = {}
    for name, value in overrides.items():
        if name not in converters:
            close = difflib.get_close_matches(name, list(converters), n=1, cutoff=0.6)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ConfigError(f"{source}: Key '{name}' not in 'GenerationParams'{hint}")
        try:
            changes[name] = converters[name](name, value)
        except BadValue as exc:
            raise ConfigError(f"{source}: {exc}") from None
    for name, value in changes.items():  # before GenerationParams refuses it unnamed
        check_range(types.SimpleNamespace(**{name: value}), f"generation.{name}", source)
    params = base.replace(**changes)
    for name in changes:
        check_range(params, f"generation.{name}", source)
    return params


@cache
def field_converters() -> dict[str, Convert]:
    """Each GenerationParams field's converter, read from its type hint once."""
    hints = typing.get_type_hints(GenerationParams)
    return {name: _converter(hint) for name, hint in hints.items()}


def _converter(hint: Any) -> Convert:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType) and type(None) in args:
        inner = _converter(next(a for a in args if a is not type(None)))
        return lambda key, value: None if value is None else inner(key, value)
    if origin is list:
        return _list_of(_converter(args[0]), _type_name(args[0]))
    if origin is dict:
        return _dict_of(_converter(args[1]), f"Dict[str, {_type_name(args[1])}]")
    return SCALARS.get(hint, _as_is)


def _to_int(key: str, value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and INTEGER.fullmatch(value.strip()):
        return int(value.strip())
    raise BadValue(_not_converted(key, value, "Integer"))


def _to_float(key: str, value: Any) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    raise BadValue(_not_converted(key, value, "Float"))


def _to_bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value != 0
    if isinstance(value, str) and value.strip().lower() in (*TRUE_WORDS, *FALSE_WORDS):
        return value.strip().lower() in TRUE_WORDS
    _none(key, value, "bool")
    raise BadValue(f"{key}: Value '{value}' is not a valid bool (type {_kind(value)})")


def _to_str(key: str, value: Any) -> str:
    if isinstance(value, (str, int, float)):  # bools too: OmegaConf writes True as 'True'
        return str(value)
    raise BadValue(
        f"{key}: Invalid type assigned: {type(value).__name__} is not a subclass of str. "
        f"value: {value}"
    )


def _as_is(key: str, value: Any) -> Any:
    return value


SCALARS: dict[Any, Convert] = {int: _to_int, float: _to_float, bool: _to_bool, str: _to_str}


def _list_of(item: Convert, item_name: str) -> Convert:
    def convert(key: str, value: Any) -> list[Any]:
        if value is None:
            raise BadValue(f"{key}: field '{key}' is not Optional")
        values = value if isinstance(value, list) else [value]  # one value: a one-item list
        return [item(f"{key}[{i}]", v) for i, v in enumerate(values)]

    return convert


def _dict_of(item: Convert, type_name: str) -> Convert:
    def convert(key: str, value: Any) -> dict[str, Any]:
        if value is None:
            raise BadValue(f"{key}: field '{key}' is not Optional")
        if not isinstance(value, Mapping):
            raise BadValue(f"{key}: Cannot assign {type(value).__name__} to {type_name}")
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise BadValue(
                    f"{key}.{k}: Key {k} ({type(k).__name__}) is incompatible with (str)"
                )
            if v is None and item is not _as_is:
                raise BadValue(f"{key}.{k}: field '{key}.{k}' is not Optional")
            out[k] = item(f"{key}.{k}", v)
        return out

    return convert


def _not_converted(key: str, value: Any, type_name: str) -> str:
    _none(key, value, {"Integer": "int", "Float": "float"}[type_name])
    return f"{key}: Value '{value}' of type '{_kind(value)}' could not be converted to {type_name}"


def _none(key: str, value: Any, field_type: str) -> None:
    if value is None:
        raise BadValue(f"{key}: Incompatible value 'None' for field of type '{field_type}'")


def _kind(value: Any) -> str:
    """A value's type as OmegaConf names it: its containers are ListConfig and DictConfig."""
    return {list: "ListConfig", dict: "DictConfig"}.get(type(value), type(value).__name__)


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) if tp is not Any else "Any"  # type: ignore[return-value]
