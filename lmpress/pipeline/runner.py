"""The streaming runner: every step a stage, all run as one group of asyncio tasks (one that
fails stops all), a bounded queue between each two, so a row goes on the moment its step
finishes it, the steps overlap, and memory stays flat whatever the input's size (a full queue
makes the stage before it wait).

Each stage keeps up to its step's `concurrency` rows in flight. For each row it first asks the
journal: a row this step finished from the same input is re-emitted without running the step;
any other runs, and its outcome is journaled (one transaction) before its rows go on. A dedupe
is a barrier: it waits for all its input, then decides in key order, so what it keeps does not
depend on timing; it is decided again on each run (its journal cleared), from its input, which
it reads back from the journal rather than holding it.

Keys: an input row's key is its index, zero-padded to 9 digits; a step that can fan out gives
each row it makes the input's key + "/" + its index padded to 4. String order is input order.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from lmpress.pipeline.journal import Journal, digest, dumps
from lmpress.pipeline.steps.base import Outcome, Step
from lmpress.vocabulary.types import Usage

DONE = None  # what a stage puts in its outbox when its input is over
QUEUE_FLOOR = 16  # rows a queue holds at least, so a fast stage is not stalled row by row


def input_key(index: int) -> str:
    return f"{index:09d}"


def child_key(key: str, index: int) -> str:
    return f"{key}/{index:04d}"


@dataclass
class Tally:
    """One step's counts in this run, for the progress lines and the summary."""

    rows_in: int = 0
    rows_out: int = 0
    dropped: int = 0
    failed: int = 0
    replayed: int = 0  # rows answered from the journal
    usage: Usage = field(default_factory=Usage)
    first_in: float | None = None  # monotonic times: the step's first row in, last row out
    last_out: float | None = None

    @property
    def seconds(self) -> float:
        if self.first_in is None or self.last_out is None:
            return 0.0
        return round(self.last_out - self.first_in, 3)

    def line(self, name: str) -> str:
        replayed = f", {self.replayed} from the journal" if self.replayed else ""
        rate = ""
        if self.first_in is not None and self.rows_in:
            rate = f", {self.rows_in / max(time.monotonic() - self.first_in, 1e-3):.1f} rows/s"
        return (
            f"step {name}: {self.rows_in} in, {self.rows_out} out, {self.dropped} dropped, "
            f"{self.failed} failed{replayed}{rate}"
        )


class Runner:
    def __init__(self, steps: list[Step], journal: Journal, progress_s: float = 5.0):
        self.steps = steps
        self.journal = journal
        self.tallies = {step.name: Tally() for step in steps}
        self.progress_s = progress_s

    async def run(self, rows: Iterable[tuple[str, dict[str, Any] | None, str | None]]) -> None:
        """Run every step over `rows`: (key, row, or why the input line cannot be read)."""
        queues = [asyncio.Queue(maxsize=max(QUEUE_FLOOR, 2 * s.concurrency)) for s in self.steps]
        queues.append(asyncio.Queue(maxsize=QUEUE_FLOOR))
        stages = [self._source(rows, queues[0])]
        for index, step in enumerate(self.steps):
            if step.barrier:
                before = self.steps[index - 1].name if index else None
                stages.append(self._barrier(step, queues[index], queues[index + 1], before))
            else:
                stages.append(self._stage(step, queues[index], queues[index + 1]))
        stages.append(self._sink(queues[-1]))
        ticker = asyncio.create_task(self._ticker())
        try:
            await all_or_none([asyncio.create_task(stage) for stage in stages])
        finally:
            ticker.cancel()

    async def _source(self, rows: Iterable, outbox: asyncio.Queue) -> None:
        for key, row, error in rows:
            if error is not None:
                self.journal.finish("input", key, "", [], ("failed", error, "null"), None)
                continue
            await outbox.put((key, row))
        await outbox.put(DONE)

    async def _stage(self, step: Step, inbox: asyncio.Queue, outbox: asyncio.Queue) -> None:
        slots = asyncio.Semaphore(step.concurrency)
        rows: set[asyncio.Task] = set()
        try:
            while (item := await inbox.get()) is not DONE:
                await slots.acquire()
                _raise_failed(rows)
                rows.add(asyncio.create_task(self._one(step, *item, outbox, slots)))
            await all_or_none(list(rows))
        finally:
            for task in rows:
                task.cancel()
        await outbox.put(DONE)

    async def _barrier(self, step: Step, inbox: asyncio.Queue, outbox: asyncio.Queue,
                       before: str | None) -> None:  # fmt: skip
        """Wait for all the input, then decide it in key order. The input is read back from
        the journal (what the step `before` emitted in this run), not held, so memory stays
        flat at any size; only a first step's input, which nothing journals, is held."""
        held, tally = [], self.tallies[step.name]
        while (item := await inbox.get()) is not DONE:
            tally.rows_in += 1
            if tally.first_in is None:
                tally.first_in = time.monotonic()
            if before is None:
                held.append(item)
        if before is None:
            items: Iterable[tuple[str, dict[str, Any]]] = sorted(held, key=lambda i: i[0])
        else:
            items = self.journal.keyed_rows(before)
        async for key, row, outcome in step.run_all(items):
            out = self._record(step, key, row, digest(row), outcome)
            tally.rows_out += len(out)
            for item in out:
                await outbox.put(item)
        tally.last_out = time.monotonic()
        await outbox.put(DONE)

    async def _one(self, step: Step, key: str, row: dict[str, Any], outbox: asyncio.Queue,
                   slots: asyncio.Semaphore | None) -> None:  # fmt: skip
        tally = self.tallies[step.name]
        tally.rows_in += 1
        if tally.first_in is None:
            tally.first_in = time.monotonic()
        try:
            row_digest = digest(row)
            out = self.journal.replay(step.name, key, row_digest)
            if out is not None:
                tally.replayed += 1
            else:
                out = self._record(step, key, row, row_digest, await step.run(key, row))
            tally.rows_out += len(out)
            for item in out:
                await outbox.put(item)
            tally.last_out = time.monotonic()
        finally:
            # Held until the rows are handed on: a stage whose next one is slow waits with
            # `concurrency` rows at most, so memory stays flat however far behind it falls.
            if slots is not None:
                slots.release()

    def _record(self, step: Step, key: str, row: dict[str, Any], row_digest: str,
                outcome: Outcome) -> list[tuple[str, dict]]:  # fmt: skip
        """Journal one row's outcome; the rows that go on, keyed."""
        tally = self.tallies[step.name]
        if outcome.usage is not None:
            tally.usage = Usage.summed([tally.usage, outcome.usage])
        keyed = [
            (child_key(key, i) if step.fans_out else key, new) for i, new in enumerate(outcome.rows)
        ]
        reject = None
        try:
            texts = [(out_key, dumps(new)) for out_key, new in keyed]
        except (TypeError, ValueError) as exc:
            keyed, texts = [], []
            outcome = Outcome(error=f"a row JSON cannot hold ({exc})")
        if outcome.error is not None:
            keyed, texts, reject = [], [], ("failed", outcome.error, dumps(row))
            tally.failed += 1
        elif outcome.dropped is not None:
            keyed, texts, reject = [], [], ("dropped", outcome.dropped, dumps(row))
            tally.dropped += 1
        self.journal.finish(step.name, key, row_digest, texts, reject, outcome.usage)
        return keyed

    async def _sink(self, inbox: asyncio.Queue) -> None:
        while await inbox.get() is not DONE:
            pass

    async def _ticker(self) -> None:
        """A progress line per step every few seconds, when its counts moved."""
        shown: dict[str, str] = {}
        while True:
            await asyncio.sleep(self.progress_s)
            for name, tally in self.tallies.items():
                line = tally.line(name)
                if shown.get(name) != line:
                    print(f"lmpress: {line}", file=sys.stderr, flush=True)
                    shown[name] = line


async def all_or_none(tasks: list[asyncio.Task]) -> None:
    """Wait for every task; the first to fail cancels the rest and its exception is raised
    (asyncio.TaskGroup's rule, which Python 3.10 lacks), as is a cancellation of this wait."""
    if not tasks:
        return
    try:
        done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    finally:
        for task in tasks:
            task.cancel()
    if pending:
        await asyncio.wait(pending)
    for task in done:
        if not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]


def _raise_failed(tasks: set[asyncio.Task]) -> None:
    """Forget the finished row tasks, raising the first that failed (a bug, not a row's
    failure: those are Outcomes)."""
    for task in [t for t in tasks if t.done()]:
        tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]


def numbered(lines: Iterable[Any], limit: int | None) -> Iterable[tuple[str, Any, str | None]]:
    """The input's rows keyed by index (`data.jsonl.Line`s: a value, or why not)."""
    for index, line in enumerate(lines):
        if limit is not None and index >= limit:
            return
        if line.error is not None:
            yield input_key(index), None, line.error
        elif not isinstance(line.value, dict):
            yield input_key(index), None, f"a row is an object of columns, got {line.value!r:.40}"
        else:
            yield input_key(index), line.value, None
