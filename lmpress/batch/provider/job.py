"""A batch job run through the provider's batch API: the same rows, output, errors file and
summary as a live run, at the batch price.

The rows are read as a live run reads them (an embed run's become /v1/embeddings lines, which
OpenAI's Batch API takes; `batch.pooling.check_mode` refuses a task a batch API does not take)
and written into chunks no larger than the provider's limits (`batch_max_requests`,
`batch_max_bytes`); each chunk is sealed, then submitted, its batch id logged the moment the
provider gives it (`state`). Then the job polls
every batch it has waiting, backing off politely, and writes each batch's rows as it ends,
matched by custom_id, through the same path a live result takes. Rows a batch did not run
(expired, cancelled, or missing from its results) are resubmitted in a new batch, run live, or
failed (`--on-expired`); a row is resubmitted at most twice.

Killed at any moment, the same command resumes: the rows of every chunk not yet collected are
neither read again nor submitted again; a chunk sealed but not submitted is submitted; batches
submitted are polled.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from lmpress.batch.events import RowFailure
from lmpress.batch.guided_check import check_structure
from lmpress.batch.job import BatchJob
from lmpress.batch.pooling import finished, run_request
from lmpress.batch.provider.apis import WINDOW, Outcome, Progress, batch_api, custom_id
from lmpress.batch.provider.state import BatchState, Chunk, ChunkWriter
from lmpress.batch.rows import RowReader
from lmpress.data.idkeys import IdKeys
from lmpress.data.jsonl import Line
from lmpress.data.resume import id_key
from lmpress.engines.base import error_result
from lmpress.vocabulary.embeddings import EmbedRequest
from lmpress.vocabulary.errors import ErrorKind, InputError
from lmpress.vocabulary.types import ErrorInfo

MAX_ATTEMPTS = 3  # a row is submitted at most this many times before it fails


class ProviderBatchJob(BatchJob):
    async def _process(self, done: IdKeys, set_aside: IdKeys) -> None:
        self.state = BatchState(self.files.batches).load()
        if self.engine is None:
            # Every row is written or left aside (the job loaded no engine): an earlier run was
            # killed after writing a batch's rows and before logging it collected.
            for chunk in self.state.waiting():
                self.state.record(chunk, "collected")
        else:
            remote = self.config.remote_params
            provider: Any = self.engine.provider
            self.api = batch_api(self.engine, remote.batch_completion_window or WINDOW)
            self.limits = (
                remote.batch_max_requests or provider.batch_max_requests,
                remote.batch_max_bytes or provider.batch_max_bytes,
            )
        self.settled = (done, set_aside)  # rows an earlier run wrote, or failed for good
        self.reader = RowReader.for_job(
            self.config, self.options, self.engine_class, source=self.source,
            selection=self.selection,
        )  # fmt: skip
        waiting = self._rows_waiting()
        if waiting:
            self._say(f"resuming {len(self.state.waiting())} batches ({len(waiting)} rows)")
        try:
            await self._submit_sealed()
            await self._read_input(done, set_aside, waiting)
            await self._wait()
        finally:
            if self.engine is not None:
                await self.api.aclose()

    # --- rows into chunks ------------------------------------------------------------------

    def _rows_waiting(self) -> IdKeys:
        keys = IdKeys()
        for chunk in self.state.waiting():
            for row in self.state.rows(chunk):
                keys.add(id_key(row["id"]))
        keys.freeze()
        return keys

    async def _read_input(self, done: IdKeys, set_aside: IdKeys, waiting: IdKeys) -> None:
        writers: dict[str, ChunkWriter] = {}
        for rid, read in self.reader.rows():
            if self.stopping:
                break
            key = id_key(rid)
            if key in done or key in set_aside or key in waiting:
                self.summary.rows_skipped += key not in waiting
                continue
            if isinstance(read, RowFailure):
                self._fail(read, None, 0)
                continue
            row, request = read
            _, hit = self.cache.lookup(request) if self.cache is not None else (None, None)
            if hit is not None:
                self._finish(0, row, finished(request, hit), None)  # nothing to submit
                continue
            await self._add(writers, rid, row.line, row.raw, request, attempt=1)
        for writer in writers.values():
            if self._interrupts:  # stopped: sealed and logged, submitted by the next run
                writer.seal()
            else:
                await self._seal_and_submit(writer)

    async def _add(self, writers, rid, line, raw, request, attempt: int) -> None:
        endpoint = await self.api.endpoint(request)
        text = await self.api.line(custom_id(rid), request)
        writer = writers.get(endpoint)
        if writer is not None and not writer.fits(text):
            await self._seal_and_submit(writer)
            writer = None
        if writer is None:
            writer = writers[endpoint] = ChunkWriter(self.state, endpoint, *self.limits)
            if not writer.fits(text):
                raise InputError(
                    f"{self.source.where(line)}: its request is {len(text.encode()):,} bytes, "
                    f"more than a batch may hold ({self.limits[1]:,})"
                )
        writer.add(text, {"id": rid, "custom_id": custom_id(rid), "line": line, "raw": raw,
                          "attempt": attempt})  # fmt: skip

    async def _seal_and_submit(self, writer: ChunkWriter) -> None:
        chunk = writer.seal()
        if chunk is not None:
            await self._submit(chunk)

    async def _submit_sealed(self) -> None:
        for chunk in self.state.waiting():
            if chunk.batch_id is None:
                await self._submit(chunk)

    async def _submit(self, chunk: Chunk) -> None:
        batch_id = await self.api.submit(self.state, chunk)
        self.state.record(chunk, "submitted", batch_id=batch_id)
        self._say(f"submitted {chunk.count} rows as batch {batch_id} ({chunk.name})")

    # --- waiting and collecting ------------------------------------------------------------

    async def _wait(self) -> None:
        remote = self.config.remote_params
        first = delay = min(1.0, remote.batch_poll_max_s)
        shown: dict[str, tuple[Any, ...]] = {}
        started = time.monotonic()
        while not self._interrupts:
            waiting = [c for c in self.state.waiting() if c.batch_id]
            if not waiting:
                return
            for chunk in waiting:
                assert chunk.batch_id is not None
                progress = await self.api.progress(chunk.batch_id)
                seen = (progress.status, progress.done, progress.failed)
                if shown.get(chunk.name) != seen:
                    shown[chunk.name] = seen
                    self._say(_describe(chunk, progress, time.monotonic() - started))
                if progress.refused:
                    self._refused(chunk, progress.refused)
                elif progress.ended:
                    await self._collect(chunk)
                    delay = first
                else:
                    self._check_stuck(chunk, progress)
            if any(not c.collected for c in waiting):
                await self._pause(delay)
                delay = min(remote.batch_poll_max_s, delay * 1.5)
        self._left_at_the_provider()

    async def _pause(self, seconds: float) -> None:
        """Wait between polls; a stop signal ends the wait at once."""
        loop = asyncio.get_running_loop()
        until = loop.time() + seconds
        while not self._interrupts and (left := until - loop.time()) > 0:
            await asyncio.sleep(min(left, 0.1))

    def _left_at_the_provider(self) -> None:
        """Stopped by a signal: every step so far is already in the state log (each one is
        fsynced as it happens); say what the next run picks up."""
        waiting = self.state.waiting()
        if not waiting:
            return
        rows = sum(chunk.count for chunk in waiting)
        self._say(
            f"{len(waiting)} batches ({rows} rows) not collected yet, their state kept in "
            f"{self.state.log}: re-run the same command to collect them"
        )

    def _check_stuck(self, chunk: Chunk, progress: Progress) -> None:
        margin = self.config.remote_params.batch_stuck_margin_s
        if progress.expires_at and time.time() > progress.expires_at + margin:
            raise InputError(
                f"batch {chunk.batch_id} ({chunk.name}) is still {progress.status} past its "
                f"completion window and remote_params.batch_stuck_margin_s ({margin:g}s); the "
                f"provider has not ended it. Re-run the same command to poll it again, or "
                f"cancel it with --cancel"
            )

    async def _collect(self, chunk: Chunk) -> None:
        assert chunk.batch_id is not None
        rows = {row["custom_id"]: row for row in self.state.rows(chunk)}
        again: list[dict[str, Any]] = []
        async for cid, outcome in self.api.results(chunk.batch_id):
            row = rows.pop(cid, None)
            if row is None:
                continue  # not this chunk's (or said twice)
            if outcome.expired:
                again.append(row)
            else:
                self._write(row, outcome)
        again += rows.values()  # rows the results do not mention did not run
        self.state.record(chunk, "collected")
        if again:
            await self._run_again(again)

    def _refused(self, chunk: Chunk, why: str) -> None:
        """A batch the provider refused whole (it failed validation): its rows fail with the
        provider's reason, to the errors file, and are retried by the next run."""
        message = f"batch {chunk.batch_id} failed validation: {why}"
        for row in self.state.rows(chunk):
            if self._settled(row["id"]):
                continue
            failure = RowFailure(row["line"], row["id"], ErrorKind.BAD_REQUEST, message, None,
                                 False, row["raw"])  # fmt: skip
            self._fail(failure, None, 0)
        self.state.record(chunk, "collected")

    def _write(self, row: dict[str, Any], outcome: Outcome) -> None:
        rid, read = self.reader.read(Line(row["line"], row["raw"]))
        if self._settled(rid):
            return
        if isinstance(read, RowFailure):
            self._fail(read, None, 0)
            return
        parsed, request = read
        engine: Any = self.engine
        started = time.perf_counter()
        reply, error = outcome.reply, None
        if reply is None:
            status = outcome.status or 500
            message = f"{engine.name} batch: HTTP {status}: {outcome.message}"
            error = ErrorInfo(engine.status_kind(status), message, status)
        elif isinstance(request, EmbedRequest) and len(reply.embeddings) != len(request.inputs):
            message = (f"{engine.name} batch: the reply has {len(reply.embeddings)} vectors for "
                       f"{len(request.inputs)} inputs")  # fmt: skip
            error = ErrorInfo(ErrorKind.MALFORMED_RESPONSE, message)
        # The live engine's own result building, for each task's reply.
        if isinstance(request, EmbedRequest):
            result = engine.embed_result_of(request, error or reply, started)
            self._keep(request, result)
        elif error is None:
            result = engine.result_of(request, reply, started)
            self._keep(request, result)
            # Checked against the row's JSON schema, regex or choice as a live row is
            # (`pooling.run_request`): a batch row that breaks it fails the same way.
            result = check_structure(request, result)
        else:
            result = error_result(request, engine, error, started)
        result.latency_s = 0.0
        self._finish(0, parsed, result, None)

    def _keep(self, request: Any, result: Any) -> None:
        """A reply a batch brought back, kept in the response cache as a live one is."""
        key = self.cache.key(request) if self.cache is not None else None
        if key is not None:
            self.cache.keep(key, result)

    def _settled(self, rid: str) -> bool:
        """Whether an earlier run, killed while collecting this row's batch, already wrote the
        row or (with --no-retry-failed) recorded its failure."""
        key = id_key(rid)
        return any(key in keys for keys in self.settled)

    async def _run_again(self, rows: list[dict[str, Any]]) -> None:
        """Rows their batch did not run, as --on-expired says."""
        rows = [row for row in rows if not self._settled(row["id"])]
        policy = self.options.on_expired
        retry = [r for r in rows if r.get("attempt", 1) < MAX_ATTEMPTS]
        for row in rows:
            if policy == "fail" or row not in retry:
                tries = "" if policy == "fail" else f" {MAX_ATTEMPTS} times"
                failure = RowFailure(
                    row["line"], row["id"], ErrorKind.BATCH_EXPIRED,
                    f"the provider's batch did not run this row{tries} (expired or cancelled)",
                    None, False, row["raw"],
                )  # fmt: skip
                self._fail(failure, None, 0)
        if policy == "fail" or not retry:
            return
        if policy == "live":
            self._say(f"running {len(retry)} rows live that their batch did not run")
            await asyncio.gather(*(self._live(row) for row in retry))
            return
        self._say(f"resubmitting {len(retry)} rows that their batch did not run")
        writers: dict[str, ChunkWriter] = {}
        for row in retry:
            _, read = self.reader.read(Line(row["line"], row["raw"]))
            if isinstance(read, RowFailure):
                self._fail(read, None, 0)
                continue
            await self._add(writers, row["id"], row["line"], row["raw"], read[1],
                            row.get("attempt", 1) + 1)  # fmt: skip
        for writer in writers.values():
            await self._seal_and_submit(writer)

    async def _live(self, row: dict[str, Any]) -> None:
        assert self.engine is not None
        _, read = self.reader.read(Line(row["line"], row["raw"]))
        if isinstance(read, RowFailure):
            self._fail(read, None, 0)
            return
        parsed, request = read
        self.budget.batch = False
        key = self.cache.key(request) if self.cache is not None else None
        result = await run_request(self.engine, request, self.cache, key)
        self._finish(0, parsed, result, None)
        self.budget.batch = True


def _describe(chunk: Chunk, progress: Progress, elapsed: float) -> str:
    counts = f"{progress.done} done, {progress.failed} failed of {progress.total or chunk.count}"
    left = ""
    if progress.expires_at and not progress.ended:
        hours = max(0.0, progress.expires_at - time.time()) / 3600
        left = f", expires in {hours:.1f}h"
    minutes, seconds = divmod(int(elapsed), 60)
    return (
        f"batch {chunk.batch_id} ({chunk.name}): {progress.status}, {counts}, "
        f"{minutes}m{seconds:02d}s waited{left}"
    )
