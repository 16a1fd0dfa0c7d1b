"""A step's settings as a strict pydantic model, and pydantic's refusal as one line.

A pipeline file is checked whole when it loads, before any model is: a misspelt key, a string
where a number goes, a missing rubric each stop the run with one line that names the key (the
caller puts the file and the step in front, `where`), never pydantic's multi-line report.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from lmpress.configs.loading import suggest
from lmpress.vocabulary.errors import ConfigError

# Where the same key is written by YAML and by Python, the value must already be of its type:
# "10" is not taken for 10, nor 1 for true.
STRICT = ConfigDict(strict=True, extra="forbid")

SettingsT = TypeVar("SettingsT", bound=BaseModel)


class StepSettings(BaseModel):
    """Base of a step's settings: strict, unknown keys refused."""

    model_config = STRICT


def validated(
    model: type[SettingsT], data: Mapping[str, Any], where: str = "", section: str = ""
) -> SettingsT:
    """`data` as `model`, or a ConfigError naming the first key pydantic refused.

    Args:
        where: put in front of the line ("pipeline.yaml: step 'score': ").
        section: put in front of the key, for a mapping nested in the settings
            ("judge_params.").
    """
    if not isinstance(data, Mapping):
        what = section.rstrip(".") or "the settings"
        raise ConfigError(f"{where}{what}: give a mapping of keys, got {type(data).__name__}")
    try:
        return model.model_validate(dict(data))
    except ValidationError as exc:
        raise ConfigError(where + refusal(exc, model, section)) from None


def refusal(exc: ValidationError, model: type[BaseModel], section: str = "") -> str:
    """pydantic's first complaint as "key: what is wrong"."""
    first = exc.errors()[0]
    # A value's type inside a union shows in `loc` as its name (`str`, `list[str]`).
    loc = [str(part) for part in first["loc"] if not _is_type_name(part)]
    key = section + ".".join(loc)
    if first["type"] == "extra_forbidden":
        known = [section + name for name in model.model_fields]
        return f"unknown key '{key}'{suggest(key, known)}"
    if first["type"] == "missing":
        return f"'{key}' is required"
    message = first["msg"].removeprefix("Value error, ")
    if not loc:  # a model validator's complaint about the whole mapping
        return message
    shown = repr(first["input"])
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return f"{key}: {message} (got {shown})"


def _is_type_name(part: Any) -> bool:
    return isinstance(part, str) and (
        part in ("str", "int", "float", "bool", "list", "dict", "none") or "[" in part
    )
