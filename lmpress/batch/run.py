"""Run a batch job: live, or through the provider's batch API when the config asks for it."""

from __future__ import annotations

from lmpress.batch.events import BatchEvents, BatchSummary
from lmpress.batch.job import BatchJob, BatchOptions
from lmpress.batch.provider.job import ProviderBatchJob
from lmpress.configs.schema import RunConfig
from lmpress.engines.base import Engine


async def run_batch(
    config: RunConfig,
    options: BatchOptions,
    *,
    engine: Engine | None = None,
    events: BatchEvents | None = None,
) -> BatchSummary:
    """Run every picked row of the input not yet done through the config's engine.

    With `options.ray`, replicas on a Ray cluster generate the rows (`batch.cluster`).
    Without `engine`, the engine is created when the first row needs it (so a finished job
    re-run loads no model) and closed at the end.
    """
    job_class: type[BatchJob] = BatchJob
    if config.remote_params.batch_completion_window:
        job_class = ProviderBatchJob
    elif options.ray:
        from lmpress.batch.cluster.job import RayBatchJob  # imports Ray: only when asked for

        job_class = RayBatchJob
    job = job_class(config, options, engine, events)
    try:
        return await job.run()
    finally:
        if engine is None and job.engine is not None:
            await job.engine.aclose()
