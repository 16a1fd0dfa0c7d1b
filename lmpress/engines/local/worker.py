"""What the local engines share: one worker thread owns the model, callers queue requests
for it, and each request's deltas and final result travel back to the caller's event loop.

A local engine subclasses `WorkerEngine`, turns a request into its `Submission` in
`_prepare` (tokenizing and checking it there, so a bad row fails alone before it reaches the
model) and runs its own scheduling loop in `_run` on the worker thread, taking submissions
from `_pending` under `_wakeup` and answering them with `Submission.deliver`. Its
`CallerQueue` is the one way a local engine hands something back across threads (the VLLM
engine's own loop uses it too).

No caller may wait on a request the worker can no longer answer: the base keeps every
submission whose caller is still listening, and when an exception escapes `_run` it fails each
one not yet answered and starts `_run` again; when the worker ends (closed, or killed by
something worse than an Exception) it fails them with `engine_closed`. An engine that holds
backend state per request (KV sequences, samplers) frees it in `_run` itself.
"""

from __future__ import annotations

import asyncio
import atexit
import dataclasses
import threading
import time
import weakref
from abc import abstractmethod
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from lmpress.engines.base import Engine, check_text, error_result, failure_info
from lmpress.vocabulary.errors import ErrorKind, RequestError
from lmpress.vocabulary.types import Delta, ErrorInfo, Request, Result


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
    # A prompt with images: what the model takes with its ids to prefill it (NATIVE: the
    # processor's pixel_values and the like). None for text.
    media: Any = None

    def deliver(self, item: Delta | Result) -> None:
        """Hand a delta or the result to the caller; safe to call from any thread."""
        if isinstance(item, Result):
            if self.answered:
                return  # a request gets one Result, however its step failed
            self.answered = True
        if not self.replies.put(item):
            self.cancelled = True


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

    def _start_worker(self, thread_name: str) -> None:
        self._pending: deque[Submission] = deque()
        self._wakeup = threading.Condition()
        self._closed = False
        self._stopping = False
        self._live: set[Submission] = set()  # queued, and the caller still listening
        self._worker = threading.Thread(target=self._worker_main, name=thread_name, daemon=True)
        self._worker.start()
        _running.add(self)

    @abstractmethod
    def _prepare(self, request: Request, started: float) -> Submission:
        """The request as the worker will take it; raises RequestError for a bad request."""

    @abstractmethod
    def _run(self) -> None:
        """The worker thread: serve `_pending` until `_closed`."""

    def _worker_main(self) -> None:
        try:
            while True:
                try:
                    self._run()
                    return
                except Exception as exc:  # fail what the worker held, then serve on
                    self._fail_held(failure_info(exc))
        finally:
            with self._wakeup:
                self._closed = True
            self._fail_held(
                ErrorInfo(ErrorKind.ENGINE_CLOSED, f"the {self.name} engine was closed")
            )

    def _fail_held(self, info: ErrorInfo) -> None:
        """Answer every request still waiting on the worker with `info`."""
        with self._wakeup:
            held = [s for s in self._live if not s.answered]
            self._pending.clear()
        self._fail(held, info)

    def _fail(self, submissions: list[Submission], info: ErrorInfo) -> None:
        for submission in submissions:
            submission.deliver(error_result(submission.request, self, info, submission.started))

    def stream(self, request: Request) -> AsyncIterator[Delta | Result]:
        return self._submit(request, deltas=True)

    async def complete(self, request: Request) -> Result:
        result = None
        async for item in self._submit(request, deltas=False):
            result = item
        assert isinstance(result, Result)
        return result

    async def _stop_worker(self) -> bool:
        """Stop the worker and wait for it; False when it was already stopped."""
        if not self._ask_worker_to_stop():
            return False
        await asyncio.to_thread(self._worker.join)
        return True

    def _ask_worker_to_stop(self) -> bool:
        with self._wakeup:
            if self._stopping:
                return False
            self._stopping = True  # not `_closed`, which a dying worker sets too
            self._closed = True
            self._wakeup.notify_all()
        _running.discard(self)
        return True

    def _stop_worker_now(self, wait_s: float = 10.0) -> None:
        """At interpreter exit: let the worker finish its step and return."""
        if self._ask_worker_to_stop():
            self._worker.join(wait_s)

    async def _submit(self, request: Request, deltas: bool) -> AsyncIterator[Delta | Result]:
        started = time.perf_counter()
        if self._closed:  # before _prepare, which may call into a backend already freed
            raise RuntimeError(f"the {self.name} engine is closed")
        try:
            check_text(request)
            submission = self._prepare(request, started)
        except RequestError as exc:
            yield error_result(request, self, ErrorInfo(exc.kind, str(exc), exc.status), started)
            return
        except Exception as exc:  # whatever the backend met in this request fails it alone
            yield error_result(request, self, failure_info(exc), started)
            return
        submission.replies = CallerQueue()
        # A reply that may be a tool call is not streamed as text: its calls come whole.
        submission.wants_deltas = deltas and submission.tool_plan is None
        with self._wakeup:
            if self._closed:
                raise RuntimeError(f"the {self.name} engine is closed")
            self._pending.append(submission)
            self._live.add(submission)
            self._wakeup.notify()
        try:
            while True:
                item = await submission.replies.get()
                if isinstance(item, Delta) and not deltas:
                    continue
                if isinstance(item, Result) and submission.tool_plan is not None and item.ok:
                    item = dataclasses.replace(
                        item, samples=[submission.tool_plan.read(s) for s in item.samples]
                    )
                yield item
                if isinstance(item, Result):
                    return
        finally:
            with self._wakeup:
                submission.cancelled = True
                self._live.discard(submission)
                self._wakeup.notify()
