"""The running steps, built from a checked pipeline (`build_steps`): one module per kind,
each turning a row into an `Outcome` (`steps/base.py`)."""

from __future__ import annotations

from typing import Any

from lmpress.pipeline.spec import (
    DedupeStep,
    FilterStep,
    GenerateStep,
    JudgeStep,
    MapStep,
    PipelineSpec,
)
from lmpress.pipeline.steps.base import Step


def build_steps(spec: PipelineSpec, models: Any) -> list[Step]:
    """Each step of `spec`, its model's engine made (once per model) where it needs one."""
    return [_build(spec, step, models) for step in spec.steps]


def _build(spec: PipelineSpec, step: Any, models: Any) -> Step:
    where = f"{spec.path}: step '{step.name}'"
    ref = spec.model_of(step)
    if hasattr(type(step), "own_step"):  # a Python-front step holds a callable (python.py)
        return step.own_step(ref, models, where)
    if isinstance(step, GenerateStep):
        return build_generate(step, ref, models, where)
    if isinstance(step, JudgeStep):
        from lmpress.pipeline.columns import build_step_judge
        from lmpress.pipeline.steps.generate import step_params
        from lmpress.pipeline.steps.judge import Judge

        judge = build_step_judge(step, where)
        # Guided to the reply's schema unless the step guides it otherwise: a small model
        # then answers a verdict the judge can parse, not prose around one.
        more: dict[str, Any] = {}
        schema = getattr(judge, "reply_schema", None)
        if schema is not None and "guided_decoding" not in step.generation and models.guides(ref):
            more["guided_decoding"] = {"json": schema}
        params = step_params(models.config(ref).generation, step.generation, where, **more)
        models.check(ref, params, where)
        concurrency = step.concurrency or models.concurrency(ref)
        return Judge(step.name, judge, lambda: models.answers(ref), params, concurrency)
    if isinstance(step, FilterStep):
        from lmpress.pipeline.steps.functions import Filter

        if step.expr is not None:
            from lmpress.pipeline.expressions import Expression

            return Filter(step.name, Expression(step.expr, f"{where}: expr"), f"`{step.expr}`")
        return Filter(step.name, _function(step.function, where), step.function)
    if isinstance(step, MapStep):
        from lmpress.pipeline.steps.functions import Map

        return Map(step.name, _function(step.function, where), step.function, step.explode)
    if isinstance(step, DedupeStep):
        return _dedupe(step, ref, models, where)
    raise AssertionError(step)


def build_generate(step: GenerateStep, ref: Any, models: Any, where: str, make: Any = None
                   ) -> Step:  # fmt: skip
    """A generate step; `make`: its class where not `Generate` (the Python front's)."""
    from lmpress.pipeline.columns import reply_schema
    from lmpress.pipeline.steps.generate import Generate, step_params

    schema = reply_schema(step, where)
    more: dict[str, Any] = {"n": step.n}
    if schema is not None and "guided_decoding" not in step.generation:
        more["guided_decoding"] = {"json": schema}
    params = step_params(models.config(ref).generation, step.generation, where, **more)
    models.check(ref, params, where)
    concurrency = step.concurrency or models.concurrency(ref)
    make = make or Generate
    return make(step, lambda: models.answers(ref), params, schema, concurrency)


def _dedupe(step: DedupeStep, ref: Any, models: Any, where: str) -> Step:
    from lmpress.pipeline.dedupe import build_deduplicator
    from lmpress.pipeline.steps.dedupe import Dedupe, embedder
    from lmpress.vocabulary.errors import ConfigError

    settings = step.settings()
    embed = None
    if settings.get("method") == "embedding":
        if ref is None:
            raise ConfigError(f"{where}: method embedding needs a `model` that embeds")
        embed = embedder(lambda: models.answers(ref), step.name)
    try:
        return Dedupe(step.name, build_deduplicator(settings, embed))
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _function(target: str | None, where: str) -> Any:
    from lmpress.pipeline.expressions import import_function

    assert target is not None
    return import_function(target, f"{where}: function")
