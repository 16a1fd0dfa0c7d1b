"""A generate step's reply turned into columns: a JSON object whose fields are named by the
step's `parse` (a field list, `{questions: list[str], n: int}`, as a Pydantic model spells its
annotations) or its `schema` (a JSON schema's top-level properties).

Either becomes a JSON schema, which the step also asks the engine to follow (guided decoding)
unless its `generation` sets a constraint of its own: a reply that still does not parse is
that row's failure, never the job's.
"""

from __future__ import annotations

from typing import Any

from lmpress.pipeline.replies import json_object

JSON_TYPES: dict[str, dict[str, Any]] = {
    "str": {"type": "string"},
    "int": {"type": "integer"},
    "float": {"type": "number"},
    "bool": {"type": "boolean"},
    "dict": {"type": "object"},
    "list": {"type": "array"},
    "list[str]": {"type": "array", "items": {"type": "string"}},
    "list[int]": {"type": "array", "items": {"type": "integer"}},
    "list[float]": {"type": "array", "items": {"type": "number"}},
    "list[dict]": {"type": "array", "items": {"type": "object"}},
}
_PY_TYPES = {"string": str, "integer": int, "number": (int, float), "boolean": bool,
             "object": dict, "array": list}  # fmt: skip


def fields_schema(fields: dict[str, str], where: str) -> dict[str, Any]:
    """A field list as a JSON schema; an unknown type is a ConfigError naming the field."""
    from lmpress.vocabulary.errors import ConfigError

    properties = {}
    for name, kind in fields.items():
        spelled = kind.replace(" ", "")
        if spelled not in JSON_TYPES:
            raise ConfigError(
                f"{where}: parse.{name}: unknown type '{kind}' (one of {', '.join(JSON_TYPES)})"
            )
        properties[name] = JSON_TYPES[spelled]
    return {"type": "object", "properties": properties, "required": list(fields),
            "additionalProperties": False}  # fmt: skip


def schema_columns(schema: dict[str, Any]) -> list[str]:
    return list((schema.get("properties") or {}).keys())


def parse_reply(text: str, schema: dict[str, Any]) -> dict[str, Any]:
    """The reply's JSON object, its schema's properties as columns; ValueError (one line) when
    it is not one or lacks a required field or holds one of the wrong type."""
    value = _first_object(text)
    properties = schema.get("properties") or {}
    for name in schema.get("required", []):
        if name not in value:
            raise ValueError(f"the reply's JSON has no field '{name}'")
    columns = {}
    for name, rule in properties.items():
        if name not in value:
            continue
        expected = _PY_TYPES.get(rule.get("type", ""))
        item = value[name]
        if expected is not None and (not isinstance(item, expected) or _is_bool_as(item, rule)):
            raise ValueError(f"the reply's field '{name}' is not {rule['type']}")
        columns[name] = item
    return columns


def _is_bool_as(item: Any, rule: dict[str, Any]) -> bool:
    return isinstance(item, bool) and rule.get("type") in ("integer", "number")


def _first_object(text: str) -> dict[str, Any]:
    """The first JSON object in the text (models wrap theirs in prose or a code fence), found
    as the judges find theirs (`replies.json_object`)."""
    value = json_object(text)
    if value is None:
        shown = text.strip().replace("\n", " ")
        raise ValueError(f"the reply holds no JSON object: {shown[:80]!r}")
    return value
