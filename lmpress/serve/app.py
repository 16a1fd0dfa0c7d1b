"""The FastAPI app of `lmpress serve`: OpenAI's routes over one engine.

Every generation runs inside a `Generation` response that also watches for the client going
away; when it goes, the generation task is cancelled, which closes the engine's stream and so
frees the request's place in the engine's batch.
"""

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

from fastapi import FastAPI
from fastapi import Request as HttpRequest
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import Response as StarletteResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from lmpress.configs.schema import ServeParams
from lmpress.data.formats import RowError, parse_messages
from lmpress.engines.base import Engine
from lmpress.serve import protocol
from lmpress.serve.protocol import ApiError, ChatChunks, CompletionChunks, Sampling
from lmpress.types import Delta, GenerationParams, Request, Result, Usage

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
    started: float = field(default_factory=time.perf_counter)

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


class Server:
    """One engine behind the OpenAI routes, with the settings of `lmpress serve`."""

    def __init__(self, engine: Engine, settings: ServeParams, api_key: str | None):
        self.engine = engine
        self.settings = settings
        self.api_key = api_key
        self.model_name = settings.served_model_name or engine.model_name or engine.name.lower()
        self.created = int(time.time())
        self.in_flight = 0

    # --- checks shared by the generation routes ----------------------------------------------

    async def read_body(self, request: HttpRequest) -> bytes:
        limit = self.settings.max_body_bytes
        too_large = ApiError(
            413,
            f"the request body is larger than this server's limit of {limit} bytes "
            f"(serve.max_body_bytes)",
            code="request_too_large",
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

    def check_model(self, model: str) -> None:
        if model != self.model_name:
            raise ApiError(
                404,
                f"The model '{model}' does not exist; this server serves '{self.model_name}'",
                param="model",
                code="model_not_found",
            )

    def params(self, sampling: Sampling) -> GenerationParams:
        """The server's generation settings with the request's, refusing what the engine
        does not honour."""
        params = self.engine.config.generation.replace(**sampling.overrides)
        unsupported = sorted(set(params.changed_fields()) - self.engine.supported_params)
        if unsupported:
            names = [sampling.source.get(name, name) for name in unsupported]
            raise ApiError(
                400,
                f"engine {self.engine.name} does not support {', '.join(repr(n) for n in names)}",
                param=names[0],
                code="unsupported_parameter",
            )
        return params

    # --- the routes ----------------------------------------------------------------------

    async def chat_completions(self, request: HttpRequest) -> Generation:
        body = protocol.parse_body(protocol.ChatCompletionBody, await self.read_body(request))
        sampling = protocol.chat_sampling(body)
        try:
            messages = parse_messages(body.messages)
        except RowError as exc:
            raise ApiError(400, str(exc), param="messages") from exc
        self.check_model(body.model)
        params = self.params(sampling)
        entry = request_log(request.scope)
        entry.id = new_id("chatcmpl")
        if self.settings.log_content:
            entry.content = {"messages": [m.to_openai() for m in messages]}
        engine_request = Request(entry.id, messages, params)
        if body.stream:
            chunks = ChatChunks(entry.id, int(time.time()), self.model_name, body.include_usage)
            run = self._stream([engine_request], chunks, entry, [""])
        else:
            run = self._complete_chat(engine_request, entry)
        return Generation(self, run, entry)

    async def completions(self, request: HttpRequest) -> Generation:
        body = protocol.parse_body(protocol.CompletionBody, await self.read_body(request))
        sampling = protocol.completion_sampling(body)
        prompts = protocol.completion_prompts(body)
        self.check_model(body.model)
        params = self.params(sampling)
        entry = request_log(request.scope)
        entry.id = new_id("cmpl")
        if self.settings.log_content:
            entry.content = {"prompt": prompts}
        requests = [
            Request(f"{entry.id}-{i}", [], params, prompt=prompt)
            for i, prompt in enumerate(prompts)
        ]
        echoes = prompts if body.echo else [""] * len(prompts)
        if body.stream:
            chunks = CompletionChunks(
                entry.id, int(time.time()), self.model_name, body.include_usage
            )
            run = self._stream(requests, chunks, entry, echoes)
        else:
            run = self._complete_text(requests, entry, echoes)
        return Generation(self, run, entry)

    # --- running generations -------------------------------------------------------------

    def _finish_log(self, entry: RequestLog, results: list[Result]) -> None:
        entry.usage = Usage(
            sum(r.usage.prompt_tokens for r in results),
            sum(r.usage.completion_tokens for r in results),
        )
        if entry.content is not None:
            entry.content["reply"] = [s.text for r in results for s in r.samples]

    async def _complete_chat(self, request: Request, entry: RequestLog) -> Response:
        result = await self.engine.complete(request)
        self._finish_log(entry, [result])
        if result.error is not None:
            raise protocol.error_from_result(result)
        body = protocol.chat_completion(entry.id, int(time.time()), self.model_name, result)
        return JSONResponse(body, headers={"x-request-id": entry.id})

    async def _complete_text(
        self, requests: list[Request], entry: RequestLog, echoes: list[str]
    ) -> Response:
        results = list(await asyncio.gather(*(self.engine.complete(r) for r in requests)))
        self._finish_log(entry, results)
        for result in results:
            if result.error is not None:
                raise protocol.error_from_result(result)
        body = protocol.text_completion(
            entry.id, int(time.time()), self.model_name, results, echoes
        )
        return JSONResponse(body, headers={"x-request-id": entry.id})

    async def _stream(
        self,
        requests: list[Request],
        chunks: ChatChunks | CompletionChunks,
        entry: RequestLog,
        echoes: list[str],
    ) -> Response:
        """The response is an event stream, started once the engine has produced something,
        so that a request the engine refuses at once still gets its HTTP error status."""
        n = requests[0].params.n
        items = merged([self.engine.stream(r) for r in requests])
        first = await anext(items)
        if isinstance(first[1], Result) and first[1].error is not None:
            await items.aclose()
            self._finish_log(entry, [first[1]])
            raise protocol.error_from_result(first[1])
        lines = self._events(first, items, chunks, entry, echoes, n)
        return EventStream(lines, items, entry.id)

    async def _events(
        self,
        first: tuple[int, Delta | Result],
        items: AsyncIterator[tuple[int, Delta | Result]],
        chunks: ChatChunks | CompletionChunks,
        entry: RequestLog,
        echoes: list[str],
        n: int,
    ) -> AsyncIterator[bytes]:
        started: set[int] = set()
        results: list[Result] = []

        def opening(index: int, prompt: int) -> list[bytes]:
            if index in started:
                return []
            started.add(index)
            out = [chunks.start(index)] if isinstance(chunks, ChatChunks) else []
            if echoes[prompt]:
                out.append(chunks.text(index, echoes[prompt]))
            return out

        async with aclosing(items):
            item: tuple[int, Delta | Result] | None = first
            while item is not None:
                prompt, value = item
                if isinstance(value, Delta):
                    index = prompt * n + value.index
                    for line in opening(index, prompt):
                        yield line
                    yield chunks.text(index, value.text)
                else:
                    if value.error is not None:
                        self._finish_log(entry, [*results, value])
                        yield protocol.sse(protocol.error_from_result(value).body())
                        yield protocol.DONE
                        return
                    results.append(value)
                    for i, sample in enumerate(value.samples):
                        for line in opening(prompt * n + i, prompt):
                            yield line
                        yield chunks.finish(prompt * n + i, sample)
                item = await anext(items, None)
        self._finish_log(entry, results)
        if chunks.include_usage:
            assert entry.usage is not None
            yield chunks.usage(entry.usage)
        yield protocol.DONE


async def merged(
    streams: list[AsyncIterator[Delta | Result]],
) -> AsyncIterator[tuple[int, Delta | Result]]:
    """The items of several engine streams as they come, each with its stream's index.
    Closing this closes them all (and so cancels their requests)."""
    if len(streams) == 1:
        async with aclosing(streams[0]) as stream:
            async for item in stream:
                yield 0, item
        return
    queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
    end = object()

    async def pump(i: int, stream: AsyncIterator[Delta | Result]) -> None:
        try:
            async with aclosing(stream):
                async for item in stream:
                    queue.put_nowait((i, item))
        except Exception as exc:
            queue.put_nowait((i, exc))
        finally:
            queue.put_nowait((i, end))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(tasks)
        while remaining:
            i, item = await queue.get()
            if item is end:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield i, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


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
        await send({"type": "http.response.body", "body": b"", "more_body": False})


class Generation(StarletteResponse):
    """Runs a generation as the response: takes a place in the server's queue (or answers 503),
    runs, and cancels the run when the client disconnects."""

    def __init__(self, server: Server, run: Coroutine[Any, Any, Response], entry: RequestLog):
        self.server = server
        self.run = run
        self.entry = entry
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        server = self.server
        if server.in_flight >= server.settings.queue_limit:
            self.run.close()  # never started
            error = ApiError(
                503,
                f"the server is at its limit of {server.settings.queue_limit} requests in "
                f"flight (serve.queue_limit); retry later",
                type="server_error",
                code="queue_full",
                headers={"retry-after": "1"},
            )
            await error_response(error)(scope, receive, send)
            return
        server.in_flight += 1
        try:
            await self._run_watching(scope, receive, send)
        finally:
            server.in_flight -= 1

    async def _run_watching(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def respond() -> None:
            try:
                response = await self.run
            except ApiError as exc:
                response = error_response(exc)
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


class RequireKey:
    """401 on every /v1 route unless the request carries the server's key as a bearer token."""

    def __init__(self, app: ASGIApp, api_key: str | None):
        self.app = app
        self.expected = f"Bearer {api_key}".encode() if api_key else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            self.expected is None
            or scope["type"] != "http"
            or not (scope["path"] == "/v1" or scope["path"].startswith("/v1/"))
        ):
            await self.app(scope, receive, send)
            return
        given = dict(scope["headers"]).get(b"authorization")
        if given is not None and hmac.compare_digest(given, self.expected):
            await self.app(scope, receive, send)
            return
        message = (
            "Incorrect API key provided."
            if given
            else "Missing API key: send it as 'Authorization: Bearer KEY'."
        )
        error = ApiError(
            401, message, code="invalid_api_key", headers={"www-authenticate": "Bearer"}
        )
        await error_response(error)(scope, receive, send)


# --- the app ---------------------------------------------------------------------------------


def create_app(engine: Engine, settings: ServeParams, api_key: str | None = None) -> FastAPI:
    """The OpenAI-compatible app over `engine`. The caller owns the engine (and closes it)."""
    server = Server(engine, settings, api_key)
    app = FastAPI(title="lmpress", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = server

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {
            "status": "ok",
            "model": server.model_name,
            "engine": engine.name,
            "requests_in_flight": server.in_flight,
        }

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        return protocol.model_list([server.model_name], server.created, "lmpress")

    @app.get("/v1/models/{model:path}")
    async def get_model(model: str) -> dict[str, Any]:
        server.check_model(model)
        return protocol.model_card(model, server.created, "lmpress")

    app.add_api_route("/v1/chat/completions", server.chat_completions, methods=["POST"])
    app.add_api_route("/v1/completions", server.completions, methods=["POST"])

    async def api_error(request: HttpRequest, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ApiError)
        return error_response(exc)

    async def http_error(request: HttpRequest, exc: Exception) -> JSONResponse:
        assert isinstance(exc, HTTPException)
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        where = f"{request.method} {request.url.path}"
        message = f"{where}: {exc.detail}" if exc.status_code != 404 else f"no route {where}"
        return error_response(ApiError(exc.status_code, message, code=code))

    async def disconnected(request: HttpRequest, exc: Exception) -> JSONResponse:
        request_log(request.scope).cancelled = True
        return error_response(ApiError(400, "the client went away while sending its request"))

    async def internal_error(request: HttpRequest, exc: Exception) -> JSONResponse:
        log.exception("internal error in %s", request_log(request.scope).id)
        error = ApiError(500, f"internal error: {type(exc).__name__}", type="server_error")
        return error_response(error)

    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(ClientDisconnect, disconnected)
    app.add_exception_handler(Exception, internal_error)
    app.add_middleware(RequireKey, api_key=api_key)
    app.add_middleware(LogRequests)  # added last, so outermost: it sees every answer
    return app
