"""The pipeline file (YAML): named models and a list of named steps, read into strict pydantic
models so that a typo'd key, an unknown kind or a model no one defined is refused before any
work, in one line naming the file, the step and the key.

    models:
      writer: {recipe: smollm2}
      judge: {engine: OPENAI, model: gpt-4o-mini, api_url: http://...}
    steps:
      - {name: questions, kind: generate, model: writer, prompt: "About {topic}", n: 3}
      - {name: good, kind: filter, expr: "score >= 7"}

The judge and dedupe steps take settings their own modules define (`judges.build_judge`,
`dedupe.build_deduplicator`), so those two keep the keys they do not know and hand them on;
the builders refuse what they cannot use. The columns each step reads are checked against
what the earlier steps make in `pipeline/columns.py`.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from lmpress.vocabulary.errors import ConfigError

KINDS = ("generate", "judge", "filter", "map", "dedupe")
STEP_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)


class ModelRef(_Strict):
    """A model as a recipe (bundled name or file) with overrides, or an engine and a model."""

    recipe: str | None = None
    engine: str | None = None
    model: str | None = None  # model.model_name
    api_url: str | None = None  # remote_params.api_url
    overrides: dict[str, Any] = Field(default_factory=dict)  # dotted recipe keys -> values

    def identity(self) -> dict[str, Any]:
        return self.model_dump(exclude_defaults=True)


class Estimate(_Strict):
    """What `lmpress run --dry-run` assumes of a step (`pipeline/dryrun.py`): rows it makes of
    each row (a generate's n, an explode's items) and the share of them it keeps (a filter's,
    a dedupe's pass rate)."""

    fan_out: float = Field(default=1.0, gt=0)
    keep: float = Field(default=1.0, ge=0, le=1)


class _Step(_Strict):
    name: str
    # Settings that decide nothing a row gets (how many rows at once, the dry run's guesses)
    # stay out of the fingerprint, so changing them re-runs nothing.
    concurrency: int | None = Field(default=None, ge=1)
    estimate: Estimate | None = None

    def fingerprint(self, model: dict[str, Any] | None, previous: str, code: str | None = None
                    ) -> str:  # fmt: skip
        """What decides this step's rows: its settings, its model's identity, the source of
        the function it calls (`code`) and the previous step's fingerprint (so an edit
        upstream re-runs everything after it)."""
        settings = self.model_dump(exclude={"concurrency", "estimate"}, by_alias=True)
        text = json.dumps([settings, model, code, previous], sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


class GenerateStep(_Step):
    kind: Literal["generate"]
    model: str | ModelRef
    prompt: str  # a Python format string or a Jinja template over the row's columns
    system: str | None = None
    n: int = Field(default=1, ge=1)  # samples: more than one fans out, a row per sample
    generation: dict[str, Any] = Field(default_factory=dict)
    parse: dict[str, str] | None = None  # the reply as JSON with these fields -> columns
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")  # or a JSON schema
    explode: str | None = None  # a list column -> one row per item
    output: str | None = None  # the reply text's column when nothing parses it (default: name)

    @property
    def output_column(self) -> str:
        return self.output or self.name


class JudgeStep(_Step):
    """The judge's own settings (`judge`, `rubric`, `columns`...) go to `build_judge`."""

    model_config = ConfigDict(extra="allow", strict=True)
    kind: Literal["judge"]
    model: str | ModelRef
    generation: dict[str, Any] = Field(default_factory=dict)

    def settings(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class FilterStep(_Step):
    kind: Literal["filter"]
    expr: str | None = None  # a sandboxed Jinja expression over the columns
    function: str | None = None  # or module:function, returning truthy to keep


class MapStep(_Step):
    kind: Literal["map"]
    function: str  # module:function, returning the new row (None drops it)
    makes: list[str] | None = None  # the columns it adds; unset: later checks cannot know
    explode: str | None = None


class DedupeStep(_Step):
    """The deduplicator's own settings (`method`, `columns`, `threshold`...) go to
    `build_deduplicator`; `model` names the embedding model for `method: embedding`."""

    model_config = ConfigDict(extra="allow", strict=True)
    kind: Literal["dedupe"]
    model: str | ModelRef | None = None

    def settings(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


StepSpec = Annotated[
    GenerateStep | JudgeStep | FilterStep | MapStep | DedupeStep, Field(discriminator="kind")
]


class PipelineSpec(_Strict):
    models: dict[str, ModelRef] = Field(default_factory=dict)
    steps: list[StepSpec] = Field(min_length=1)
    source: str = Field(default="", exclude=True)  # the file's text, for the dataset card
    path: str = Field(default="", exclude=True)  # the file, for messages

    def step(self, name: str) -> StepSpec:
        for step in self.steps:
            if step.name == name:
                return step
        raise ConfigError(f"--from {name}: no such step (steps: {self.step_names()})")

    def step_names(self) -> str:
        return ", ".join(step.name for step in self.steps)

    def model_of(self, step: StepSpec) -> ModelRef | None:
        ref = getattr(step, "model", None)
        return self.models[ref] if isinstance(ref, str) else ref


def load_pipeline(path: str | Path, input_columns: set[str] | None = None) -> PipelineSpec:
    """Read and check a pipeline file; `input_columns`: the input's (None: unknown, and the
    columns the input must hold go unchecked). Every error is one ConfigError line."""

    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
        data = yaml.safe_load(text)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the pipeline ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" (line {where.line + 1})" if where else ""
        raise ConfigError(f"{path}: not valid YAML{line}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a pipeline is a mapping with `models` and `steps`")
    for key in ("source", "path"):  # filled in here, never read from the file
        if key in data:
            raise ConfigError(f"{path}: {key}: unknown key (a pipeline has models and steps)")
    _check_kinds(path, data)
    try:
        spec = PipelineSpec.model_validate({**data, "source": text, "path": str(path)})
    except ValidationError as exc:
        raise ConfigError(_one_line(path, data, exc)) from None
    check_spec(path, spec, input_columns)
    return spec


def check_spec(path: str | Path, spec: PipelineSpec, input_columns: set[str] | None) -> None:
    """The checks past pydantic's (names, models, the columns each step reads), shared by the
    file and the Python front (`pipeline/python.py`) so both refuse the same pipelines."""
    from lmpress.pipeline.columns import check_columns

    _check_names(Path(path), spec)
    check_columns(Path(path), spec, input_columns)


def _check_kinds(path: Path, data: dict[str, Any]) -> None:
    steps = data.get("steps")
    if not isinstance(steps, list):
        return  # pydantic says what `steps` should be
    for i, step in enumerate(steps):
        if not isinstance(step, dict):
            raise ConfigError(f"{path}: step {i + 1}: a step is a mapping (name, kind, ...)")
        kind = step.get("kind")
        if kind not in KINDS:
            raise ConfigError(
                f"{path}: step '{step.get('name', i + 1)}': unknown kind {kind!r} "
                f"(one of {', '.join(KINDS)})"
            )


def _one_line(path: Path, data: dict[str, Any], exc: ValidationError) -> str:
    """The first of pydantic's errors as `FILE: step 'NAME': KEY: what is wrong`."""
    error = exc.errors()[0]
    loc = list(error["loc"])
    where = ""
    if loc[:1] == ["steps"] and len(loc) > 1 and isinstance(loc[1], int):
        step = data["steps"][loc[1]]
        where = f"step '{step.get('name', loc[1] + 1)}': "
        loc = loc[3:]  # past the index and the kind pydantic's union adds
    elif loc[:1] == ["models"] and len(loc) > 1:
        where, loc = f"model '{loc[1]}': ", loc[2:]
    key = ".".join(str(part) for part in loc)
    message = error["msg"]
    if error["type"] == "extra_forbidden":
        message = "unknown key"
    return f"{path}: {where}{key + ': ' if key else ''}{message}"


def _check_names(path: Path, spec: PipelineSpec) -> None:
    seen: set[str] = set()
    for step in spec.steps:
        if not STEP_NAME.fullmatch(step.name) or step.name == "input":
            raise ConfigError(
                f"{path}: step '{step.name}': name a step with letters, digits, '_', '-' or '.' "
                f"(it names a file under OUT/steps/), and not 'input' (the rejects' name for "
                f"input lines that cannot be read)"
            )
        if step.name in seen:
            raise ConfigError(f"{path}: step '{step.name}': a second step of that name")
        seen.add(step.name)
        ref = getattr(step, "model", None)
        if isinstance(ref, str) and ref not in spec.models:
            defined = ", ".join(spec.models) or "none"
            raise ConfigError(
                f"{path}: step '{step.name}': model '{ref}' is not defined under `models` "
                f"(defined: {defined})"
            )
        if isinstance(step, FilterStep) and (step.expr is None) == (step.function is None):
            raise ConfigError(f"{path}: step '{step.name}': give `expr` or `function`, one")
        if isinstance(step, GenerateStep) and step.parse and step.schema_:
            raise ConfigError(f"{path}: step '{step.name}': give `parse` or `schema`, not both")
    for name, ref in spec.models.items():
        if ref.recipe is None and ref.engine is None:
            raise ConfigError(f"{path}: model '{name}': give a `recipe` or an `engine`")
