"""The Python front for pipelines: the steps of a pipeline file built in Python, with plain
functions where the file names `module:function` or an expression, and run by the same code
as `lmpress run` (`job.run_spec`), so the same checks, journal, outputs and card hold.

    from lmpress import Pipeline, generate, filter

    pipeline = Pipeline(
        models={"writer": {"recipe": "smollm2"}},
        steps=[
            generate("questions", model="writer", prompt=lambda row: f"Ask about {row['topic']}",
                     parse=lambda reply, row: [{"question": q} for q in reply.splitlines()]),
            filter("short", lambda row: len(row["question"]) < 200),
        ],
    )
    pipeline.run(input=[{"topic": "tides"}], output="out")

The builders make the spec's own step objects (`spec.py`); a step given a callable is a
subclass holding it, which tells the shared code its columns (`own_columns`), its run-time
step (`own_step`) and its code's digest for the fingerprint (`own_code`). That digest is each
callable's qualified name and source, so editing a function re-runs its step and the ones
after it, as editing a step in the file does.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from pydantic import PrivateAttr, ValidationError

from lmpress.pipeline.spec import (
    DedupeStep,
    FilterStep,
    GenerateStep,
    JudgeStep,
    MapStep,
    ModelRef,
    PipelineSpec,
)
from lmpress.vocabulary.errors import ConfigError

WHERE = "pipeline (Python)"  # where a message says the pipeline is


class Pipeline:
    """Named models and steps, checked as a pipeline file is when it runs.

    Args:
        models: name -> a recipe name, a dict of `ModelRef` keys (`recipe`, `engine`,
            `model`, `api_url`, `overrides`) or a `ModelRef`.
        steps: the steps, made by `generate`, `judge`, `filter`, `map` and `dedupe`.
    """

    def __init__(self, models: dict[str, Any] | None = None, steps: list[Any] = ()):
        self.spec = _spec(models or {}, list(steps))

    def run(self, input: str | Path | Iterable[dict[str, Any]], output: str | Path, *,
            format: str = "jsonl", rerun_from: str | None = None, limit: int | None = None,
            keep_steps: bool = False, cache: str = "on",
            max_cost: float | None = None) -> Any:  # fmt: skip
        """Run over `input` (a file or dataset as `lmpress run -i` takes, or rows) into the
        `output` directory; returns the run's facts (`card.CardFacts`: rows, steps...).
        A rerun into the same directory re-runs only steps whose settings or code changed;
        `max_cost` (USD) stops the run cleanly once its models' answers cost that much."""
        from lmpress.data.sources import open_source
        from lmpress.pipeline.export import dataset_format
        from lmpress.pipeline.job import RunOptions, first_columns, run_spec
        from lmpress.pipeline.spec import check_spec

        dataset_format(format)
        if not isinstance(input, (str, Path)):
            input = _write_rows(input, Path(output))
        source = open_source(str(input))
        check_spec(WHERE, self.spec, first_columns(source))
        options = RunOptions(
            WHERE, str(input), str(output), format=format, rerun_from=rerun_from, limit=limit,
            keep_steps=keep_steps, cache=cache, max_cost=max_cost,
            command=" ".join(["python", *sys.argv]),
        )  # fmt: skip
        return run_spec(self.spec, source, options)

    def rows(self, output: str | Path) -> Iterable[dict[str, Any]]:
        """The dataset a run wrote to `output` (JSONL), row by row in input order."""
        from lmpress.data.file_formats import FileFormat
        from lmpress.pipeline.export import DATASET_NAMES

        path = Path(output) / DATASET_NAMES[FileFormat.JSONL]
        with path.open(encoding="utf-8") as handle:
            for line in handle:
                yield json.loads(line)


def generate(name: str, model: str | dict[str, Any] | ModelRef, prompt: str | Callable, *,
             parse: dict[str, str] | Callable | None = None, makes: list[str] | None = None,
             **settings: Any) -> GenerateStep:  # fmt: skip
    """A generate step. `prompt`: a template over the row's columns, or a function
    row -> str. `parse`: fields -> types (the reply as JSON), or a function
    (reply text, row) -> a dict or a list of dicts, each a row of the row's columns and its
    own (`makes`: their names, so later steps' columns are checked). Other settings as in
    the file: `system`, `n`, `generation`, `schema`, `explode`, `output`, `concurrency`."""
    fields = {"name": name, "kind": "generate", "model": _model(model), **settings}
    if not callable(prompt) and not callable(parse):
        return _made(GenerateStep, fields | {"prompt": prompt, "parse": parse}, name)
    said = {"prompt": _said(prompt)}
    said["parse"] = None if callable(parse) else parse
    step = _made(PythonGenerate, fields | said, name)
    step._prompt = prompt if callable(prompt) else None
    step._parse = parse if callable(parse) else None
    step._makes = makes
    return step


def judge(name: str, model: str | dict[str, Any] | ModelRef, **settings: Any) -> JudgeStep:
    """A judge step; `settings` as the file's (`judge`, `rubric`, `columns`, `generation`)."""
    return _made(JudgeStep, {"name": name, "kind": "judge", "model": _model(model), **settings},
                 name)  # fmt: skip


def filter(name: str, keep: str | Callable[[dict[str, Any]], Any] | None = None,
           **settings: Any) -> FilterStep:  # fmt: skip
    """A filter step: `keep` an expression over the columns, or a function row -> truthy
    (or `function="module:function"`, as in the file)."""
    if not callable(keep):
        return _made(FilterStep, {"name": name, "kind": "filter", "expr": keep, **settings},
                     name)  # fmt: skip
    step = _made(PythonFilter, {"name": name, "kind": "filter", "function": _said(keep),
                                **settings}, name)  # fmt: skip
    step._function = keep
    return step


def map(name: str, function: str | Callable[[dict[str, Any]], Any], *,
        makes: list[str] | None = None, explode: str | None = None, **settings: Any
        ) -> MapStep:  # fmt: skip
    """A map step: `function` row -> the new row (None drops it), or `module:function`;
    `makes`: the columns it adds, so later steps' columns are checked."""
    fields = {"name": name, "kind": "map", "makes": makes, "explode": explode, **settings}
    if not callable(function):
        return _made(MapStep, fields | {"function": function}, name)
    step = _made(PythonMap, fields | {"function": _said(function)}, name)
    step._function = function
    return step


def dedupe(name: str, model: str | dict[str, Any] | ModelRef | None = None, **settings: Any
           ) -> DedupeStep:  # fmt: skip
    """A dedupe step; `settings` as the file's (`method`, `columns`, `threshold`...)."""
    fields = {"name": name, "kind": "dedupe", **settings}
    if model is not None:
        fields["model"] = _model(model)
    return _made(DedupeStep, fields, name)


class PythonGenerate(GenerateStep):
    _prompt: Callable | None = PrivateAttr(default=None)
    _parse: Callable | None = PrivateAttr(default=None)
    _makes: list[str] | None = PrivateAttr(default=None)

    def own_columns(self, where: str) -> tuple[set[str], set[str] | None]:
        from lmpress.data.columns import template_columns

        reads = set()
        for text in (None if self._prompt else self.prompt, self.system):
            if text is not None:
                reads |= template_columns(text)
        if self._parse is None:
            from lmpress.pipeline.columns import reply_schema
            from lmpress.pipeline.reply_columns import schema_columns

            schema = reply_schema(self, where)
            return reads, set(schema_columns(schema)) if schema else {self.output_column}
        return reads, set(self._makes) if self._makes is not None else None

    def own_step(self, ref: Any, models: Any, where: str) -> Any:
        from lmpress.pipeline.steps import build_generate

        return build_generate(self, ref, models, where, _generate_class())

    def own_code(self) -> str:
        return digest(self._prompt, self._parse)


class PythonFilter(FilterStep):
    _function: Callable = PrivateAttr()

    def own_columns(self, where: str) -> tuple[set[str], set[str] | None]:
        return set(), set()

    def own_step(self, ref: Any, models: Any, where: str) -> Any:
        from lmpress.pipeline.steps.functions import Filter

        return Filter(self.name, self._function, str(self.function))

    def own_code(self) -> str:
        return digest(self._function)


class PythonMap(MapStep):
    _function: Callable = PrivateAttr()

    def own_columns(self, where: str) -> tuple[set[str], set[str] | None]:
        makes = set(self.makes) if self.makes is not None else None
        return ({self.explode} if self.explode and makes is None else set()), makes

    def own_step(self, ref: Any, models: Any, where: str) -> Any:
        from lmpress.pipeline.steps.functions import Map

        return Map(self.name, self._function, self.function, self.explode)

    def own_code(self) -> str:
        return digest(self._function)


def _generate_class() -> type:
    """The run-time generate step with the user's prompt and parse functions; defined on use,
    so that building a pipeline imports no step machinery."""
    from lmpress.pipeline.steps.generate import Generate

    class CalledGenerate(Generate):
        def __init__(self, spec: PythonGenerate, *args: Any):
            super().__init__(spec, *args)
            self._prompt_fn, self._parse_fn = spec._prompt, spec._parse
            if self._parse_fn is not None:
                self.fans_out = True  # it may return several rows, so every row is a child

        def messages(self, row: dict[str, Any]) -> list[Any]:
            from lmpress.vocabulary.types import Message

            if self._prompt_fn is None:
                return super().messages(row)
            text = _call(self._prompt_fn, "prompt", dict(row))
            if not isinstance(text, str):
                raise ValueError(f"prompt returned {type(text).__name__}, not str")
            messages = super().messages(row)[:-1] if self._system else []
            return [*messages, Message("user", text)]

        def reply_rows(self, text: str, row: dict[str, Any]) -> list[dict[str, Any]]:
            if self._parse_fn is None:
                return super().reply_rows(text, row)
            parsed = _call(self._parse_fn, "parse", text, dict(row))
            items = parsed if isinstance(parsed, list) else [parsed]
            for item in items:
                if not isinstance(item, dict):
                    raise ValueError(f"parse returned {type(item).__name__}, not a dict")
            return [{**row, **item} for item in items]

    return CalledGenerate


def _call(function: Callable, role: str, *args: Any) -> Any:
    """The user's function's value; what it raises said in one line (the row fails alone)."""
    from lmpress.vocabulary.errors import first_line

    try:
        return function(*args)
    except Exception as exc:
        raise ValueError(f"{role} raised {type(exc).__name__}: {first_line(exc)}") from None


def digest(*functions: Callable | None) -> str:
    """What a step's functions are, for its fingerprint: each one's qualified name, source
    and the plain values it closes over or defaults to (a threshold in a closure); code
    without readable source (a builtin) counts by its name alone."""
    parts = []
    for function in functions:
        if function is None:
            parts.append(None)
            continue
        try:
            source = inspect.getsource(function)
        except (OSError, TypeError):
            source = None
        cells = [cell.cell_contents for cell in getattr(function, "__closure__", None) or ()]
        values = [_plain(v) for v in [*cells, *(getattr(function, "__defaults__", None) or ())]]
        parts.append([_said(function), source, values])
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def _plain(value: Any) -> Any:
    """A value as JSON where it is plain data; else its type's name (a repr could hold an
    address that changes every run and would re-run the step every time)."""
    try:
        return json.loads(json.dumps(value, sort_keys=True))
    except (TypeError, ValueError):
        return type(value).__qualname__


def _said(function: Any) -> str:
    """A callable as `module:qualname` (what the card and the rejects' reasons name)."""
    if not callable(function):
        return function
    module = getattr(function, "__module__", None) or "?"
    return f"{module}:{getattr(function, '__qualname__', type(function).__qualname__)}"


def _model(model: Any) -> Any:
    return ModelRef(**model) if isinstance(model, dict) else model


def _made(kind: type, fields: dict[str, Any], name: str) -> Any:
    """The step, pydantic's first complaint said in one line naming it."""
    fields = {key: value for key, value in fields.items() if value is not None}
    try:
        return kind(**fields)
    except ValidationError as exc:
        error = exc.errors()[0]
        key = ".".join(str(part) for part in error["loc"])
        message = "unknown key" if error["type"] == "extra_forbidden" else error["msg"]
        raise ConfigError(f"{WHERE}: step '{name}': {key}: {message}") from None


def _spec(models: dict[str, Any], steps: list[Any]) -> PipelineSpec:
    refs = {}
    for name, model in models.items():
        if isinstance(model, str):
            model = {"recipe": model}
        try:
            refs[name] = model if isinstance(model, ModelRef) else ModelRef(**model)
        except (TypeError, ValidationError) as exc:
            raise ConfigError(f"{WHERE}: model '{name}': not a model ({_first(exc)})") from None
    for step in steps:
        if not isinstance(step, (GenerateStep, JudgeStep, FilterStep, MapStep, DedupeStep)):
            raise ConfigError(
                f"{WHERE}: {step!r} is not a step (make steps with lmpress.generate, judge, "
                f"filter, map or dedupe)"
            )
    try:
        spec = PipelineSpec(models=refs, steps=steps, path=WHERE)
    except ValidationError as exc:
        raise ConfigError(f"{WHERE}: {_first(exc)}") from None
    spec.source = _source(spec)
    return spec


def _first(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        error = exc.errors()[0]
        return f"{'.'.join(str(p) for p in error['loc'])}: {error['msg']}"
    return str(exc)


def _source(spec: PipelineSpec) -> str:
    """The pipeline as a file would say it, functions by name: the dataset card's record."""
    import yaml

    data = {
        "models": {name: ref.identity() for name, ref in spec.models.items()},
        "steps": [_step_source(step) for step in spec.steps],
    }
    return yaml.safe_dump(data, sort_keys=False)


def _step_source(step: Any) -> dict[str, Any]:
    data = {"name": step.name, "kind": step.kind}
    data |= step.model_dump(by_alias=True, exclude_defaults=True, exclude={"concurrency"})
    parse = getattr(step, "_parse", None)
    if parse is not None:  # a parse function lives outside the spec's fields
        data["parse"] = _said(parse)
        if step._makes is not None:
            data["makes"] = step._makes
    return data


def _write_rows(rows: Iterable[dict[str, Any]], output: Path) -> Path:
    """Rows given in Python, written as the run's input file in the output directory, so the
    run reads them as it reads any input (and its card names where they are)."""
    (output / ".lmpress").mkdir(parents=True, exist_ok=True)
    path = output / ".lmpress" / "input.jsonl"
    with path.open("w", encoding="utf-8") as handle:
        for i, row in enumerate(rows):
            if not isinstance(row, dict):
                raise ConfigError(f"{WHERE}: input row {i + 1}: a row is a dict of columns")
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path
