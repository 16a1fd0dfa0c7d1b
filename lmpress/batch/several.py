"""One job across several models: `lmpress batch --models A,B,C`.

Every row runs through every model. Each model is an ordinary `BatchJob` writing a part of its
own (`batch.model_parts`), so every guarantee of a batch job holds per (row, model): a re-run
resumes each part where it stopped, each part has its response cache keys and fingerprint,
and a Parquet part is journaled. This job adds what is across models: the lock on OUT, the
record of which models OUT was started with, Ctrl-C and SIGTERM taken once for every part,
budgets counted across parts, the merged output and errors, and a summary per model.

Models run one after another, except remote ones (an API does the work, and this process only
waits), which run side by side with each other: two local models at once would hold both in
memory and share the same cores or GPU, so running them together saves little and risks the
memory; one after another, each is closed before the next loads.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from dataclasses import dataclass, field
from typing import Any

from lmpress.batch.budget import Budget
from lmpress.batch.events import BatchEvents, BatchSummary, RowFailure
from lmpress.batch.job import BatchJob
from lmpress.batch.line_models import LineModels, model_names
from lmpress.batch.model_parts import ModelPart, merge_jsonl, merge_parquet, model_parts
from lmpress.batch.options import BatchOptions
from lmpress.batch.pooling import check_mode
from lmpress.batch.run import RUNNERS, batch_mode
from lmpress.batch.signals import install_stop_signals
from lmpress.configs.schema import RunConfig
from lmpress.data.file_formats import FileFormat
from lmpress.data.output_lock import OutputLock
from lmpress.data.resume import JobFiles, check_fingerprint, write_fingerprint
from lmpress.data.targets import output_file_format, write_text_atomically
from lmpress.engines.registry import REMOTE
from lmpress.vocabulary.errors import OutputWriteError

REMOTE_ENGINES = {spec.name for spec in REMOTE}
SUMMED = (
    "rows_total", "rows_ok", "rows_failed", "rows_skipped", "rows_left", "rows_elsewhere",
    "prompt_tokens", "completion_tokens", "reasoning_tokens", "cached_tokens",
    "cache_creation_tokens", "cache_hits", "cache_misses",
)  # fmt: skip


@dataclass
class ModelRun:
    """One model of the job: its name as given to --models, its config and its part."""

    label: str
    config: RunConfig
    part: ModelPart | None = None
    summary: BatchSummary | None = None


@dataclass
class SeveralSummary:
    """The job's summary: one per model, and their sum."""

    total: BatchSummary
    models: list[tuple[str, BatchSummary]] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return self.total.exit_code

    def as_dict(self) -> dict[str, Any]:
        per_model = [{"model": label, **s.as_dict()} for label, s in self.models]
        return {**self.total.as_dict(), "models": per_model}


class SeveralModelsJob:
    def __init__(self, runs: list[ModelRun], options: BatchOptions, events: BatchEvents):
        self.runs, self.options, self.events = runs, options, events
        self.file_format = output_file_format(options.output_path, options.file_format)
        self.files = JobFiles.found(options.output_path, self.file_format)
        labels = [run.label for run in runs]
        for run, part in zip(
            runs, model_parts(options.output_path, labels, self.file_format), strict=True
        ):
            run.part = part
        self.live: list[BatchJob] = []  # the parts' jobs running now
        self.stopping: str | None = None  # why no more parts start (a signal, a budget)
        self.total = BatchSummary(options.input_path, options.output_path, task=runs[0].config.task)
        self.total.errors_path = str(self.files.errors)

    async def run(self) -> SeveralSummary:
        started = time.perf_counter()
        with OutputLock.take(self.files.lock, self.options.output_path):
            self._start_or_resume()
            loop = asyncio.get_running_loop()
            restore = install_stop_signals(loop, self._on_signal)
            try:
                for group in self._groups():
                    if self.stopping:
                        break
                    peers: list[Budget] = []  # side by side, the budgets are counted together
                    await asyncio.gather(*(self._run_part(i, group, peers) for i in group))
            finally:
                restore()
                self.total.wall_s = time.perf_counter() - started
                summary = self._summary()
                self._merge()
                self._write_summary(summary)
        return summary

    def _start_or_resume(self) -> None:
        """Refuse an output started with other models (each part checks its own settings);
        start over on --overwrite."""
        import shutil

        from lmpress.batch.model_parts import parts_folder

        settings = {"task": self.total.task, "models": [run.label for run in self.runs]}
        folder = parts_folder(self.options.output_path)
        if self.options.overwrite:
            self.files.remove_all()
            shutil.rmtree(folder, ignore_errors=True)
        elif self.files.output.exists() or self.files.fingerprint.exists() or folder.exists():
            check_fingerprint(self.files, settings)
            return
        write_fingerprint(self.files, settings, None)  # first: the record that the job began
        folder.mkdir(parents=True, exist_ok=True)

    def _groups(self) -> list[list[int]]:
        """The parts that run together: the remote models at once, then each local one."""
        remote = [i for i, r in enumerate(self.runs) if r.config.engine in REMOTE_ENGINES]
        local = [[i] for i, r in enumerate(self.runs) if r.config.engine not in REMOTE_ENGINES]
        return ([remote] if remote else []) + local

    async def _run_part(self, index: int, group: list[int], peers: list[Budget]) -> None:
        run = self.runs[index]
        assert run.part is not None
        options = self._part_options(run)
        if options is None:
            return
        options = dataclasses.replace(options, mode=batch_mode(run.config, options))
        check_mode(run.config, options.mode)
        events = PartEvents(self.events, run.label, alone=len(group) == 1)
        job = RUNNERS[options.mode]()(run.config, options, None, events)
        peers.append(job.budget)
        job.budget.peers = peers
        job.owns_signals = False  # this job's, so that one signal reaches every part
        names = [model_names(r.config, r.label) for r in self.runs if r is not run]
        others = set().union(*names) if names else set()
        job.line_models = LineModels(run.config, label=run.label, others=others, first=index == 0)
        self.live.append(job)
        try:
            run.summary = await job.run()
        finally:
            self.live.remove(job)
            if job.engine is not None:
                await job.engine.aclose()
        # A part that stopped (a signal, a budget, --on-error fail, an endpoint never
        # reached) stops the job: the next models would stop the same way.
        self.stopping = self.stopping or run.summary.stopped_because

    def _part_options(self, run: ModelRun) -> BatchOptions | None:
        """A part's options: its own output, no --overwrite (done for all at the start), and
        what is left of the budgets; None when nothing is."""
        assert run.part is not None
        max_cost, max_tokens = self._budget_left() or (None, None)
        if (max_cost is not None and max_cost <= 0) or (max_tokens is not None and max_tokens < 1):
            self.stopping = self.stopping or "the budget was spent by the models before"
            return None
        return dataclasses.replace(
            self.options, output_path=str(run.part.output), overwrite=False, recipe=run.label,
            max_cost=max_cost, max_tokens=max_tokens,
        )  # fmt: skip

    def _budget_left(self) -> tuple[float | None, int | None] | None:
        if self.options.max_cost is None and self.options.max_tokens is None:
            return None
        done = [r.summary for r in self.runs if r.summary is not None]
        cost = self.options.max_cost
        if cost is not None:
            cost -= sum(s.cost_usd or 0.0 for s in done)
        tokens = self.options.max_tokens
        if tokens is not None:
            tokens -= sum(s.prompt_tokens + s.completion_tokens for s in done)
        return cost, tokens

    def _on_signal(self, name: str) -> None:
        self.stopping = self.stopping or name
        self.total.interrupted, self.total.signal = True, name
        for job in list(self.live):
            job._on_interrupt(name)
        if not self.live:
            self.events.notice(f"stopped by {name}; re-run the same command to resume")

    def _summary(self) -> SeveralSummary:
        total = self.total
        models = []
        for run in self.runs:
            part = run.summary or BatchSummary(self.options.input_path, str(run.part.output))
            if run.summary is None:  # never started: a stop came first
                part.stopped_because = self.stopping
            models.append((run.label, part))
            for name in SUMMED:
                setattr(total, name, getattr(total, name) + getattr(part, name))
            if part.cost_usd is not None:
                total.cost_usd = (total.cost_usd or 0.0) + part.cost_usd
            total.stopped_because = total.stopped_because or part.stopped_because
            total.interrupted = total.interrupted or part.interrupted
            total.signal = total.signal or part.signal
        return SeveralSummary(total, models)

    def _merge(self) -> None:
        parts = [run.part for run in self.runs if run.part is not None]
        if self.file_format is FileFormat.PARQUET:
            merge_parquet(parts, self.files.output, self.files.errors)
        else:
            merge_jsonl(parts, self.files.output, self.files.errors)

    def _write_summary(self, summary: SeveralSummary) -> None:
        try:
            text = json.dumps(summary.as_dict(), indent=2) + "\n"
            write_text_atomically(self.files.summary, text)
        except OSError as exc:
            raise OutputWriteError(self.files.summary, exc) from exc


class PartEvents(BatchEvents):
    """A part's events, passed on to the job's with the model named; the progress bar only
    where one part runs at a time (two would draw over each other)."""

    def __init__(self, events: BatchEvents, label: str, alone: bool):
        self.events, self.label, self.alone = events, label, alone

    def started(self, summary: BatchSummary) -> None:
        self.events.notice(f"model {self.label}: {summary.rows_total} rows")
        if self.alone:
            self.events.started(summary)

    def notice(self, message: str) -> None:
        self.events.notice(f"[{self.label}] {message}")

    def interrupted(self) -> None:
        self.events.interrupted()

    def progressed(self, summary: BatchSummary) -> None:
        if self.alone:
            self.events.progressed(summary)

    def row_failed(self, failure: RowFailure) -> None:
        self.events.row_failed(
            dataclasses.replace(failure, message=f"[{self.label}] {failure.message}")
        )

    def finished(self, summary: BatchSummary) -> None:
        if self.alone:
            self.events.finished(summary)


async def run_several(
    runs: list[ModelRun], options: BatchOptions, events: BatchEvents | None = None
) -> SeveralSummary:
    """Run every picked row of the input through every model (see the module's docstring)."""
    return await SeveralModelsJob(runs, options, events or BatchEvents()).run()
