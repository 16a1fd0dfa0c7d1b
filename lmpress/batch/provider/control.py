"""`lmpress batch --status OUT` and `--cancel OUT`: the provider batches of a job, shown or
cancelled from their state beside OUT, without running the job."""

from __future__ import annotations

import asyncio
import sys

from lmpress.batch.provider.apis import WINDOW, batch_api
from lmpress.batch.provider.state import BatchState
from lmpress.configs.schema import RunConfig
from lmpress.data.output_lock import OutputLock
from lmpress.data.resume import JobFiles
from lmpress.data.targets import output_file_format
from lmpress.engines.registry import create_engine
from lmpress.vocabulary.errors import InputError


def show_or_cancel(config: RunConfig, output: str, cancel: bool = False) -> int:
    """`--status` only reads, so it runs beside a live job. `--cancel` takes the output's lock
    as a job does: cancelled under a live job, the batches would only be resubmitted by it
    (`--on-expired`), so it is refused until that job ends."""
    files = JobFiles.found(output, output_file_format(output))
    state = BatchState(files.batches)
    if not state.log.exists():
        raise InputError(f"{output}: no provider batches were submitted for this output")
    if not cancel:
        return asyncio.run(_run(config, state.load(tidy=False), cancel))
    then = "stop it first, then --cancel: it would resubmit the rows of what is cancelled"
    with OutputLock.take(files.lock, output, then):
        return asyncio.run(_run(config, state.load(tidy=False), cancel))


async def _run(config: RunConfig, state: BatchState, cancel: bool) -> int:
    engine = create_engine(config)
    api = None
    try:
        api = batch_api(engine, config.remote_params.batch_completion_window or WINDOW)
        for chunk in state.chunks.values():
            if chunk.batch_id is None:
                print(f"{chunk.name}: {chunk.count} rows, not submitted yet", file=sys.stderr)
                continue
            if chunk.collected:
                print(f"{chunk.name}: batch {chunk.batch_id}, {chunk.count} rows, written",
                      file=sys.stderr)  # fmt: skip
                continue
            if cancel:
                await api.cancel(chunk.batch_id)
            p = await api.progress(chunk.batch_id)
            print(f"{chunk.name}: batch {chunk.batch_id}, {p.status}, {p.done} done, {p.failed} "
                  f"failed of {p.total or chunk.count}", file=sys.stderr)  # fmt: skip
        if cancel:
            print("cancelled; re-run the job to write what the batches finished, and to send "
                  "the rest as --on-expired says", file=sys.stderr)  # fmt: skip
    finally:
        if api is not None:
            await api.aclose()
        await engine.aclose()
    return 0
