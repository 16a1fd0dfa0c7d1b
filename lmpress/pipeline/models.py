"""The pipeline's models: each distinct model config loaded once and shared by every step that
names it (a writer and a judge on one local model hold one copy of its weights), each step's
own generation settings going in its requests' params. Answers go through the response cache,
so an unchanged request costs nothing on a rerun whose journal was cleared.

Configs are loaded and checked when the pipeline loads (a recipe that does not exist is refused
before any work); the engines are made when a step first needs one, and all closed at the end.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from lmpress.pipeline.spec import ModelRef, PipelineSpec
from lmpress.vocabulary.errors import ConfigError, LmpressError

LOCAL_IN_FLIGHT = 64


class Models:
    def __init__(self, spec: PipelineSpec, cache: str = "on", cache_dir: str | None = None):
        self._names: dict[str, str] = {}
        self._configs: dict[str, Any] = {}
        self._answers: dict[str, Any] = {}
        self._cache, self._cache_dir = cache, cache_dir
        for step in spec.steps:
            ref = spec.model_of(step)
            if ref is not None:
                where = f"{spec.path}: step '{step.name}'"
                self._configs.setdefault(_key(ref), _config(ref, where))
                named = step.model if isinstance(step.model, str) else step.name
                self._names.setdefault(_key(ref), named)
        self._size_workers(spec)

    def _size_workers(self, spec: PipelineSpec) -> None:
        """A remote model's engine is shared by the steps on it, and its pacer lets
        `remote_params.num_workers` requests out in all: left at its default, it is raised to
        the sum of the `concurrency` those steps set, so each step gets the requests in flight
        it asked for (and the choice is said)."""
        import dataclasses

        from lmpress.configs.schema import RemoteParams
        from lmpress.engines.registry import get_spec

        asked: dict[str, int] = {}
        for step in spec.steps:
            ref = spec.model_of(step)
            if ref is not None and getattr(step, "concurrency", None):
                asked[_key(ref)] = asked.get(_key(ref), 0) + step.concurrency
        default = RemoteParams().num_workers
        for key, total in asked.items():
            config = self._configs[key]
            workers = config.remote_params.num_workers
            if get_spec(config.engine).preset and workers == default and total > workers:
                config.remote_params = dataclasses.replace(config.remote_params, num_workers=total)
                print(f"lmpress: model {self._names[key]}: remote_params.num_workers {total}, "
                      "the sum of its steps' concurrency", file=sys.stderr)  # fmt: skip

    def config(self, ref: ModelRef) -> Any:
        return self._configs[_key(ref)]

    def identity(self, ref: ModelRef) -> dict[str, Any]:
        """What names the model in a step's fingerprint: the reference as written, and the
        engine, model name and generation settings it loaded as (a recipe file edited since
        changes what the step's rows would be)."""
        config = self.config(ref)
        return {**ref.identity(), "_engine": config.engine, "_name": config.model.model_name,
                "_generation": config.generation.changed_fields()}  # fmt: skip

    def concurrency(self, ref: ModelRef) -> int:
        """Rows a step on this model keeps in flight unless it says: what a remote engine keeps
        in flight (4 per worker), or enough to keep a local engine's batch full."""
        from lmpress.engines.registry import get_spec

        config = self.config(ref)
        if get_spec(config.engine).preset:
            return 4 * config.remote_params.num_workers
        return max(LOCAL_IN_FLIGHT, config.generation.batch_size)

    def check(self, ref: ModelRef, params: Any, where: str) -> None:
        """Refuse, before any work, a step's generation setting its engine does not honour
        (the engine's class says; no model is loaded for it)."""
        from lmpress.engines.base import check_params
        from lmpress.engines.registry import load_engine_class

        try:
            check_params(load_engine_class(self.config(ref).engine), params)
        except LmpressError as exc:
            raise ConfigError(f"{where}: {exc}") from None

    def guides(self, ref: ModelRef) -> bool:
        """Whether the model's engine takes guided decoding (its class says; none is made)."""
        from lmpress.engines.registry import load_engine_class

        return "guided_decoding" in load_engine_class(self.config(ref).engine).supported_params

    def answers(self, ref: ModelRef) -> Any:
        """The model's engine behind the response cache (`cache.answers.CachedAnswers`),
        made the first time a step needs it: a rerun the journal answers loads no model."""
        key = _key(ref)
        if key not in self._answers:
            from lmpress.cache.answers import CachedAnswers
            from lmpress.cache.responses import ResponseCache
            from lmpress.engines.registry import create_engine

            config = self._configs[key]
            engine = create_engine(config)

            def say(message: str) -> None:
                print(f"lmpress: {message}", file=sys.stderr)

            cache = ResponseCache.open(config, self._cache, self._cache_dir, say)
            self._answers[key] = CachedAnswers(engine, cache)
        return self._answers[key]

    def name(self, ref: ModelRef) -> str:
        """The model's name under `models:`, or for one a step sets inline, that step's."""
        return self._names[_key(ref)]

    def facts(self) -> list[Any]:
        """Each model as the dataset card names it (`card.model_facts`)."""
        from lmpress.pipeline.card import model_facts

        return [model_facts(self._names[key], self._configs[key]) for key in self._configs]

    async def aclose(self) -> None:
        for answers in self._answers.values():
            try:
                await answers.engine.aclose()
            finally:
                answers.close()
        self._answers.clear()


def _key(ref: ModelRef) -> str:
    return json.dumps(ref.identity(), sort_keys=True, default=str)


def _config(ref: ModelRef, where: str) -> Any:
    from lmpress.configs.loading import load_config
    from lmpress.engines.registry import check_engine

    overrides: list[tuple[str, Any]] = list(ref.overrides.items())
    if ref.model is not None:
        overrides.append(("model.model_name", ref.model))
    if ref.api_url is not None:
        overrides.append(("remote_params.api_url", ref.api_url))
    try:
        config = load_config(ref.recipe, overrides, ref.engine)
        check_engine(config)
    except LmpressError as exc:
        raise ConfigError(f"{where}: model: {exc}") from None
    return config
