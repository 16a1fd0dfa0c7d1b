"""The part of a batch job that is the task's: an embed, score or rerank run's rows go to the
engine's `embed` or `score` rather than `complete`, and no reply is checked against a schema.
Everything else (resume, failures, budgets, outputs) is the job's, whatever the task."""

from __future__ import annotations

from lmpress.batch.guided_check import check_structure
from lmpress.batch.options import BatchMode
from lmpress.configs.schema import RunConfig
from lmpress.data.pooling_rows import run_of
from lmpress.engines.base import Engine
from lmpress.vocabulary.embeddings import EmbedRequest, EmbedResult, ScoreRequest, ScoreResult
from lmpress.vocabulary.errors import ConfigError
from lmpress.vocabulary.types import Request, Result

AnyRequest = Request | EmbedRequest | ScoreRequest
AnyResult = Result | EmbedResult | ScoreResult


async def run_request(engine: Engine, request: AnyRequest) -> AnyResult:
    """What the engine answers a row's request, by the run's task."""
    if isinstance(request, EmbedRequest):
        return await engine.embed(request)
    if isinstance(request, ScoreRequest):
        return await engine.score(request)
    return check_structure(request, await engine.complete(request))


def check_mode(config: RunConfig, mode: BatchMode) -> None:
    """Refuse, before any work, a way of running that has no path for the run's task."""
    if config.task != "generate" and mode is BatchMode.PROVIDER:  # Ray replicas run any task
        flag = "--provider-batch"
        raise ConfigError(
            f"{flag}: {run_of(config.task)} goes live only (drop {flag}, and "
            f"remote_params.batch_completion_window where the recipe sets it)"
        )
