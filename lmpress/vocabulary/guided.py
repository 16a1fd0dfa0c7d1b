"""Guided decoding (structured output): one typed value, parsed here once, that every engine
only translates.

`GenerationParams.guided_decoding` holds a `GuidedDecoding`, whether it came from a recipe, a
flag, a row's `generation`, an OpenAI `response_format` (serve, OpenAI Batch lines) or Python.
The forms and options are vLLM's structured outputs, the richest vocabulary of the backends
(Oumi's `json`, `regex` and `choice` among them), so that a recipe valid on VLLM means the same
on REMOTE_VLLM; an engine that lacks a form refuses it with one line (`refuse_unless`).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

from lmpress.vocabulary.errors import ConfigError, ErrorKind, RequestError

# The constraints, exactly one of which a GuidedDecoding holds.
GuidedForm = Literal["json", "json_object", "regex", "choice", "grammar", "structural_tag"]
FORMS: tuple[GuidedForm, ...] = get_args(GuidedForm)
# vLLM's options for how JSON is written; they go with json and json_object.
OPTIONS = ("disable_any_whitespace", "disable_additional_properties", "whitespace_pattern")


@dataclass(repr=False)
class GuidedDecoding:
    """One constraint on what is generated, and vLLM's whitespace options.

    Fields default to "not given" so that OmegaConf can load the section from a recipe, where
    Oumi writes every field (the unused ones null, `strict` false).
    """

    json: Any = None  # a JSON schema: an object, or its JSON text
    json_object: bool | None = None  # any JSON object
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None  # an EBNF grammar (vLLM's and llama.cpp's GBNF dialects)
    structural_tag: Any = None  # vLLM's structural tag: an object, or its JSON text
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None
    # OpenAI's json_schema.strict; vLLM always follows a schema exactly, so it changes nothing
    # there. Accepted so Oumi configs, which write `strict: false`, load.
    strict: bool = False

    def __post_init__(self) -> None:
        given = self.forms()
        if len(given) > 1:
            raise ConfigError(
                f"generation.guided_decoding: give exactly one of {', '.join(FORMS)} "
                f"(got {', '.join(given)})"
            )
        for name in ("json", "structural_tag"):
            value = getattr(self, name)
            if isinstance(value, str):
                try:
                    setattr(self, name, json.loads(value))
                except ValueError as exc:
                    raise ConfigError(
                        f"generation.guided_decoding.{name}: not valid JSON ({exc})"
                    ) from exc
        if self.json is not None and not isinstance(self.json, Mapping):
            raise ConfigError(
                "generation.guided_decoding.json must be a JSON schema (an object), "
                f"got {type(self.json).__name__}"
            )
        if self.json_object is False:
            self.json_object = None
        if self.choice is not None and (
            not self.choice or not all(isinstance(c, str) for c in self.choice)
        ):
            raise ConfigError("generation.guided_decoding.choice must be a list of strings")

    def __repr__(self) -> str:
        """Only what is set: what `/set` and error messages show."""
        fields = dataclasses.fields(self)
        shown = [f"{f.name}={getattr(self, f.name)!r}" for f in fields
                 if getattr(self, f.name) != f.default]  # fmt: skip
        return f"GuidedDecoding({', '.join(shown)})"

    @classmethod
    def parse(cls, value: Any) -> GuidedDecoding | None:
        """A GuidedDecoding from a mapping (a recipe's section, a row's override, Python), or
        None when it sets no constraint. Unknown keys are refused with the closest name."""
        if value is None or isinstance(value, GuidedDecoding):
            return value if value is None or value.form else None
        if not isinstance(value, Mapping):
            raise ConfigError(
                f"generation.guided_decoding must be a mapping such as {{json: SCHEMA}}, "
                f"got {type(value).__name__}"
            )
        names = [f.name for f in dataclasses.fields(cls)]
        for key in value:
            if key not in names:
                close = difflib.get_close_matches(str(key), names, 1)
                hint = f" (did you mean '{close[0]}'?)" if close else ""
                raise ConfigError(
                    f"generation.guided_decoding.{key}: unknown key{hint}; the forms are "
                    f"{', '.join(FORMS)}"
                )
        guided = cls(**{k: v for k, v in value.items() if v is not None})
        return guided if guided.form else None

    def forms(self) -> list[GuidedForm]:
        return [name for name in FORMS if getattr(self, name) is not None]

    @property
    def form(self) -> GuidedForm | None:
        """The constraint given: one of FORMS, or None for none."""
        given = self.forms()
        return given[0] if given else None

    @property
    def value(self) -> Any:
        """The constraint's value: the schema, the regex, the choices..."""
        return getattr(self, self.form) if self.form else None

    def options(self) -> dict[str, Any]:
        """The whitespace options set away from their defaults."""
        return {
            name: getattr(self, name)
            for name in OPTIONS
            if getattr(self, name) not in (False, None)
        }

    def is_any_json_object(self) -> bool:
        """json_object, or a schema that allows any object: the same request to OpenAI."""
        return self.form == "json_object" or (
            self.form == "json" and dict(self.json) in ({}, {"type": "object"})
        )

    def refuse_unless(
        self, engine: str, forms: frozenset[GuidedForm], options: bool = False
    ) -> None:
        """Raise, in one line naming the engine, unless the engine takes this form (and the
        options, when any is set)."""
        form = self.form
        if form is not None and form not in forms:
            allowed = ", ".join(f for f in FORMS if f in forms)
            raise RequestError(
                f"engine {engine} takes generation.guided_decoding {allowed} only, not {form}",
                ErrorKind.UNSUPPORTED_PARAM,
            )
        if not options and self.options():
            raise RequestError(
                f"engine {engine} does not take generation.guided_decoding."
                f"{next(iter(self.options()))} (vLLM's whitespace options)",
                ErrorKind.UNSUPPORTED_PARAM,
            )

    def vllm_fields(self) -> dict[str, Any]:
        """vLLM's StructuredOutputsParams keyword arguments (the offline engine) and its server's
        `structured_outputs` body field (REMOTE_VLLM): the same names and values."""
        value = self.value
        if self.form == "structural_tag" and not isinstance(value, str):
            value = json.dumps(value)  # vLLM takes the tag as JSON text
        return {self.form: value, **self.options()}
