"""One `lmpress run`: the pipeline checked against the input's columns, the output locked, the
journal opened (cleared where steps changed), the steps run, and the outputs written from the
journal in key order: the dataset (JSONL, Parquet or a `save_to_disk` directory), the rejects,
each step's rows on request, and the dataset card.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmpress.vocabulary.errors import Terminated


@dataclass
class RunOptions:
    pipeline: str
    input: str
    output: str
    format: str = "jsonl"
    rerun_from: str | None = None
    limit: int | None = None
    keep_steps: bool = False
    cache: str = "on"
    max_cost: float | None = None  # USD, the whole pipeline's spend (`pipeline/budget.py`)
    command: str | None = None  # what made the run, for the card (default: this command line)


def run_pipeline(options: RunOptions) -> Any:
    """Run the pipeline; returns the facts the dataset card records (`card.CardFacts`)."""
    from lmpress.data.sources import open_source
    from lmpress.pipeline.export import dataset_format
    from lmpress.pipeline.spec import load_pipeline

    dataset_format(options.format)
    source = open_source(options.input)
    spec = load_pipeline(options.pipeline, first_columns(source))
    return run_spec(spec, source, options)


def run_spec(spec: Any, source: Any, options: RunOptions) -> Any:
    """Run a checked pipeline over an opened source: the part the file and the Python front
    (`pipeline/python.py`) share, so both keep the same journal, outputs and card."""
    from lmpress.data.output_lock import OutputLock
    from lmpress.pipeline.journal import Journal
    from lmpress.pipeline.models import Models

    rerun_from = None
    if options.rerun_from is not None:
        rerun_from = spec.steps.index(spec.step(options.rerun_from))
    models = Models(spec, options.cache)
    fingerprints, previous = [], ""
    for step in spec.steps:
        ref = spec.model_of(step)
        code = _code(spec, step)
        previous = step.fingerprint(models.identity(ref) if ref else None, previous, code)
        fingerprints.append((step.name, previous))
    budget = None
    if options.max_cost is not None:
        from lmpress.pipeline.budget import PipelineBudget

        budget = PipelineBudget.for_pipeline(options.max_cost, spec, models)
    out = Path(options.output)
    out.mkdir(parents=True, exist_ok=True)
    (out / ".lmpress").mkdir(exist_ok=True)
    with OutputLock.take(out / ".lmpress" / "lock", out):
        journal = Journal(out / ".lmpress" / "pipeline.sqlite")
        try:
            barriers = {s.name for s in spec.steps if s.kind == "dedupe"}
            cleared = journal.start(fingerprints, rerun_from, barriers)
            if cleared:
                print(f"lmpress: re-running steps {', '.join(cleared)}", file=sys.stderr)
            started = time.monotonic()
            tallies = _run_steps(spec, models, journal, source, options.limit, budget)
            journal.settle()
            seconds = round(time.monotonic() - started, 3)
            facts = _write_outputs(spec, models, journal, out, options, tallies, seconds)
            facts.stopped_because = budget.stopped_because if budget else None
        finally:
            journal.close()
    for step in facts.steps:
        print(
            f"lmpress: step {step.name}: {step.rows_in} in, {step.rows_out} out, "
            f"{sum(step.dropped.values())} dropped, {step.failed} failed",
            file=sys.stderr,
        )
    print(f"lmpress: wrote {facts.rows} rows to {out} in {facts.seconds} s", file=sys.stderr)
    if facts.stopped_because:
        print(f"lmpress: stopped: {facts.stopped_because}; re-run the same command to resume",
              file=sys.stderr)  # fmt: skip
    return facts


def _code(spec: Any, step: Any) -> str | None:
    """The digest of the code a step calls, for its fingerprint: a Python-front step's
    callables (its `code`), or the module a `function: module:function` lives in."""
    from lmpress.pipeline.expressions import function_digest

    if hasattr(type(step), "own_code"):  # on the class: a judge's settings are attributes
        return step.own_code()
    if getattr(step, "function", None):
        return function_digest(step.function, f"{spec.path}: step '{step.name}': function")
    return None


def first_columns(source: Any) -> set[str] | None:
    """The input's columns from its first row; None when it cannot be read ahead (a pipe) or
    has none (an empty input checks nothing)."""
    if source.stream:
        return None
    lines = source.lines()
    try:
        for line in lines:
            return set(line.value) if isinstance(line.value, dict) else None
    finally:
        close = getattr(lines, "close", None)
        if close is not None:
            close()
    return None


def _run_steps(spec: Any, models: Any, journal: Any, source: Any, limit: int | None,
               budget: Any = None) -> Any:  # fmt: skip
    from lmpress.pipeline.runner import Runner, numbered
    from lmpress.pipeline.steps import build_steps

    async def main() -> Any:
        stopped = False
        task = asyncio.current_task()
        assert task is not None

        def stop() -> None:
            nonlocal stopped
            stopped = True
            task.cancel()

        loop = asyncio.get_running_loop()
        previous = signal.getsignal(signal.SIGTERM)
        try:
            loop.add_signal_handler(signal.SIGTERM, stop)
            handled = True
        except (ValueError, RuntimeError, NotImplementedError):
            handled = False  # not the main thread (a Python caller's), or no signals here
        try:
            steps, rows = build_steps(spec, models), numbered(source.lines(), limit)
            if budget is not None:
                budget.watch(steps, models)
                rows = budget.gate(rows)
            runner = Runner(steps, journal)
            await runner.run(rows)
            return runner.tallies
        except asyncio.CancelledError:
            if stopped:
                raise Terminated from None
            raise
        finally:
            if handled:
                loop.remove_signal_handler(signal.SIGTERM)
                if previous is not None:  # None: set outside Python, not ours to put back
                    signal.signal(signal.SIGTERM, previous)
            await models.aclose()

    return asyncio.run(main())


def _write_outputs(spec: Any, models: Any, journal: Any, out: Path, options: RunOptions,
                   tallies: dict[str, Any], seconds: float) -> Any:  # fmt: skip
    from lmpress.pipeline.card import CardFacts, write_card
    from lmpress.pipeline.export import write_dataset

    names = [step.name for step in spec.steps]
    counted = _Counted(journal.rows(names[-1]))
    data = write_dataset(counted, out, options.format)
    _write_jsonl(out / "rejects.jsonl", journal.rejects(["input", *names]))
    if options.keep_steps:
        (out / "steps").mkdir(exist_ok=True)
        for name in names:
            _write_jsonl(out / "steps" / f"{name}.jsonl", journal.rows(name))
    facts = CardFacts(
        pipeline_path=str(options.pipeline),
        pipeline_text=spec.source,
        command=options.command or " ".join(["lmpress", *sys.argv[1:]]),
        data_path=data.name,
        data_format=options.format,
        rows=counted.count,
        steps=[_step_facts(spec, step, models, journal, tallies) for step in spec.steps],
        models=models.facts(),
        input_path=options.input,
        rejects_path="rejects.jsonl",
        seconds=seconds,
    )
    write_card(out, facts)
    return facts


def _step_facts(spec: Any, step: Any, models: Any, journal: Any, tallies: dict) -> Any:
    from lmpress.pipeline.card import StepFacts, step_cost

    counts = journal.tally(step.name)
    ref = spec.model_of(step)
    facts = StepFacts(name=step.name, kind=step.kind, seconds=tallies[step.name].seconds,
                      **counts)  # fmt: skip
    if ref is not None:
        config = models.config(ref)
        facts.model = models.name(ref)
        generation = getattr(step, "generation", {})
        facts.settings = {**config.generation.changed_fields(), **generation}
        facts.seed = facts.settings.get("seed")
        facts.cost_usd = step_cost(config, counts["prompt_tokens"], counts["completion_tokens"])
    return facts


class _Counted:
    """Rows passed through, counted: the dataset's size for the card, without a second read."""

    def __init__(self, rows: Any):
        self.rows = rows
        self.count = 0

    def __iter__(self) -> Any:
        for row in self.rows:
            self.count += 1
            yield row


def _write_jsonl(path: Path, rows: Any) -> int:
    """Rows to a JSONL file through a temporary one, so a file there is always whole."""
    count = 0
    partial = path.with_name(path.name + ".partial")
    with partial.open("w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
            count += 1
    partial.replace(path)
    return count
