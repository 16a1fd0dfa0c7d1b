"""The part of a batch job that is the task's: an embed, score or rerank run's rows go to the
engine's `embed` or `score` rather than `complete`, a loglikelihood or perplexity run's to its
scoring of text (`engines/scoring.py`), and no reply is checked against a schema.
Everything else (resume, failures, budgets, outputs) is the job's, whatever the task.

Which ways of running take which task is decided here, before any work: every task runs live
and on Ray replicas; a provider batch takes the tasks both the provider and its batch API answer
(`BatchApi.tasks`: OpenAI's Batch API takes /v1/embeddings lines, so embed runs; no batch API
scores)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lmpress.batch.guided_check import check_structure
from lmpress.batch.options import BatchMode
from lmpress.configs.schema import RunConfig
from lmpress.engines.base import Engine, check_task
from lmpress.engines.scoring import score_choices, score_text
from lmpress.vocabulary.embeddings import EmbedRequest, EmbedResult, ScoreRequest, ScoreResult
from lmpress.vocabulary.errors import ConfigError
from lmpress.vocabulary.likelihood import (
    ChoicesRequest,
    LoglikelihoodResult,
    PerplexityRequest,
    PerplexityResult,
)
from lmpress.vocabulary.types import Request, Result

if TYPE_CHECKING:
    from lmpress.cache.responses import ResponseCache

AnyRequest = Request | EmbedRequest | ScoreRequest | ChoicesRequest | PerplexityRequest
AnyResult = Result | EmbedResult | ScoreResult | LoglikelihoodResult | PerplexityResult

_LIVE = "remote_params.batch_completion_window where the recipe sets it"


async def run_request(
    engine: Engine,
    request: AnyRequest,
    cache: ResponseCache | None = None,
    key: bytes | None = None,
) -> AnyResult:
    """What the engine answers a row's request, by the run's task; kept in `cache` under
    `key` where one is given (a miss)."""
    if isinstance(request, EmbedRequest):
        result: AnyResult = await engine.embed(request)
    elif isinstance(request, ScoreRequest):
        result = await engine.score(request)
    elif isinstance(request, ChoicesRequest):
        result = await score_choices(engine, request)
    elif isinstance(request, PerplexityRequest):
        result = await score_text(engine, request)
    else:
        result = await engine.complete(request)
    if cache is not None and key is not None:
        cache.keep(key, result)
    return finished(request, result)


def finished(request: AnyRequest, result: AnyResult) -> AnyResult:
    """A reply as a row gets it, generated or from the cache: text checked against the
    structure the request asked for, and named for the adapter that answered where one did
    (vLLM answers a LoRA's request with the adapter's name as its model)."""
    if isinstance(request, Request):
        assert isinstance(result, Result)
        if request.adapter is not None:
            result.model = request.adapter
        return check_structure(request, result)
    return result


def check_mode(
    config: RunConfig, mode: BatchMode, engine_class: type[Engine] | None = None
) -> None:
    """Refuse, before any work, a way of running that has no path for the run's task."""
    if mode is not BatchMode.PROVIDER:  # live runs and Ray replicas run any task
        return
    from lmpress.batch.provider.apis import batch_api_of
    from lmpress.engines.registry import load_engine_class

    engine_class = engine_class or load_engine_class(config.engine)
    check_task(engine_class, config.task)  # a task the engine has at all comes first
    api = batch_api_of(engine_class)
    if config.task not in api.tasks:
        takes = " and ".join(sorted(api.tasks))
        raise ConfigError(
            f"--provider-batch: {api.title} takes no {config.task} run (only {takes}); drop "
            f"--provider-batch, and {_LIVE}, to run it live"
        )
