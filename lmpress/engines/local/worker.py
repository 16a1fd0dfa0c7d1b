"""What the local engines share: one worker thread owns the model, callers queue requests
for it, and each request's deltas and final result travel back to the caller's event loop.

Every local engine has the same two parts. The engine class (a `WorkerEngine`) loads the model
and translates: it turns a request into its `Submission` in `_prepare` (tokenizing and checking
it there, so a bad row fails alone before it reaches the model). Its `scheduler` (a
`Scheduler`, built by the engine with what it needs) owns the backend loop: `run`, on the worker
thread, takes submissions from the `WorkQueue` the two share and answers them with
`Submission.deliver`. The two meet only there, so each can be read without the other. The
`CallerQueue` is the one way a local engine hands something back across threads (the VLLM
engine's own loop uses it too).

A reasoning model's replies (a `Submission` with `reasoning`, reasoning.py) are split into
thinking and answer here, alike for every local engine: each delta as it is handed back
(`Submission.deliver`), each result's samples in `Scheduler.result`.

No caller may wait on a request the worker can no longer answer: the engine keeps every
submission whose caller is still listening, and when an exception escapes `run` it fails each
one not yet answered and starts `run` again; when the worker ends (closed, or killed by
something worse than an Exception) it fails them with `engine_closed`. A scheduler that holds
backend state per request (KV sequences, samplers) frees it in `run` itself.
"""

from __future__ import annotations

import asyncio
import atexit
import dataclasses
import threading
import time
import weakref
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lmpress.configs.schema import RunConfig
from lmpress.engines.base import (
    Engine,
    Occupancy,
    check_adapter,
    check_text,
    error_result,
    failure_info,
)
from lmpress.vocabulary.errors import ErrorKind, RequestError
from lmpress.vocabulary.types import Delta, ErrorInfo, Request, Result, Sample, Usage

if TYPE_CHECKING:
    from lmpress.engines.local.reasoning import RequestReasoning
    from lmpress.vocabulary.reasoning import StreamSplitter

# A prompt longer than this (in characters) is prepared on a thread of its own: tokenizing
# 64k characters takes some tens of milliseconds, and a 4 MB prompt seconds, for which the
# caller's event loop (a server's other requests, its /health) would otherwise wait.
PREPARE_OFF_LOOP_CHARS = 64 * 1024


def prompt_chars(request: Request) -> int:
    """The characters of a request's prompt: its raw prompt or its messages' text."""
    if request.prompt is not None:
        return len(request.prompt)
    return sum(len(m.text()) for m in request.messages)


class CallerQueue:
    """A queue on the caller's event loop that any thread may put into: how a worker thread
    (or another event loop, or a pipe reader) hands deltas and results back to whoever awaits
    them. Made on the caller's loop, read there with `get`."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue = asyncio.Queue()

    def put(self, item: Any) -> bool:
        """Hand `item` to the caller, from any thread; False when the caller's loop is closed
        (nobody is listening any more)."""
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:
            return False
        return True

    async def get(self) -> Any:
        return await self._queue.get()


@dataclass(eq=False)  # compared and hashed by identity
class Submission:
    """One request handed to the worker thread, and the way back to whoever awaits it."""

    request: Request
    prompt_ids: list[int]
    started: float
    replies: CallerQueue | None = None
    wants_deltas: bool = True
    # Set when the caller stops listening (finished, cancelled or gone): the worker drops
    # the request and frees what it holds.
    cancelled: bool = False
    answered: bool = False  # its Result was handed back
    # The grammar its samples follow (guided decoding, a required tool call); each sample
    # gets a copy.
    matcher: Any = None
    tool_plan: Any = None  # a request with tools: how its calls are read from the text
    # generation.bad_words as token sequences (lmpress/engines/local/bad_words.py).
    bad_words: list[list[int]] = field(default_factory=list)
    # A prompt with images: what the model takes with its ids to prefill it (NATIVE: the
    # processor's pixel_values and the like). None for text.
    media: Any = None
    # A reasoning model's request: how its replies think. Its deltas are split here into
    # thinking and answer, one splitter per sample; its result in `Scheduler.result`.
    reasoning: RequestReasoning | None = None
    _splitters: dict[int, StreamSplitter] = field(default_factory=dict)

    def deliver(self, item: Delta | Result) -> None:
        """Hand a delta or the result to the caller; safe to call from any thread."""
        if isinstance(item, Result):
            if self.answered:
                return  # a request gets one Result, however its step failed
            self.answered = True
            for index, splitter in self._splitters.items():  # what each one held back
                self._put_split(item.request_id, index, splitter.flush())
        elif self.reasoning is not None:
            splitter = self._splitters.get(item.index)
            if splitter is None:
                splitter = self._splitters[item.index] = self.reasoning.splitter()
            self._put_split(item.request_id, item.index, splitter.feed(item.text))
            return
        self._put(item)

    def _put_split(self, request_id: str, index: int, pieces: tuple[str, str]) -> None:
        """A sample's new thinking, then its new answer, each as a delta when there is any."""
        thinking, answer = pieces
        if thinking:
            self._put(Delta(request_id, thinking, index, reasoning=True))
        if answer:
            self._put(Delta(request_id, answer, index))

    def _put(self, item: Delta | Result) -> None:
        if not self.replies.put(item):
            self.cancelled = True


class WorkQueue:
    """What an engine and its scheduler share: the submissions waiting for the worker
    (`pending`), the condition both sides wait on and signal (`wakeup`, which guards the other
    two), and `closed`, set once the worker must stop or has stopped."""

    def __init__(self) -> None:
        self.pending: deque[Submission] = deque()
        self.wakeup = threading.Condition()
        self.closed = False


class Scheduler(ABC):
    """A local engine's backend loop, run on the worker thread (see the module docstring)."""

    def __init__(self, queue: WorkQueue, engine: Engine):
        self.queue = queue
        self.engine = engine  # whose name and model label the results

    @abstractmethod
    def run(self) -> None:
        """Serve `queue.pending` until `queue.closed`."""

    def fail(self, submissions: list[Submission], info: ErrorInfo) -> None:
        """Answer these submissions with `info`."""
        for submission in submissions:
            submission.deliver(
                error_result(submission.request, self.engine, info, submission.started)
            )

    def result(self, submission: Submission, samples: list[Sample]) -> Result:
        """A submission's answer: its samples (a reasoning model's thinking apart from its
        answer), counted and labelled with the engine."""
        if submission.reasoning is not None:
            samples = [submission.reasoning.split(sample) for sample in samples]
        completion = sum(sample.completion_tokens for sample in samples)
        thought = sum(sample.reasoning_tokens for sample in samples)
        return Result(
            request_id=submission.request.id,
            samples=samples,
            usage=Usage(len(submission.prompt_ids), completion, thought),
            model=self.engine.model_name,
            engine=self.engine.name,
            latency_s=time.perf_counter() - submission.started,
        )


# Engines whose worker still runs. A script that never closes its engine must still exit
# cleanly: a daemon worker left inside the backend while the interpreter tears down can take
# the process down with it (`terminate called without an active exception`, exit 134).
_running: weakref.WeakSet[WorkerEngine] = weakref.WeakSet()


@atexit.register
def _stop_forgotten_workers() -> None:
    for engine in list(_running):
        engine._stop_worker_now()


class WorkerEngine(Engine):
    """An engine whose model is driven by one worker thread (see the module docstring)."""

    scheduler: Scheduler

    def __init__(self, config: RunConfig):
        super().__init__(config)
        self._queue = WorkQueue()
        self._stopping = False
        self._live: set[Submission] = set()  # queued, and the caller still listening
        # Where a prompt with images or a long prompt is prepared: decoding and resizing its
        # images, or tokenizing it, takes long enough to hold up every other request (and a
        # server's /health) on the event loop. One thread: such prompts queue for it in turn.
        self._prepare_thread = ThreadPoolExecutor(1, thread_name_prefix=f"{self.name}-prepare")

    def _start_worker(self, scheduler: Scheduler, thread_name: str) -> None:
        """Run `scheduler` on a worker thread of its own, from now until the engine closes."""
        self.scheduler = scheduler
        self._worker = threading.Thread(target=self._worker_main, name=thread_name, daemon=True)
        self._worker.start()
        _running.add(self)

    @abstractmethod
    def _prepare(self, request: Request, started: float) -> Submission:
        """The request as the worker will take it; raises RequestError for a bad request."""

    def _worker_main(self) -> None:
        queue = self._queue
        try:
            while True:
                try:
                    self.scheduler.run()
                    return
                except Exception as exc:  # fail what the worker held, then serve on
                    self._fail_held(failure_info(exc))
        finally:
            with queue.wakeup:
                queue.closed = True
            self._fail_held(
                ErrorInfo(ErrorKind.ENGINE_CLOSED, f"the {self.name} engine was closed")
            )

    def _fail_held(self, info: ErrorInfo) -> None:
        """Answer every request still waiting on the worker with `info`."""
        with self._queue.wakeup:
            held = [s for s in self._live if not s.answered]
            self._queue.pending.clear()
        self.scheduler.fail(held, info)

    async def stream(self, request: Request) -> AsyncIterator[Delta | Result]:
        submission = await self._checked(request, time.perf_counter())
        if isinstance(submission, Result):
            yield submission
            return
        # A reply that may be a tool call is not streamed as text: its calls come whole.
        submission.wants_deltas = submission.tool_plan is None
        self._enqueue(submission)
        try:
            while True:
                item = await self._next_reply(submission, deltas=True)
                yield item
                if isinstance(item, Result):
                    return
        finally:
            self._withdraw(submission)

    def occupancy(self) -> Occupancy:
        """Running: what the worker holds and has not answered. One it answered counts no
        more, though its caller has yet to take the answer: the worker may already run the
        next one in its place, and a batch of one would show two running.

        No lock, so a scrape never waits on a step: len() of the deque and a copy of the set
        are atomic. `pending` is read first; `_live` gains submissions only on the event loop,
        where this is called, and the worker only takes from `pending` meanwhile, so the count
        can fall short for a moment, never run over the batch."""
        waiting = len(self._queue.pending)
        unanswered = sum(not submission.answered for submission in tuple(self._live))
        return Occupancy(running=max(0, unanswered - waiting), waiting=waiting)

    async def complete(self, request: Request) -> Result:
        (result,) = await self.complete_together([request])
        return result

    async def _stop_worker(self) -> bool:
        """Stop the worker and wait for it; False when it was already stopped."""
        if not self._ask_worker_to_stop():
            return False
        await asyncio.to_thread(self._worker.join)
        return True

    def _ask_worker_to_stop(self) -> bool:
        queue = self._queue
        with queue.wakeup:
            if self._stopping:
                return False
            self._stopping = True  # not `closed`, which a dying worker sets too
            queue.closed = True
            queue.wakeup.notify_all()
        _running.discard(self)
        self._prepare_thread.shutdown(wait=False)  # its thread goes once any prepare in hand ends
        return True

    def _stop_worker_now(self, wait_s: float = 10.0) -> None:
        """At interpreter exit: let the worker finish its step and return."""
        if self._ask_worker_to_stop():
            self._worker.join(wait_s)

    async def complete_together(self, requests: list[Request]) -> list[Result]:
        """Each request prepared first, then all queued at once: the worker takes them under
        one hold of the queue, so in the same round (Engine.complete_together)."""
        started = time.perf_counter()
        checked = [await self._checked(request, started) for request in requests]
        submissions = [s for s in checked if not isinstance(s, Result)]
        for submission in submissions:
            submission.wants_deltas = False
        self._enqueue(*submissions)
        try:
            answers = iter(
                await asyncio.gather(*(self._next_reply(s, deltas=False) for s in submissions))
            )
        finally:
            for submission in submissions:
                self._withdraw(submission)
        return [c if isinstance(c, Result) else next(answers) for c in checked]

    async def _checked(self, request: Request, started: float) -> Submission | Result:
        """The request as the worker will take it, or the Result that fails it alone."""
        if self._queue.closed:  # before _prepare, which may call into a backend already freed
            raise RuntimeError(f"the {self.name} engine is closed")
        try:
            check_text(request)
            check_adapter(self, request)
            return await self._prepared(request, started)
        except RequestError as exc:
            return error_result(request, self, ErrorInfo(exc.kind, str(exc), exc.status), started)
        except Exception as exc:  # whatever the backend met in this request fails it alone
            return error_result(request, self, failure_info(exc), started)

    async def _next_reply(self, submission: Submission, deltas: bool) -> Delta | Result:
        """The submission's next reply: a Delta where `deltas`, else its Result."""
        while True:
            item = await submission.replies.get()
            if isinstance(item, Delta) and not deltas:
                continue
            if isinstance(item, Result) and submission.tool_plan is not None and item.ok:
                item = dataclasses.replace(
                    item, samples=[submission.tool_plan.read(s) for s in item.samples]
                )
            return item

    async def _prepared(self, request: Request, started: float) -> Submission:
        """`_prepare`, on the prepare thread for a prompt with images or a long one."""
        with_images = any(message.has_images() for message in request.messages)
        if not with_images and prompt_chars(request) <= PREPARE_OFF_LOOP_CHARS:
            return self._prepare(request, started)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._prepare_thread, self._prepare, request, started)

    async def _answer(self, submission: Any) -> Any:
        """Queue a submission answered whole (an embedding, a score: no deltas) and return its
        answer. The submission has `replies`, `cancelled` and `answered` as `Submission` does,
        and the scheduler's `fail` knows how to answer it with an error."""
        self._enqueue(submission)
        try:
            return await submission.replies.get()
        finally:
            self._withdraw(submission)

    def _enqueue(self, *submissions: Any) -> None:
        for submission in submissions:
            submission.replies = CallerQueue()
        queue = self._queue
        with queue.wakeup:
            if queue.closed:
                raise RuntimeError(f"the {self.name} engine is closed")
            queue.pending.extend(submissions)
            self._live.update(submissions)
            queue.wakeup.notify()

    def _withdraw(self, submission: Any) -> None:
        """The caller stopped listening: the worker drops the submission if it still holds it."""
        with self._queue.wakeup:
            submission.cancelled = True
            self._live.discard(submission)
            self._queue.wakeup.notify()
