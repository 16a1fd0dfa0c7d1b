"""NATIVE's scheduler for the pooling tasks: batches of whatever inputs are waiting, on the
worker thread.

Each request (its inputs already token rows, encoders.py) is one `PoolingSubmission`; the
scheduler pools the rows of every submission waiting, sorts them by length and runs the longest
first, at most `batch_size` rows and `BATCH_TOKENS` padded tokens at once, and no row shorter
than half the batch's longest: so no row is padded to more than twice its length (a batch
does not mix a few long rows with many short ones) and memory stays flat however many rows
wait. Longest first, so a long row never waits behind an endless stream of short ones. A submission is
answered once all its rows are: with one output per row, in order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lmpress.engines.base import Engine
from lmpress.engines.local.native.encoders import Encoder, EncoderRow
from lmpress.engines.local.worker import CallerQueue, Scheduler, WorkQueue
from lmpress.vocabulary.types import ErrorInfo

# Padded tokens in one forward pass (rows x the longest row): on MiniLM that is 16384 tokens'
# activations, a few hundred MB at most, whatever the batch size. A row longer than this
# still runs, alone.
BATCH_TOKENS = 16384


@dataclass(eq=False)  # compared and hashed by identity
class PoolingSubmission:
    """One request's rows handed to the worker; its answer is a list with one output per row
    (a vector, or a cross-encoder's score), or the ErrorInfo that failed it."""

    rows: list[EncoderRow]
    started: float
    outputs: list[Any] = field(default_factory=list)
    done: int = 0  # rows answered
    replies: CallerQueue | None = None
    cancelled: bool = False  # the caller stopped listening
    answered: bool = False

    def deliver(self, answer: list[Any] | ErrorInfo) -> None:
        if self.answered:
            return
        self.answered = True
        if not self.replies.put(answer):
            self.cancelled = True


class PoolingScheduler(Scheduler):
    def __init__(self, queue: WorkQueue, engine: Engine, encoder: Encoder, batch_size: int):
        super().__init__(queue, engine)
        self.encoder = encoder
        self.batch_size = batch_size

    def run(self) -> None:
        queue = self.queue
        # (submission, row index), shortest first: the next batch is taken off the end, so a
        # batch costs its own rows, not a pass over every row waiting (10,000 rows make
        # 300 batches).
        waiting: list[tuple[PoolingSubmission, int]] = []
        holding: set[PoolingSubmission] = set()  # submissions with rows in `waiting`
        while True:
            with queue.wakeup:
                while not queue.pending and not waiting and not queue.closed:
                    queue.wakeup.wait()
                if queue.closed:
                    return
                arrived = bool(queue.pending)
                while queue.pending:
                    submission = queue.pending.popleft()
                    submission.outputs = [None] * len(submission.rows)
                    waiting += [(submission, i) for i in range(len(submission.rows))]
                    holding.add(submission)
            if any(s.cancelled for s in holding):
                waiting = [(s, i) for s, i in waiting if not s.cancelled]
                holding = {s for s in holding if not s.cancelled}
            if not waiting:
                continue
            if arrived:
                waiting.sort(key=lambda item: len(item[0].rows[item[1]].ids))
            batch = self.next_batch(waiting)
            del waiting[len(waiting) - len(batch) :]
            outputs = self.encoder.forward([s.rows[i] for s, i in batch])
            for (submission, i), output in zip(batch, outputs, strict=True):
                submission.outputs[i] = output
                submission.done += 1
                if submission.done == len(submission.rows):
                    submission.deliver(submission.outputs)
                    holding.discard(submission)

    def next_batch(
        self, waiting: list[tuple[PoolingSubmission, int]]
    ) -> list[tuple[PoolingSubmission, int]]:
        """The last rows of `waiting` (sorted shortest first) that make the next batch,
        longest first."""
        longest = len(waiting[-1][0].rows[waiting[-1][1]].ids)
        most = max(1, min(self.batch_size, BATCH_TOKENS // longest))
        taken = 1
        while taken < min(most, len(waiting)):
            submission, i = waiting[-1 - taken]
            if 2 * len(submission.rows[i].ids) < longest:
                break
            taken += 1
        return waiting[: -taken - 1 : -1]

    def fail(self, submissions: list[Any], info: ErrorInfo) -> None:
        for submission in submissions:
            submission.deliver(info)
