"""Run a batch job: the one place that chooses how its rows are generated (`BatchMode`): live,
on Ray replicas, or through the provider's batch API. Every runner is a `BatchJob` built from
the same options, so all of them honour the same flags."""

from __future__ import annotations

import dataclasses

from lmpress.batch.events import BatchEvents, BatchSummary
from lmpress.batch.job import BatchJob
from lmpress.batch.options import BatchMode, BatchOptions
from lmpress.batch.pooling import check_mode
from lmpress.batch.provider.job import ProviderBatchJob
from lmpress.configs.schema import RunConfig
from lmpress.engines.base import Engine
from lmpress.vocabulary.errors import ConfigError


def _ray_job() -> type[BatchJob]:
    from lmpress.batch.cluster.job import RayBatchJob  # Ray's own modules: only when asked for

    return RayBatchJob


RAY_WITH_PROVIDER = (
    "--ray: a provider batch runs at the provider, not on Ray; drop --ray or "
    "--provider-batch (remote_params.batch_completion_window)"
)
RUNNERS = {
    BatchMode.LIVE: lambda: BatchJob,
    BatchMode.RAY: _ray_job,
    BatchMode.PROVIDER: lambda: ProviderBatchJob,
}


def batch_mode(config: RunConfig, options: BatchOptions) -> BatchMode:
    """How the job runs: as its options say, or through the provider's batch API when the
    recipe sets `remote_params.batch_completion_window` (as `--provider-batch` does)."""
    mode = BatchMode(options.mode)
    if not config.remote_params.batch_completion_window or mode is BatchMode.PROVIDER:
        return mode
    if mode is BatchMode.RAY:
        raise ConfigError(RAY_WITH_PROVIDER)
    return BatchMode.PROVIDER


async def run_batch(
    config: RunConfig,
    options: BatchOptions,
    *,
    engine: Engine | None = None,
    events: BatchEvents | None = None,
) -> BatchSummary:
    """Run every picked row of the input not yet done through the config's engine.

    Without `engine`, the engine is created when the first row needs it (so a finished job
    re-run loads no model) and closed at the end.
    """
    options = dataclasses.replace(options, mode=batch_mode(config, options))
    check_mode(config, options.mode, type(engine) if engine is not None else None)
    job = RUNNERS[options.mode]()(config, options, engine, events)
    try:
        return await job.run()
    finally:
        if engine is None and job.engine is not None:
            await job.engine.aclose()
