"""OpenAI's Batch API in `lmpress serve`: each batch runs through lmpress's own batch runner
(`batch.job.BatchJob`) on the served engine, in the server's event loop.

A batch goes validating -> in_progress -> finalizing -> completed as at OpenAI (cancelling ->
cancelled on a cancel; failed when the runner refuses the job, its errors saying why). Its
output is the runner's output file, with the runner's guarantees: each finished line is written
as it finishes, and a server killed mid-batch and started again on the same `--state-dir`
resumes every unfinished batch from what its output holds, so each line appears there once. A
line that cannot be read or fails fails alone, into the batch's error file.

Interactive requests keep priority: batches run one at a time (in the order they were made), and
a batch keeps at most `lines_in_flight` lines at the engine (a quarter of what the engine takes
at once, so half a NATIVE engine's batch), so an interactive request finds room in the engine's
running batch instead of queueing behind batch lines.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import FastAPI, Query
from fastapi import Request as HttpRequest
from openai.types import Batch, BatchError, BatchRequestCounts, FileDeleted, FileObject
from openai.types.batch import Errors
from pydantic import BaseModel, ConfigDict

from lmpress.batch.events import BatchEvents, BatchSummary
from lmpress.batch.job import BatchJob
from lmpress.batch.options import BatchOptions
from lmpress.batch.pooling import check_mode
from lmpress.cache.responses import cache_mode
from lmpress.data.file_formats import FileFormat
from lmpress.data.resume import JobFiles
from lmpress.data.row_shapes import OutputShape, ParsedRow
from lmpress.engines.base import Engine, error_result
from lmpress.serve import openapi
from lmpress.serve.files import PURPOSES, FileRoutes, read_limited
from lmpress.serve.media import ClientImages, local_file_refused
from lmpress.serve.state import StateStore, new_object_id
from lmpress.vocabulary.errors import ErrorKind, LmpressError
from lmpress.vocabulary.images import is_local_file, message_image_urls
from lmpress.vocabulary.types import ErrorInfo, Request, Usage
from lmpress.wire.openai import requests as bodies
from lmpress.wire.openai.errors import ApiError
from lmpress.wire.openai.pooling import EMBEDDINGS_PATH

log = logging.getLogger("lmpress.serve")

# The endpoints a batch may name, and the task the served engine must run for each.
ENDPOINT_TASKS = {
    bodies.CHAT_PATH: "generate",
    bodies.COMPLETIONS_PATH: "generate",
    EMBEDDINGS_PATH: "embed",
}
WINDOWS = ("24h",)  # OpenAI's only completion window
RUNNING = ("validating", "in_progress", "finalizing")
ENDED = ("completed", "failed", "expired", "cancelled")
MAX_CREATE_BYTES = 64 * 1024  # a create body is an id, an endpoint and up to 16 metadata pairs
SAVE_EVERY_S = 0.5  # a running batch's record is rewritten at most this often
# What a batch reports as each line ends: "completed" or "failed", and the tokens the line
# used (/metrics counts both: no HTTP request carries a batch line's).
LineListener = Callable[[Literal["completed", "failed"], Usage], None]


class CreateBatchBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    input_file_id: str
    endpoint: str
    completion_window: str
    metadata: dict[str, str] | None = None


class ServedBatchJob(BatchJob):
    """The batch runner as a server runs it: the server owns the signals, the batch keeps only
    a few lines at the engine at once, and a line's images are taken as the interactive routes
    take them (the server's media policy and caps)."""

    owns_signals = False

    def __init__(
        self,
        config: Any,
        options: BatchOptions,
        engine: Engine,
        events: BatchEvents,
        endpoint: str,
        images: ClientImages | None = None,
    ):
        super().__init__(config, options, engine, events)
        self.lines_in_flight = lines_in_flight(engine)
        self.endpoint = endpoint
        self.images = images

    def window(self) -> int:
        return self.lines_in_flight

    def refuse(self, row: ParsedRow) -> str | None:
        if row.url != self.endpoint:  # as at OpenAI: one endpoint a batch
            return f"url {row.url} is not this batch's endpoint {self.endpoint}"
        for message in row.messages:  # as the interactive routes: no file of this machine
            for url in message_image_urls(message):
                if is_local_file(url):
                    return local_file_refused(url)
        return None

    async def _run_row(self, seq: int, row: ParsedRow, request: Any, key: bytes | None):
        if self.images is not None and isinstance(request, Request):
            started = time.perf_counter()
            try:
                await self.images.take(request.messages, "messages", f"{row.id} (line {row.line})")
            except ApiError as exc:
                assert self.engine is not None
                info = ErrorInfo(ErrorKind.INVALID_REQUEST, exc.message, 400)
                return seq, row, error_result(request, self.engine, info, started)
        return await super()._run_row(seq, row, request, key)

    def cancel(self) -> None:
        """No new lines; those at the engine finish and are written."""
        if not self.stopping:
            self._stop("the batch was cancelled")


def lines_in_flight(engine: Engine) -> int:
    """A quarter of what the engine takes at once: the rest is left to interactive requests."""
    return max(1, engine.max_in_flight // 4)


class BatchRuns:
    """The batches of one server: the routes, and a task running each unfinished batch."""

    def __init__(self, engine: Engine, store: StateStore, images: ClientImages | None = None):
        self.engine = engine
        self.store = store
        self.images = images
        self.live: dict[str, Batch] = {}  # running batches, newer than their records
        self.jobs: dict[str, ServedBatchJob] = {}
        self.tasks: dict[str, asyncio.Task] = {}
        self.line_listeners: list[LineListener] = []
        self.turn = asyncio.Lock()  # held by the batch running; the others wait, validating

    # --- the routes ------------------------------------------------------------------------

    async def create(self, request: HttpRequest) -> dict[str, Any]:
        body = bodies.parse_body(CreateBatchBody, await read_limited(request, MAX_CREATE_BYTES))
        task = ENDPOINT_TASKS.get(body.endpoint)
        if task is None:
            known = ", ".join(ENDPOINT_TASKS)
            raise ApiError(400, f"endpoint {body.endpoint!r}: use one of {known}", param="endpoint")
        if task != self.engine.config.task:
            raise ApiError(
                400,
                f"endpoint {body.endpoint}: this server runs the {self.engine.config.task} "
                f"task; start it with --task {task} to batch {body.endpoint}",
                param="endpoint",
                code="unsupported_task",
            )
        if body.completion_window not in WINDOWS:
            raise ApiError(
                400,
                f"completion_window {body.completion_window!r}: use '24h'",
                param="completion_window",
            )
        stored = self.store.file(body.input_file_id)
        if stored is None:
            raise ApiError(404, f"No such File object: {body.input_file_id}", param="input_file_id")
        if stored.file.purpose != "batch":
            raise ApiError(
                400,
                f"file {body.input_file_id} has purpose {stored.file.purpose!r}, not 'batch'",
                param="input_file_id",
            )
        now = int(time.time())
        batch = Batch(
            id=new_object_id("batch"),
            object="batch",
            endpoint=body.endpoint,
            input_file_id=body.input_file_id,
            completion_window=body.completion_window,
            status="validating",
            created_at=now,
            expires_at=now + 24 * 3600,
            metadata=body.metadata,
            request_counts=BatchRequestCounts(total=0, completed=0, failed=0),
        )
        self.store.save_batch(batch)
        self.start(batch)
        return batch.model_dump()

    async def retrieve(self, batch_id: str) -> dict[str, Any]:
        return self._find(batch_id).model_dump()

    async def list(
        self, after: str | None = None, limit: Annotated[int, Query(ge=1, le=100)] = 20
    ) -> dict[str, Any]:
        batches = [self.live.get(b.id, b) for b in self.store.batches()]
        if after is not None:
            ids = [b.id for b in batches]
            batches = batches[ids.index(after) + 1 :] if after in ids else []
        page = batches[:limit]
        return {
            "object": "list",
            "data": [b.model_dump() for b in page],
            "first_id": page[0].id if page else None,
            "last_id": page[-1].id if page else None,
            "has_more": len(batches) > limit,
        }

    async def cancel(self, batch_id: str) -> dict[str, Any]:
        batch = self._find(batch_id)
        if batch.status in ("cancelling", "cancelled"):
            return batch.model_dump()
        if batch.status in ENDED:
            raise ApiError(409, f"Cannot cancel a batch with status '{batch.status}'.", param="id")
        batch = self._update(batch, status="cancelling", cancelling_at=int(time.time()))
        job = self.jobs.get(batch.id)
        if job is not None:
            job.cancel()
        elif (task := self.tasks.get(batch.id)) is not None:  # waiting for its turn: ends now
            task.cancel()
            batch = self._finalize(batch)
        return batch.model_dump()

    def _find(self, batch_id: str) -> Batch:
        batch = self.live.get(batch_id) or self.store.batch(batch_id)
        if batch is None:
            raise ApiError(404, f"No such Batch object: {batch_id}", param="id", code="not_found")
        return batch

    # --- running ---------------------------------------------------------------------------

    def resume(self) -> None:
        """Start again every batch an earlier server left unfinished (called in the loop)."""
        for batch in reversed(self.store.batches()):  # oldest first: their turns, in order
            if batch.status in (*RUNNING, "cancelling"):
                log.info("resuming %s (%s)", batch.id, batch.status)
                self.start(batch)

    def start(self, batch: Batch) -> None:
        self.live[batch.id] = batch
        self.tasks[batch.id] = asyncio.create_task(self._run(batch.id))

    async def stop(self) -> None:
        """The server stops: batches are left as they are, for the next start to resume
        (lines at the engine are abandoned and run again then)."""
        for task in self.tasks.values():
            task.cancel()
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)

    async def _run(self, batch_id: str) -> None:
        batch = self.live[batch_id]
        try:
            if batch.status != "cancelling":
                await self._run_lines(batch)
            self._finalize(self.live[batch_id])
        except asyncio.CancelledError:
            raise
        except LmpressError as exc:
            self._fail(batch_id, "invalid_batch", str(exc))
        except Exception as exc:  # a bug: the batch fails, saying so; the server goes on
            log.exception("batch %s failed", batch_id)
            self._fail(batch_id, "server_error", f"internal error: {type(exc).__name__}: {exc}")
        finally:
            self.jobs.pop(batch_id, None)
            self.tasks.pop(batch_id, None)
            self.live.pop(batch_id, None)

    async def _run_lines(self, batch: Batch) -> None:
        stored = self.store.file(batch.input_file_id)
        if stored is None:
            raise LmpressError(f"the input file {batch.input_file_id} was deleted")
        out = self.store.batch_output(batch.id)
        options = BatchOptions(
            input_path=str(stored.path),
            output_path=str(out),
            output_shape=OutputShape.OPENAI,
            input_format=FileFormat.JSONL,
            retry_failed=False,  # as at OpenAI, a failed line stays failed
        )
        config = self.engine.config
        # The server's response cache, where it has one: off unless `serve --cache` asked.
        options.cache = cache_mode(config.serve.cache).value
        options.cache_dir = config.serve.cache_dir
        check_mode(config, options.mode, type(self.engine))
        async with self.turn:  # one batch at a time, so the lines at the engine stay few
            done, failed = _lines(out), _lines(JobFiles.found(out).errors)
            events = _Progress(self, batch.id, done, failed)
            job = ServedBatchJob(config, options, self.engine, events, batch.endpoint, self.images)
            self.jobs[batch.id] = job
            if self.live[batch.id].status == "cancelling":  # cancelled while it waited
                job.cancel()
            summary = await job.run()
        if summary.stopped_because and self.live[batch.id].status != "cancelling":
            # Lines were left undone for another reason than a cancel (a remote engine's
            # endpoint that never answered): the batch did not complete.
            raise LmpressError(summary.stopped_because)

    def _finalize(self, batch: Batch) -> Batch:
        cancelled = batch.status == "cancelling"
        if not cancelled:
            batch = self._update(batch, status="finalizing", finalizing_at=int(time.time()))
        counts, output_id, error_id = self._result_files(batch)
        now = int(time.time())
        ended = {"status": "cancelled", "cancelled_at": now} if cancelled else {
            "status": "completed", "completed_at": now
        }  # fmt: skip
        batch = self._update(
            batch, request_counts=counts, output_file_id=output_id, error_file_id=error_id,
            **ended,
        )  # fmt: skip
        log.info("%s %s: %d lines done, %d failed", batch.id, ended["status"],
                 counts.completed, counts.failed)  # fmt: skip
        return batch

    def _result_files(self, batch: Batch) -> tuple[BatchRequestCounts, str | None, str | None]:
        """The batch's counts from its output and error files, and the ids those files are
        registered under (None for an empty one)."""
        out = self.store.batch_output(batch.id)
        errors = JobFiles.found(out).errors
        completed, failed = _lines(out), _lines(errors)
        counts = BatchRequestCounts(
            total=max(batch.request_counts.total if batch.request_counts else 0,
                      completed + failed),
            completed=completed,
            failed=failed,
        )  # fmt: skip
        # Ids made from the batch's, so a restart in the middle registers the same files.
        suffix = batch.id.removeprefix("batch-")
        output_id = error_id = None
        if completed:
            output_id = f"file-{suffix}-output"
            self.store.register_file(out, f"{batch.id}_output.jsonl", "batch_output", output_id)
        if failed:
            error_id = f"file-{suffix}-errors"
            self.store.register_file(errors, f"{batch.id}_error.jsonl", "batch_output", error_id)
        return counts, output_id, error_id

    def _fail(self, batch_id: str, code: str, message: str) -> None:
        """The batch ends failed; the lines it did finish stay readable, in its output and
        error files, as a completed batch's."""
        batch = self.live.get(batch_id) or self.store.batch(batch_id)
        assert batch is not None
        counts, output_id, error_id = self._result_files(batch)
        errors = Errors(object="list", data=[BatchError(code=code, message=message)])
        self._update(
            batch, status="failed", failed_at=int(time.time()), errors=errors,
            request_counts=counts, output_file_id=output_id, error_file_id=error_id,
        )  # fmt: skip
        log.warning("%s failed: %s", batch_id, message)

    def _update(self, batch: Batch, save: bool = True, **changes: Any) -> Batch:
        updated = batch.model_copy(update=changes)
        if batch.id in self.live:
            self.live[batch.id] = updated
        if save:
            self.store.save_batch(updated)
        return updated

    def _progressed(self, batch_id: str, counts: BatchRequestCounts, save: bool) -> None:
        batch = self.live[batch_id]
        changes: dict[str, Any] = {"request_counts": counts}
        if batch.status == "validating":
            changes.update(status="in_progress", in_progress_at=int(time.time()))
            save = True
        self._update(batch, save, **changes)


class _Progress(BatchEvents):
    """The runner's reports, as a batch's request counts."""

    def __init__(self, runs: BatchRuns, batch_id: str, done: int, failed: int):
        self.runs, self.batch_id = runs, batch_id
        self.done, self.failed = done, failed  # lines an earlier server finished
        self.saved_at = 0.0
        self.seen = (0, 0)  # lines done and failed in this run, when last reported
        self.tokens = (0, 0, 0)  # prompt, completion and reasoning tokens, then

    def started(self, summary: BatchSummary) -> None:
        self._report(summary, save=True)

    def progressed(self, summary: BatchSummary) -> None:
        """Called once for each line that ends, just after the runner counted it."""
        outcome: Literal["completed", "failed"] = (
            "completed" if summary.rows_ok > self.seen[0] else "failed"
        )
        tokens = (summary.prompt_tokens, summary.completion_tokens, summary.reasoning_tokens)
        usage = Usage(*(now - before for now, before in zip(tokens, self.tokens, strict=True)))
        self.seen, self.tokens = (summary.rows_ok, summary.rows_failed), tokens
        for listener in self.runs.line_listeners:
            listener(outcome, usage)
        now = time.monotonic()
        self._report(summary, save=now - self.saved_at >= SAVE_EVERY_S)

    def _report(self, summary: BatchSummary, save: bool) -> None:
        if save:
            self.saved_at = time.monotonic()
        counts = BatchRequestCounts(
            total=summary.rows_total,
            completed=self.done + summary.rows_ok,
            failed=self.failed + summary.rows_failed,
        )
        self.runs._progressed(self.batch_id, counts, save)


def _lines(path: Path) -> int:
    """Whole lines in a file (a torn last line, which the runner repairs, is not one), read a
    MiB at a time: an output file may be larger than memory."""
    try:
        with path.open("rb") as f:
            return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
    except FileNotFoundError:
        return 0


def add_batch_routes(
    app: FastAPI, engine: Engine, state_dir: str | None, images: ClientImages | None = None
) -> BatchRuns | None:
    """/v1/files and /v1/batches on `app`, kept under `state_dir`; without one, each answers
    how to turn them on. The runs returned are resumed and stopped by `serve.server`; their
    lines' images are taken by `images`, the server's."""
    if state_dir is None:

        async def off() -> None:
            raise ApiError(
                404,
                "this server keeps no files or batches: start lmpress serve with "
                "--state-dir DIR to use the Files and Batch APIs",
                code="not_found",
            )

        for path in (
            "/v1/files",
            "/v1/files/{rest:path}",
            "/v1/batches",
            "/v1/batches/{rest:path}",
        ):
            app.add_api_route(
                path, off, methods=["GET", "POST", "DELETE"], response_model=None,
                responses=openapi.replies(),
            )  # fmt: skip
        return None
    store = StateStore(state_dir)
    files, runs = FileRoutes(store), BatchRuns(engine, store, images)
    upload = openapi.form_body(
        {"file": {"type": "string", "format": "binary"}, "purpose": {"enum": list(PURPOSES)}},
        ["file", "purpose"],
    )
    for path, route, method, reply, extra in (
        ("/v1/files", files.upload, "POST", FileObject, upload),
        ("/v1/files", files.list, "GET", openapi.FileList, None),
        ("/v1/files/{file_id}", files.retrieve, "GET", FileObject, None),
        ("/v1/files/{file_id}", files.delete, "DELETE", FileDeleted, None),
        ("/v1/files/{file_id}/content", files.content, "GET", None, None),
        ("/v1/batches", runs.create, "POST", Batch, openapi.json_body(CreateBatchBody)),
        ("/v1/batches", runs.list, "GET", openapi.BatchList, None),
        ("/v1/batches/{batch_id}", runs.retrieve, "GET", Batch, None),
        ("/v1/batches/{batch_id}/cancel", runs.cancel, "POST", Batch, None),
    ):
        media = "application/octet-stream" if reply is None else None
        app.add_api_route(
            path, route, methods=[method], openapi_extra=extra, response_model=None,
            responses=openapi.replies(reply, media=media),
        )  # fmt: skip
    return runs
