"""One batch job from start to end: scan the input, resume what earlier runs left, keep the
engine's worth of rows in flight, write each result as it completes, and stop cleanly."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING, Any, Literal

from lmpress.batch.budget import Budget
from lmpress.batch.events import BatchEvents, BatchSummary, RowFailure
from lmpress.batch.line_models import LineModels, Route
from lmpress.batch.options import BatchMode, BatchOptions
from lmpress.batch.outputs import EngineTokenizer, JsonlOutput, Reorder, output_for
from lmpress.batch.pooling import AnyRequest, AnyResult, finished, run_request
from lmpress.batch.pricing import price_for
from lmpress.batch.rows import RowReader
from lmpress.batch.signals import install_stop_signals, nothing
from lmpress.configs.schema import RunConfig
from lmpress.data.file_formats import FileFormat
from lmpress.data.idkeys import IdKeys
from lmpress.data.jsonl import LazyJsonlWriter
from lmpress.data.output_lock import OutputLock
from lmpress.data.resume import (
    EarlierRun,
    JobFiles,
    fingerprint,
    id_key,
    read_earlier_run,
    scan_input,
    write_fingerprint,
)
from lmpress.data.row_shapes import OutputShape, ParsedRow, output_shape_for
from lmpress.data.sources import Source, open_source
from lmpress.data.spool import remove_stale, spooled
from lmpress.data.targets import (
    STDIO,
    output_file_format,
    resolve_output,
    write_text_atomically,
)
from lmpress.engines.base import Engine
from lmpress.engines.registry import create_engine, load_engine_class
from lmpress.vocabulary.errors import ErrorKind, InputError, OutputWriteError

if TYPE_CHECKING:
    from lmpress.cache.responses import ResponseCache

STOP_CHECK_S = 0.2  # how often a job waiting on its rows in flight looks for a stop signal
# How a run ended, for what a summary that cannot be written says.
Ended = Literal["ok", "write failed", "raised"]


class BatchJob:
    _grace_ends: float | None = None  # loop time when rows in flight are abandoned (a signal)
    _lock: OutputLock | None = None  # the output's, while the job runs
    # Ctrl-C and SIGTERM stop the job; False where the process is another's (`lmpress serve`
    # runs jobs in its event loop, and the server owns its signals).
    owns_signals: bool = True

    def __init__(
        self,
        config: RunConfig,
        options: BatchOptions,
        engine: Engine | None = None,
        events: BatchEvents | None = None,
    ):
        self.config = config
        self.engine = engine
        self.engine_class = type(engine) if engine else load_engine_class(config.engine)
        self.options = options
        self.events = events or BatchEvents()
        self.source: Source = open_source(options.input_path, options.input_format, options.split)
        file_format = output_file_format(options.output_path, options.file_format)
        self.files = JobFiles.found(options.output_path, file_format)
        self.target = resolve_output(options.output_path, options.input_path, self.files.side_files)
        parquet = file_format is FileFormat.PARQUET
        if self.target.stream and parquet:
            raise InputError(f"{options.output_path}: Parquet is written to a file, not a stream")
        schema = self.source.arrow_schema() if parquet else None
        self.output = output_for(
            self.target, self.files, file_format, options.output_shape, schema,
            options.mapping.id_column,
        )  # fmt: skip
        if isinstance(self.output, JsonlOutput):  # for a line that echoes its prompt's tokens
            self.output.tokenizer = EngineTokenizer(lambda: self.engine)
        self.selection = options.selection()
        provider_batch = options.mode is BatchMode.PROVIDER
        self.budget = Budget(
            options.max_cost, options.max_tokens, price_for(config), provider_batch
        )
        label = "stdout" if self.target.path == STDIO else options.output_path
        self.summary = BatchSummary(
            options.input_path, label, self.source.unit, task=self.config.task
        )
        if not self.target.stream:
            self.summary.errors_path = str(self.files.errors)
        self.unreachable = False  # stopped because the endpoint never answered
        self.stopping = False  # no new rows: Ctrl-C, --on-error fail, --max-errors, a budget
        self._interrupts = 0
        self.cache: ResponseCache | None = None
        # Who answers a line that names a model (a --models job sets its own).
        self.line_models = LineModels(config, strict=options.strict_model)

    # --- the whole job ---------------------------------------------------------------------

    async def run(self) -> BatchSummary:
        # A piped input is copied once, so the scan and the run both read it; then one job per
        # output: locked before anything an earlier run left is read or removed.
        with self._spooled_input(), self._lock_output() as lock:
            self._lock = lock
            return await self._run()

    @contextmanager
    def _spooled_input(self) -> Iterator[None]:
        beside = not self.target.stream  # a streamed output has no folder of its own
        folder, label = (self.files.output.parent, self.files.output.name) if beside else (None, "")
        with spooled(self.source, folder, label) as source:
            self.source = source
            yield

    def _lock_output(self) -> OutputLock | nullcontext:
        if self.target.stream:  # nothing to resume, so nothing two jobs could write twice
            return nullcontext()
        lock = OutputLock.take(self.files.lock, self.options.output_path)
        remove_stale(self.files.output.parent, self.files.output.name, self.source.path)
        return lock

    async def _run(self) -> BatchSummary:
        started = time.perf_counter()
        id_column = self.options.mapping.id_column
        total, keys = scan_input(self.source, self.selection, id_column)
        if total == 0:
            shard = self.selection.shard_label
            rows = f"shard {shard} has" if shard else "the input has"
            self._say(f"{self.options.input_path}: {rows} no rows; nothing to do")
        earlier = self._read_earlier_run()
        done, set_aside = earlier.done, earlier.set_aside
        self.summary.rows_total = total
        if isinstance(self._lock, OutputLock):  # a running job's progress, for `lmpress view`
            self._lock.note(rows_total=total)
        left = total > len(keys) or any(k not in done and k not in set_aside for k in keys)
        if left:
            self.cache = await asyncio.to_thread(self._open_cache)
        if self.engine is None and left:
            await self._start_engine()  # before anything is written; a finished job loads none
        loop = asyncio.get_running_loop()
        # Ctrl-C is the job's from before the fingerprint is written: whoever sees the job's
        # files can stop it the job's way.
        restore_signals = (
            install_stop_signals(loop, self._on_interrupt) if self.owns_signals else nothing
        )
        if earlier.fresh:
            try:
                self.files.remove_all()
                write_fingerprint(self.files, self._fingerprint(), self.options.recipe)
            except BaseException:
                restore_signals()
                raise
        ended: Ended = "raised"
        try:
            self.events.started(self.summary)
            with self.output.open() as out, LazyJsonlWriter(self._errors_path()) as errors:
                self._out, self._errors = out, errors
                await self._process(done, set_aside)
            self._finish_output()
            self.summary.count_left()
            ended = "ok"
        except OutputWriteError as exc:
            self.summary.stopped_because = str(exc)
            ended = "write failed"
            raise
        finally:
            restore_signals()
            self._close_cache()
            self.summary.wall_s = time.perf_counter() - started
            self.events.finished(self.summary)
            self._write_summary(ended)
        return self.summary

    async def _start_engine(self) -> None:
        model = self.config.model.model_name
        self._say(f"loading {model} on {self.config.engine}…" if model else "starting…")
        self.engine = await asyncio.to_thread(create_engine, self.config)

    def _open_cache(self) -> ResponseCache | None:
        """The response cache this job reads and adds to (None: off, or unusable, said)."""
        from lmpress.cache.responses import ResponseCache

        options = self.options
        return ResponseCache.open(self.config, options.cache, options.cache_dir, self._say)

    def _close_cache(self) -> None:
        if self.cache is None:
            return
        self.cache.close()
        self.summary.cache_misses = self.cache.misses
        self.summary.cache_write_wait_s = self.cache.store.longest_lock_wait_s
        if self.cache.damaged_reads:
            self._say(
                f"response cache: {self.cache.damaged_reads} damaged entries were read as "
                f"misses and generated again"
            )

    def _errors_path(self):
        return None if self.target.stream else self.files.errors

    def _fingerprint(self) -> dict[str, Any]:
        from lmpress.cache.keys import adapter_identities  # by content, as the cache keys them

        adapters = adapter_identities(self.config)
        return fingerprint(self.config, self.options.output_settings(), adapters)

    def _read_earlier_run(self) -> EarlierRun:
        if self.target.stream:  # nothing to resume from, nothing to start over
            return EarlierRun(IdKeys(), IdKeys(), fresh=False)
        return read_earlier_run(
            self.files,
            self._fingerprint(),
            overwrite=self.options.overwrite,
            retry_failed=self.options.retry_failed,
            say=self._say,
            id_column=self.options.mapping.id_column,
        )

    def _finish_output(self) -> None:
        """A Parquet output is written from its journal, on a stop too; the journal stays
        whole if that fails, so the next run writes it."""
        try:
            said = self.output.finish()
        except OSError as exc:
            raise OutputWriteError(self.files.output, exc) from exc
        if said:
            self._say(said)

    # --- rows ------------------------------------------------------------------------------

    async def _process(self, done: IdKeys, set_aside: IdKeys) -> None:
        options = self.options
        reader = RowReader.for_job(
            self.config, options, self.engine_class, source=self.source, selection=self.selection
        )
        window = 1  # until the engine exists and says how many it wants
        reorder = Reorder(self._out) if options.ordered else None
        in_flight: set[asyncio.Task] = set()
        seq = 0
        for rid, read in reader.rows():
            if self.stopping:
                break
            key = id_key(rid)
            if key in done or key in set_aside:
                self.summary.rows_skipped += 1
                continue
            if isinstance(read, RowFailure):
                self._fail(read, reorder, seq)
                seq += 1
                continue
            row, request = read
            route, refused = self._routed(row)
            if route is Route.ELSEWHERE:
                self.summary.rows_elsewhere += 1
                continue
            if refused is not None or (refused := self._refused(row)) is not None:
                self._fail(refused, reorder, seq)
                seq += 1
                continue
            key, hit = self.cache.lookup(request) if self.cache is not None else (None, None)
            if hit is not None:
                self._finish(seq, row, finished(request, hit), reorder)
                seq += 1
                if seq % 256 == 0:  # a run of hits still hears Ctrl-C, and serves its rows
                    await asyncio.sleep(0)
                continue
            assert self.engine is not None
            window = self.window()
            # Bounded memory: rows in flight, plus (when ordered) finished rows held for order.
            while (
                in_flight
                and not self.stopping
                and (
                    len(in_flight) >= window
                    or (reorder is not None and len(in_flight) + reorder.held >= 4 * window)
                )
            ):
                in_flight = await self._settle(in_flight, reorder)
            if self.stopping:
                break
            in_flight.add(asyncio.create_task(self._run_row(seq, row, request, key)))
            await asyncio.sleep(0)  # let the engine see the request at once
            seq += 1
        await self._drain(in_flight, reorder)

    def refuse(self, row: ParsedRow) -> str | None:
        """Why this job will not run a row it could read (None: it runs it). Every row runs
        here; a server's batch refuses a line for another endpoint than the batch's."""
        return None

    def _routed(self, row: ParsedRow) -> tuple[Route, RowFailure | None]:
        """Where a line that names a model runs (`batch.line_models`); its 404 failure."""
        route, message = self.line_models.route(row.model)
        if route is Route.RUN_OTHER:
            self.summary.rows_naming_other_model += 1
        if route is not Route.UNKNOWN:
            return route, None
        openai = output_shape_for(row, self.options.output_shape) is OutputShape.OPENAI
        kind = ErrorKind.NOT_FOUND
        return route, RowFailure(row.line, row.id, kind, message, 404, openai, row.raw)

    def _refused(self, row: ParsedRow) -> RowFailure | None:
        reason = self.refuse(row)
        if reason is None:
            return None
        openai = output_shape_for(row, self.options.output_shape) is OutputShape.OPENAI
        return RowFailure(row.line, row.id, ErrorKind.INVALID_ROW, reason, None, openai, row.raw)

    def window(self) -> int:
        """How many rows are kept in flight: as many as keep the engine busy."""
        assert self.engine is not None
        return self.engine.max_in_flight

    async def _settle(
        self, in_flight: set[asyncio.Task], reorder: Reorder | None
    ) -> set[asyncio.Task]:
        """Write the rows that finish within a moment; the rows still in flight. The moment
        is short so that a signal is seen while every row in flight is slow."""
        left = self.grace_left()
        tick = STOP_CHECK_S if left is None else min(left, STOP_CHECK_S)
        finished, pending = await asyncio.wait(
            in_flight, timeout=tick, return_when=asyncio.FIRST_COMPLETED
        )
        for task in finished:
            if not task.cancelled():
                self._finish(*task.result(), reorder)
        return pending

    async def _drain(self, in_flight: set[asyncio.Task], reorder: Reorder | None) -> None:
        """No more rows are taken: those in flight finish. Once a signal came (before or
        meanwhile) they have what is left of its grace period; those still running then are
        abandoned, and redone by the next run."""
        while in_flight and self.grace_left() != 0:
            in_flight = await self._settle(in_flight, reorder)
        for task in in_flight:
            task.cancel()
        if in_flight:
            await asyncio.wait(in_flight)
            for task in in_flight:  # abandoned: what a row raised while cancelled is moot
                if not task.cancelled():
                    task.exception()
            self._say(f"left {len(in_flight)} unfinished rows for the next run")

    async def _run_row(self, seq: int, row: ParsedRow, request: AnyRequest, key: bytes | None):
        assert self.engine is not None
        return seq, row, await run_request(self.engine, request, self.cache, key)

    def _finish(self, seq: int, row: ParsedRow, result: AnyResult, reorder: Reorder | None) -> None:
        summary = self.summary
        if result.cached:  # nothing spent: the budget and the run's tokens count none of it
            self._from_cache(result)
        else:
            summary.prompt_tokens += result.usage.prompt_tokens
            summary.completion_tokens += result.usage.completion_tokens
            summary.reasoning_tokens += result.usage.reasoning_tokens
            summary.cached_tokens += result.usage.cached_tokens
            summary.cache_creation_tokens += result.usage.cache_creation_tokens
            self.budget.charge(result)
        if result.cost_usd is not None:
            summary.cost_usd = (summary.cost_usd or 0.0) + result.cost_usd
            summary.cost_live_usd = self.budget.live_spent
        if (reason := self.budget.exceeded()) and not self.stopping:
            self._stop(reason)
        if result.error is not None:
            error = result.error
            self._check_reachable(error.kind, error.message)
            shape = output_shape_for(row, self.options.output_shape)
            openai = shape is OutputShape.OPENAI
            failure = RowFailure(
                row.line, row.id, error.kind, error.message, error.status, openai, row.raw
            )
            self._fail(failure, reorder, seq)
            return
        line = self.output.done_line(row, result)
        if reorder is not None:
            reorder.put(seq, line)
        else:
            self._out.write(line)
        summary.rows_ok += 1
        self.events.progressed(summary)

    def _from_cache(self, result: AnyResult) -> None:
        """A hit costs nothing; what its tokens would have cost is the money saved."""
        summary = self.summary
        summary.cache_hits += 1
        if self.budget.price is None:
            return
        saved = self.budget.price_of(result.usage)
        summary.cost_saved_usd = (summary.cost_saved_usd or 0.0) + saved
        result.cost_usd = 0.0

    def _fail(self, failure: RowFailure, reorder: Reorder | None, seq: int) -> None:
        summary = self.summary
        summary.rows_failed += 1
        # An unreachable endpoint is said once (`_check_reachable`), not for each row.
        if not (self.unreachable and failure.kind == ErrorKind.CONNECTION_ERROR):
            self.events.row_failed(failure)
        self._errors.write(failure.record())
        line = self.output.failed_line(failure)
        if reorder is not None:
            reorder.put(seq, line)
        elif line is not None:
            self._out.write(line)
        self.events.progressed(summary)
        options = self.options
        if options.on_error == "fail" and not self.stopping:
            self._stop(f"a row failed and --on-error is fail (line {failure.line})")
        elif options.max_errors and summary.rows_failed >= options.max_errors and not self.stopping:
            self._stop(f"{summary.rows_failed} rows failed (--max-errors {options.max_errors})")

    # --- stopping --------------------------------------------------------------------------

    def _check_reachable(self, kind: ErrorKind, message: str) -> None:
        """Stop the job when the endpoint has never answered: with no row done yet and the
        first failure a connection error, every other row would only fail the same way."""
        if kind != ErrorKind.CONNECTION_ERROR or self.summary.rows_ok or self.stopping:
            return
        self.unreachable = True
        where = self.config.remote_params.api_url or "the endpoint"
        self._stop(
            f"{where} cannot be reached: {message}; no row was generated, so the job stops "
            f"here: re-run the same command to resume once it is up"
        )

    def _stop(self, reason: str) -> None:
        self.stopping = True
        self.summary.stopped_because = reason
        self._say(f"stopping: {reason}; rows in flight finish first")

    def _on_interrupt(self, name: str = "SIGINT") -> None:
        """Ctrl-C (SIGINT) or SIGTERM: take no new rows, let those in flight finish within
        the grace period, write the output, the errors file and the summary, and exit 130 or
        143. A second signal of either kind exits at once."""
        self._interrupts += 1
        self.events.interrupted()
        summary = self.summary
        if self._interrupts > 1:
            # Every written row is already flushed; the next run repairs and resumes.
            self._say("stopped at once; re-run the same command to resume")
            sys.stderr.flush()
            os._exit(summary.exit_code)
        self.stopping = True
        summary.interrupted, summary.signal = True, name
        how = "interrupted by Ctrl-C" if name == "SIGINT" else f"stopped by {name}"
        summary.stopped_because = summary.stopped_because or how
        grace = self.options.grace_s
        self._grace_ends = asyncio.get_running_loop().time() + grace
        again = "Ctrl-C" if name == "SIGINT" else f"Ctrl-C or {name}"
        self._say(
            f"{how}: finishing rows in flight for up to {grace:g}s ({again} again to stop "
            f"at once); re-run the same command to resume"
        )

    def grace_left(self) -> float | None:
        """Seconds left for rows in flight once a signal came; None: no signal, no limit."""
        if self._grace_ends is None:
            return None
        return max(0.0, self._grace_ends - asyncio.get_running_loop().time())

    # --- helpers ---------------------------------------------------------------------------

    def _write_summary(self, ended: Ended = "ok") -> None:
        """OUT.summary.json, replaced whole or not at all. One that cannot be written ends a
        run that went well with that error; after another error it is a notice; after a
        failed write to the output (on its way to the user, and likely the same full disk),
        nothing more is said."""
        if self.target.stream:
            return
        try:
            text = json.dumps(self.summary.as_dict(), indent=2) + "\n"
            write_text_atomically(self.files.summary, text)
        except OSError as exc:
            error = OutputWriteError(self.files.summary, exc)
            if ended == "ok":
                raise error from exc
            if ended != "write failed":
                self._say(str(error))

    def _say(self, message: str) -> None:
        self.events.notice(message)
