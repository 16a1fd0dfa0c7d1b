"""What every batch API lmpress drives shares (`apis` has the table of them): the lifecycle a
job calls (`BatchAPI`: a request's line, a chunk's submission, a batch's progress and results,
cancelling), a lifecycle call retried as the live engine retries a request, and the words a
batch's state and each row's outcome are given in.
"""

from __future__ import annotations

import asyncio
import random
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

from lmpress.batch.provider.state import BatchState, Chunk
from lmpress.vocabulary.embeddings import EmbedRequest
from lmpress.vocabulary.errors import ErrorKind, InputError
from lmpress.vocabulary.types import Request, Result
from lmpress.wire.replies import EmbedReply, Reply

AnyRequest = Request | EmbedRequest  # what a batch line can carry (`BatchApi.tasks`)

# Anthropic's custom_id rule; OpenAI takes any string, but one rule keeps ids portable.
SAFE_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
EXPIRED = "expired"  # a row the batch did not run: expired or cancelled
WINDOW = "24h"  # the completion window when the recipe sets none (--provider-batch)


@dataclass
class Progress:
    status: str  # the provider's own word: validating, in_progress, finalizing, ended, ...
    ended: bool
    done: int
    failed: int
    total: int
    expires_at: float | None = None
    refused: str | None = None  # why the provider refused the whole batch (validation)


@dataclass
class Outcome:
    reply: Reply | EmbedReply | None = None  # a generated (or embedded) row
    status: int | None = None  # a failed row's HTTP status
    message: str = ""  # a failed row's error, or why it did not run
    expired: bool = False  # not run: expired or cancelled with its batch


class LiveEngine(Protocol):
    """What a batch API uses of the live remote engine it runs beside (engines/remote/base.py's
    RemoteEngine answers it): its SDK client, its request bodies (each API's module calls the
    builders its provider's engine has), its retry rule and its results, so that a row through a
    batch API is sent and written as the live engine sends and writes it."""

    name: str
    remote: Any  # the recipe's remote_params: retries and timeouts
    redactor: Any  # hides the API key in an error message

    def client_for_loop(self) -> Any: ...

    def classify_failure(self, exc: BaseException) -> Any: ...

    def status_kind(self, status: int) -> ErrorKind: ...

    def result_of(self, request: Request, reply: Reply, started: float) -> Result: ...

    def embed_result_of(self, request: EmbedRequest, outcome: Any, started: float) -> Any: ...


def custom_id(row_id: str) -> str:
    """The row's id where it fits every provider's custom_id rule, else a stable hash of it."""
    if SAFE_ID.match(row_id):
        return row_id
    import hashlib

    return "h-" + hashlib.blake2b(row_id.encode(), digest_size=16).hexdigest()


class BatchAPI:
    def __init__(self, engine: LiveEngine, window: str):
        self.engine = engine
        self.window = window
        self.client = self._make_client()

    def _make_client(self) -> Any:
        """The SDK client the lifecycle calls go through: the live engine's own, by default."""
        return self.engine.client_for_loop()

    async def call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """One lifecycle call, retried as the live engine retries a request: 429, 5xx and
        dropped connections back off and try again; anything else ends the job's run here."""
        return await self._retrying(what, lambda: fn(*args, **kwargs))

    async def create_once(self, what: str, create: Any, find: Any) -> str:
        """Create a batch, retrying as `call` does, but never blindly: a create whose answer
        was lost (a 5xx, a dropped connection) may have made the batch, so before each retry
        the provider's list is searched for it (`find`), and a batch found is taken."""
        return await self._retrying(what, lambda: self._batch_id(create()), find)

    async def _retrying(self, what: str, attempt: Any, find: Any = None) -> Any:
        remote = self.engine.remote
        for tries in range(remote.max_retries + 1):
            try:
                return await attempt()
            except Exception as exc:
                failure = self.engine.classify_failure(exc)
                if not failure.retryable or tries == remote.max_retries:
                    detail = self.engine.redactor(failure.message)
                    raise InputError(f"{self.engine.name} batch API, {what}: {detail}") from exc
                if find is not None and (made := await find()):
                    return made
                wait = failure.retry_after or min(
                    remote.retry_backoff_max, remote.retry_backoff_base * 2**tries
                )
                await asyncio.sleep(wait * (0.5 + random.random() / 2))
        raise AssertionError("unreachable")

    async def _batch_id(self, created: Any) -> str:
        """The id of the batch a create call made, from the SDK's answer."""
        return (await created).id

    async def aclose(self) -> None:
        """Close a client of the batch API's own (the live engine closes its own)."""

    async def endpoint(self, request: AnyRequest) -> str:
        raise NotImplementedError

    async def line(self, cid: str, request: AnyRequest) -> str:
        raise NotImplementedError

    async def submit(self, state: BatchState, chunk: Chunk) -> str:
        raise NotImplementedError

    async def progress(self, batch_id: str) -> Progress:
        raise NotImplementedError

    def results(self, batch_id: str) -> AsyncIterator[tuple[str, Outcome]]:
        raise NotImplementedError

    async def cancel(self, batch_id: str) -> None:
        raise NotImplementedError
