"""An engine's `model.model_kwargs`, typed: what each setting is, checked before any work.

An engine declares the settings it reads itself as a dataclass of `EngineOptions` (its folder's
options.py), each field made by `setting(default, "one line on what it does")`, and names it
as `Engine.options`. The config is checked against it when it loads (`check_model_kwargs`): a
setting of the wrong type, a refused key, or a key one typo away from a setting is one line
naming `model.model_kwargs.KEY`. Keys the engine hands on to its backend (transformers'
`from_pretrained`, llama-cpp-python's `Llama`, vLLM's engine arguments) cannot be checked here
without importing the backend, which config loading never does: the engine checks them against
the backend's signature when it starts, before any weights load (`check_passed_through`).
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, TypeVar

from lmpress.vocabulary.errors import ConfigError


def setting(default: Any, description: str) -> Any:
    """A field of an engine's options: its default and the one line `lmpress engines NAME`
    shows. A list or dict default is copied for each instance."""
    metadata = {"description": description}
    if isinstance(default, list | dict):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


@dataclass(frozen=True)
class Setting:
    """One setting as `lmpress engines NAME` lists it."""

    name: str
    type: str
    default: Any
    description: str


Options = TypeVar("Options", bound="EngineOptions")


@dataclass
class EngineOptions:
    """The base of every engine's options. A subclass's fields are its settings."""

    # Where the keys that are not settings go ("transformers' from_pretrained"); None: nowhere,
    # so such a key is refused when the config loads.
    passes_to: ClassVar[str | None] = None
    # What a key must be, as a refusal of an unknown one says it: "not {known_as}".
    known_as: ClassVar[str] = "a setting of this engine"
    # Keys the backend would take that mean nothing here, with what to do instead.
    refused: ClassVar[Mapping[str, str]] = {}

    @classmethod
    def settings(cls) -> list[Setting]:
        hints = typing.get_type_hints(cls)
        found = []
        for f in dataclasses.fields(cls):
            made = f.default_factory
            default = f.default if made is dataclasses.MISSING else made()
            found.append(
                Setting(f.name, type_name(hints[f.name]), default, f.metadata["description"])
            )
        return found

    @classmethod
    def unknown(cls, key: str, meant: str | None, names: list[str]) -> str:
        """The refusal of a key that is no setting (nor, where checked, a backend's argument)."""
        hint = f"did you mean '{meant}'?" if meant else f"valid keys: {', '.join(sorted(names))}"
        return f"model.model_kwargs.{key}: not {cls.known_as}; {hint}"

    @classmethod
    def value_problem(cls, key: str, value: Any, tp: Any) -> str | None:
        """What is wrong with `value` for the setting `key` of type `tp`, as the end of a
        refusal ("is not a whole number"); None: nothing."""
        return None if fits(value, tp) else f"is not {describe(tp)}"

    def check(self) -> None:
        """Refuse a value of the right type that is still out of range (ConfigError naming the
        key): a subclass's own rules."""

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def of(cls: type[Options], model_kwargs: Mapping[str, Any]) -> Options:
        """The settings `model_kwargs` gives (defaults for the rest), checked."""
        check_model_kwargs(cls, model_kwargs)
        names = set(cls.names())
        return cls(**{k: v for k, v in model_kwargs.items() if k in names})

    @classmethod
    def passed_through(cls, model_kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """The keys of `model_kwargs` that are not settings: what goes to the backend."""
        names = set(cls.names())
        return {k: v for k, v in model_kwargs.items() if k not in names}


def check_model_kwargs(options: type[EngineOptions], model_kwargs: Mapping[str, Any]) -> None:
    """Refuse, naming the key, a setting of the wrong type, a refused key, or an unknown key
    (one a typo away from a setting is refused even where unknown keys pass through)."""
    hints = typing.get_type_hints(options)
    names = options.names()
    for key, value in model_kwargs.items():
        if key in options.refused:
            raise ConfigError(f"model.model_kwargs.{key}: {options.refused[key]}")
        if key in names:
            problem = options.value_problem(key, value, hints[key])
            if problem:
                raise ConfigError(f"model.model_kwargs.{key}: {value!r} {problem}")
            continue
        meant = typo_of(key, names)
        if meant or options.passes_to is None:
            raise ConfigError(unknown_key(options, key, names, meant))
    options(**{k: v for k, v in model_kwargs.items() if k in names}).check()


def check_passed_through(
    options: type[EngineOptions], model_kwargs: Mapping[str, Any], accepted: Iterable[str]
) -> dict[str, Any]:
    """The keys of `model_kwargs` the backend takes, each checked to be one of `accepted` (its
    signature's names): for the engine to call when its backend is imported, before weights."""
    passed = options.passed_through(model_kwargs)
    accepted = set(accepted)
    for key in passed:
        if key not in accepted:
            usable = sorted((accepted | set(options.names())) - set(options.refused))
            raise ConfigError(unknown_key(options, key, usable))
    return passed


def unknown_key(
    options: type[EngineOptions], key: str, names: Iterable[str], meant: str | None = None
) -> str:
    names = list(names)
    close = [meant] if meant else difflib.get_close_matches(key, names, n=1, cutoff=0.6)
    return options.unknown(key, close[0] if close else None, names)


def typo_of(key: str, names: Iterable[str]) -> str | None:
    """The name `key` is a typo of: one or two letters added, dropped, changed or swapped (one
    in a name of five letters or fewer). Closer than difflib's "close": a backend's own
    argument that extends a setting's name (`n_threads_batch`, `tokenizer`) is no typo of it."""
    found = [(edits(key, name), name) for name in names]
    found = [(n, name) for n, name in found if n <= (1 if len(name) <= 5 else 2)]
    return min(found)[1] if found else None


def edits(a: str, b: str) -> int:
    """The edits from `a` to `b`: insertions, deletions, substitutions and swaps of neighbours
    (the optimal string alignment distance)."""
    before, row = None, list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        new = [i] + [0] * len(b)
        for j, cb in enumerate(b, 1):
            new[j] = min(row[j] + 1, new[j - 1] + 1, row[j - 1] + (ca != cb))
            if before is not None and j > 1 and ca == b[j - 2] and a[i - 2] == cb:
                new[j] = min(new[j], before[j - 2] + 1)
        before, row = row, new
    return row[-1]


# --- types -------------------------------------------------------------------------------------


def fits(value: Any, tp: Any) -> bool:
    """Whether a value read from YAML is of the type a setting declares."""
    if tp is Any:
        return True
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return any(fits(value, arg) for arg in args)
    if origin is Literal:
        return value in args
    if origin is list:
        return isinstance(value, list) and all(fits(v, args[0]) for v in value) if args else True
    if origin is dict:
        return isinstance(value, dict)
    if tp is type(None):
        return value is None
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    return isinstance(value, tp)


WORDS = {bool: "true or false", int: "a whole number", float: "a number", str: "a string"}


def describe(tp: Any) -> str:
    """A type as a refusal says it: `bool | list[int]` is "true or false, or a list of whole
    numbers"."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return ", or ".join(describe(arg) for arg in args)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin is list:
        inner = describe(args[0]) if args else "values"
        return f"a list of {inner.removeprefix('a ').removeprefix('an ')}s"
    if origin is dict:
        return "a mapping"
    if tp is type(None):
        return "null"
    return WORDS.get(tp, getattr(tp, "__name__", str(tp)))


def type_name(tp: Any) -> str:
    """A type as `lmpress engines NAME` shows it: `float | None`, `bool | list[int]`."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(arg) for arg in args)
    if origin is Literal:
        return " | ".join(repr(a) for a in args)
    if origin is not None and args:
        return f"{origin.__name__}[{', '.join(type_name(a) for a in args)}]"
    if tp is type(None):
        return "None"
    return getattr(tp, "__name__", str(tp))
