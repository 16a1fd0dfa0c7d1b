"""The ASGI plumbing of `lmpress serve`: a response that runs a generation and cancels it when
the client goes away, an event stream, and the middleware for API keys and request logs."""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse
from starlette.responses import Response as StarletteResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from lmpress.vocabulary.errors import ErrorKind
from lmpress.vocabulary.types import Usage
from lmpress.wire.anthropic.server import MESSAGES_PATH, anthropic_error
from lmpress.wire.openai.errors import ApiError

log = logging.getLogger("lmpress.serve")

# The status a request log shows for a client that went away before its reply was complete
# (nginx's convention; nothing is sent).
CLIENT_CLOSED = 499


@dataclass
class RequestLog:
    """What the one log line of a request says; the handler fills in what it learns."""

    id: str
    status: int = 0
    usage: Usage | None = None
    cancelled: bool = False
    content: dict[str, Any] | None = None
    model: str | None = None  # the model that answered, on a server of several (its metrics)
    started: float = field(default_factory=time.perf_counter)
    # When the first delta of a stream went out, and the gaps between deltas (for /metrics).
    first_token: float | None = None
    last_token: float | None = None
    token_gaps: list[float] = field(default_factory=list)

    def streamed(self) -> None:
        """A streamed delta is going out now."""
        now = time.perf_counter()
        if self.last_token is None:
            self.first_token = now
        else:
            self.token_gaps.append(now - self.last_token)
        self.last_token = now

    def line(self, method: str, path: str) -> str:
        status = CLIENT_CLOSED if self.cancelled else self.status
        tokens = f"{self.usage.prompt_tokens}+{self.usage.completion_tokens}" if self.usage else "-"
        text = (
            f"{self.id} {method} {path} {status} tokens={tokens} "
            f"{time.perf_counter() - self.started:.3f}s"
        )
        if self.content is not None:
            text += " content=" + json.dumps(self.content, ensure_ascii=False)
        return text


def request_log(scope: Scope) -> RequestLog:
    return scope["state"]["lmpress_log"]


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


class Slots:
    """The places in the server's queue: how many sequences it holds at once (generating or
    waiting for the engine). A request holds one per sequence it asks for (`serve.limits`)."""

    def __init__(self, limit: int):
        self.limit = limit
        self.in_use = 0


class Held:
    """The places one request holds, given back once, as soon as its reply is complete: before
    the reply's last byte is sent, so a client that sends its next request on reading the reply
    finds them free."""

    def __init__(self, slots: Slots, places: int):
        self.slots = slots
        self.places = places
        slots.in_use += places

    def release(self) -> None:
        self.slots.in_use -= self.places
        self.places = 0


# --- responses -------------------------------------------------------------------------------

# What a generation ends in: an ASGI response (JSON, or an event stream).
Response = Callable[[Scope, Receive, Send], Awaitable[None]]


class EventStream:
    """A server-sent event stream of already-encoded `data:` lines. `source` (the engine streams
    the lines come from) is closed however the stream ends, even before its first line."""

    def __init__(self, lines: AsyncIterator[bytes], source: Any, request_id: str):
        self.lines = lines
        self.source = source
        self.request_id = request_id
        self.held: Held | None = None  # the places to give back before the stream's end

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"),
            (b"x-request-id", self.request_id.encode()),
        ]
        async with aclosing(self.source), aclosing(self.lines) as lines:
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            async for line in lines:
                await send({"type": "http.response.body", "body": line, "more_body": True})
        if self.held is not None:
            self.held.release()
        await send({"type": "http.response.body", "body": b"", "more_body": False})


class GenerationResponse(StarletteResponse):
    """The HTTP response of a generation route, which runs the generation: takes a place in the server's queue (or answers 503),
    runs, and cancels the run when the client disconnects."""

    def __init__(
        self,
        slots: Slots,
        run: Coroutine[Any, Any, Response],
        entry: RequestLog,
        places: int = 1,
    ):
        self.slots = slots
        self.run = run
        self.entry = entry
        self.places = places  # its sequences (prompts x n) or texts: what it costs the queue
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        slots = self.slots
        if slots.in_use + self.places > slots.limit:
            self.run.close()  # never started
            error = ApiError(
                503,
                f"the server is at its limit of {slots.limit} sequences in "
                f"flight (serve.queue_limit); retry later",
                type="server_error",
                code="queue_full",
                headers={"retry-after": "1"},
            )
            if scope["path"].startswith(MESSAGES_PATH):
                error = anthropic_error(error)
            await error_response(error)(scope, receive, send)
            return
        held = Held(slots, self.places)
        try:
            await self._run_watching(scope, receive, send, held)
        finally:
            held.release()

    async def _run_watching(self, scope: Scope, receive: Receive, send: Send, held: Held) -> None:
        async def respond() -> None:
            try:
                response = await self.run
            except ApiError as exc:
                response = error_response(exc)
            if isinstance(response, EventStream):
                response.held = held  # generating goes on while it streams
            else:
                held.release()  # the reply is complete: only its sending is left
            await response(scope, receive, send)

        work = asyncio.create_task(respond())
        watch = asyncio.create_task(wait_for_disconnect(receive))
        try:
            done, _ = await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
            if work in done:
                work.result()  # its exception, if any, is the request's
            else:  # the client went away: stop generating for it
                self.entry.cancelled = True
                work.cancel()
                await asyncio.wait({work})
        finally:
            for task in (work, watch):
                task.cancel()
            await asyncio.gather(work, watch, return_exceptions=True)


async def wait_for_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def read_body(request: HttpRequest, limit: int) -> bytes:
    """A request's body, or 413 as soon as it is past `limit` bytes (serve.max_body_bytes)."""
    too_large = ApiError(
        413,
        f"the request body is larger than this server's limit of {limit} bytes "
        f"(serve.max_body_bytes)",
        code=str(ErrorKind.REQUEST_TOO_LARGE),
        headers={"connection": "close"},  # not read on, to be thrown away
    )
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        raise too_large
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)


def error_response(error: ApiError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


# --- middleware ------------------------------------------------------------------------------


class LogRequests:
    """One line per request: id, method, path, status, tokens, latency. Never headers (the API
    key), and never messages or replies unless `serve.log_content`."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        entry = RequestLog(new_id("req"))
        scope.setdefault("state", {})["lmpress_log"] = entry

        async def send_logged(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                entry.status = message["status"]
                headers = list(message.get("headers", []))
                if not any(name == b"x-request-id" for name, _ in headers):
                    headers.append((b"x-request-id", entry.id.encode()))
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_logged)
        except Exception:
            entry.status = entry.status or 500
            raise
        finally:
            log.info(entry.line(scope["method"], scope["path"]))


# The routes a server with a key answers without it: a load balancer's probe and the API's
# own description. Every other route needs it: vLLM's root routes (/score, /rerank,
# /classify, /pooling, /tokenize...) run the model as the /v1 ones do.
OPEN_PATHS = frozenset({"/health", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"})


def guarded(path: str) -> bool:
    """Whether a request to `path` needs the API key (when the server has one)."""
    return path not in OPEN_PATHS


def carries_key(headers: dict[bytes, bytes], expected: bytes) -> bool:
    """Whether a request's headers carry the key, as a bearer token (OpenAI's clients) or as
    `x-api-key` (Anthropic's), compared in constant time."""
    scheme, _, token = (headers.get(b"authorization") or b"").partition(b" ")
    key = headers.get(b"x-api-key")
    return (scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), expected)) or (
        key is not None and hmac.compare_digest(key.strip(), expected)
    )


class RequireKey:
    """401 on every route but OPEN_PATHS unless the request carries the server's key, as a
    bearer token (OpenAI's clients) or as `x-api-key` (Anthropic's). The Messages routes answer
    in Anthropic's error shape. /health stays open, for a load balancer's probe."""

    def __init__(self, app: ASGIApp, api_key: str | None):
        self.app = app
        self.expected = api_key.encode() if api_key else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.expected is None or scope["type"] != "http" or not guarded(scope["path"]):
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        if carries_key(headers, self.expected):
            await self.app(scope, receive, send)
            return
        message = (
            "Incorrect API key provided."
            if headers.get(b"authorization") or headers.get(b"x-api-key")
            else "Missing API key: send it as 'Authorization: Bearer KEY' or 'x-api-key: KEY'."
        )
        error = ApiError(
            401, message, code="invalid_api_key", headers={"www-authenticate": "Bearer"}
        )
        if scope["path"].startswith(MESSAGES_PATH):
            error = anthropic_error(error)
        await error_response(error)(scope, receive, send)
