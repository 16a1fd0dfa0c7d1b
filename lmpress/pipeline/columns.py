"""What each step reads and makes, walked from the input's columns before any work: a column a
template, an expression, `explode` or a dedupe names that no earlier step makes is refused in
one line naming the step and the column, rather than failing every row an hour in.

The input's columns come from its first row; where that cannot be read (a stream), the check
of columns the input must hold is skipped, and only what steps make is known. A map function
can make anything, so after a map without `makes:` the later steps go unchecked.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lmpress.pipeline.expressions import import_function
from lmpress.vocabulary.errors import ConfigError
from lmpress.vocabulary.types import GENERATION_FIELDS


def check_columns(path: Path, spec: Any, input_columns: set[str] | None) -> None:
    known = set(input_columns) if input_columns is not None else None
    for step in spec.steps:
        where = f"{path}: step '{step.name}'"
        reads, makes = step_columns(step, where)
        if known is not None:
            for column in sorted(reads):
                if column not in known:
                    raise ConfigError(
                        f"{where}: column '{column}' is made by no earlier step "
                        f"(columns here: {', '.join(sorted(known)) or 'none'})"
                    )
        if makes is None:
            known = None
        elif known is not None:
            known |= makes


def step_columns(step: Any, where: str) -> tuple[set[str], set[str] | None]:
    """(the columns a step reads, those it makes; None: it can make anything)."""
    if hasattr(type(step), "own_columns"):  # a Python-front step says its own (python.py)
        return step.own_columns(where)
    if step.kind == "generate":
        return _generate_columns(step, where)
    if step.kind == "judge":
        judge = build_step_judge(step, where)
        return set(judge.needs()), set(judge.makes)
    if step.kind == "filter":
        if step.expr is not None:
            from lmpress.pipeline.expressions import Expression

            return Expression(step.expr, f"{where}: expr").names, set()
        import_function(step.function or "", f"{where}: function")
        return set(), set()
    if step.kind == "map":
        import_function(step.function, f"{where}: function")
        makes = set(step.makes) if step.makes is not None else None
        return ({step.explode} if step.explode and makes is None else set()), makes
    if step.kind == "dedupe":
        columns = step.settings().get("columns") or []
        return set(columns if isinstance(columns, list) else [columns]), set()
    raise AssertionError(step)


def _generate_columns(step: Any, where: str) -> tuple[set[str], set[str]]:
    from lmpress.data.columns import template_columns

    reads: set[str] = set()
    for key, text in (("prompt", step.prompt), ("system", step.system)):
        if text is None:
            continue
        try:
            reads |= template_columns(text)
        except ConfigError as exc:
            why = str(exc).removeprefix("--prompt-template: ")
            raise ConfigError(f"{where}: {key}: {why}") from None
    _check_generation(step.generation, where)
    schema = reply_schema(step, where)
    if schema is not None:
        from lmpress.pipeline.reply_columns import schema_columns

        makes = set(schema_columns(schema))
    else:
        makes = {step.output_column}
    if step.explode and step.explode not in makes:
        raise ConfigError(
            f"{where}: explode: column '{step.explode}' is not one this step makes "
            f"({', '.join(sorted(makes))})"
        )
    return reads, makes


def reply_schema(step: Any, where: str) -> dict[str, Any] | None:
    """The JSON schema a generate step's reply is parsed by, or None (kept as text)."""
    if step.schema_ is not None:
        if not isinstance(step.schema_.get("properties"), dict):
            raise ConfigError(f"{where}: schema: give an object schema with `properties`")
        return step.schema_
    if step.parse is not None:
        from lmpress.pipeline.reply_columns import fields_schema

        return fields_schema(step.parse, where)
    return None


def _check_generation(generation: dict[str, Any], where: str) -> None:
    for key in generation:
        if key not in GENERATION_FIELDS:
            raise ConfigError(f"{where}: generation.{key}: unknown key")


def build_step_judge(step: Any, where: str) -> Any:
    """The judge step's Judge (`judges.build_judge`), its errors said with the step's place."""
    from lmpress.pipeline.judges import build_judge

    try:
        return build_judge(step.settings())
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
