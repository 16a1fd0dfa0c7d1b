"""Checking a reply against the structure its row asked for, whatever engine wrote it.

A row that asked for JSON gets the parsed value and whether it follows the schema; a regex row,
whether the whole reply matches; a choice row, whether the reply is one of the choices. A reply
cut at `max_new_tokens` is invalid without being parsed: a prefix of JSON is never repaired
into something the model did not write. An invalid reply is a failed row (kind
`invalid_output`), so `--on-error` treats it as any failure and the next run retries it.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from lmpress.vocabulary.errors import ErrorKind
from lmpress.vocabulary.guided import GuidedForm
from lmpress.vocabulary.types import ErrorInfo, Request, Result


@dataclass(frozen=True)
class Checked:
    valid: bool
    parsed: Any = None  # the JSON value, for JSON rows that parse
    error: str | None = None  # why the reply is invalid, one line

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"valid": self.valid}
        if self.parsed is not None or self.valid:
            out["parsed"] = self.parsed
        if self.error:
            out["error"] = self.error
        return out


def check_reply(text: str, kind: str, value: Any, finish_reason: str | None) -> Checked:
    """Whether `text` is what a `kind` guided row with `value` asked for."""
    if finish_reason == "length":
        return Checked(False, error="the reply was cut at max_new_tokens before it was complete")
    if kind in ("json", "json_object"):
        try:
            parsed = json.loads(text)
        except json.JSONDecodeError as exc:
            return Checked(False, error=f"not JSON: {exc.msg} at character {exc.pos}")
        schema = value if kind == "json" else {"type": "object"}
        if isinstance(schema, str):
            schema = json.loads(schema)
        problem = schema_error(parsed, schema)
        return Checked(problem is None, parsed, problem)
    if kind == "regex":
        if _regex(value).fullmatch(text):
            return Checked(True)
        return Checked(False, error="the reply does not match the regex")
    if kind == "choice":
        if text in value:
            return Checked(True)
        return Checked(False, error="the reply is not one of the choices")
    return Checked(True)  # a grammar: the engine's matcher already held the reply to it


def schema_error(value: Any, schema: dict[str, Any]) -> str | None:
    """The first way `value` breaks `schema`, naming where, or None when it follows it."""
    import jsonschema

    validator_class = jsonschema.validators.validator_for(schema)
    error = jsonschema.exceptions.best_match(validator_class(schema).iter_errors(value))
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path)
    return f"{where or 'the value'}: {error.message}"


CHECKED_FORMS: tuple[GuidedForm, ...] = ("json", "json_object", "regex", "choice")


def check_structure(request: Request, result: Result) -> Result:
    """The result of a row that asked for a structure, with the check of each sample: every
    sample that follows it, the first one's parsed value in `result.structured`; a sample that
    does not, the row failed (`invalid_output`) with why, its text and usage kept."""
    guided = request.params.guided_decoding
    if not result.ok or guided is None or guided.form not in CHECKED_FORMS:
        return result
    checks = [
        check_reply(sample.text, guided.form, guided.value, sample.finish_reason)
        for sample in result.samples
    ]
    bad = next(((i, c) for i, c in enumerate(checks) if not c.valid), None)
    if bad is None:
        return dataclasses.replace(result, structured=checks[0].to_dict() if checks else None)
    index, check = bad
    which = f"sample {index} of the reply" if len(checks) > 1 else "the reply"
    error = ErrorInfo(
        ErrorKind.INVALID_OUTPUT,
        f"{which} does not follow generation.guided_decoding.{guided.form}: {check.error}",
    )
    return dataclasses.replace(result, error=error)


@lru_cache(maxsize=256)
def _regex(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern, re.DOTALL)
