"""`POST /v1/responses` of `lmpress serve`: OpenAI's Responses API over the served engine,
stateless (lmpress keeps no responses; see `wire.openai.responses_api`).

A body becomes the same engine Request a chat completion makes (input items as messages,
instructions as a system message first, function tools in chat's form), checked by the
server's own checks, and runs the way a chat completion runs: in a `GenerationResponse`, which
holds a place in the queue and cancels the generation when the client goes away.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Coroutine
from contextlib import aclosing
from typing import Any, Protocol

from fastapi import Request as HttpRequest
from fastapi.responses import JSONResponse

from lmpress.data.messages import RowError, regenerate_last_turn
from lmpress.serve import pooling
from lmpress.serve.asgi import (
    EventStream,
    GenerationResponse,
    RequestLog,
    Response,
    new_id,
)
from lmpress.vocabulary.types import Delta, Message, Request, Result
from lmpress.wire.openai.errors import ApiError, error_from_info
from lmpress.wire.openai.requests import Sampling, parse_body
from lmpress.wire.openai.responses_api.requests import (
    RESPONSES_PATH,
    ResponsesBody,
    input_messages,
    responses_sampling,
)
from lmpress.wire.openai.responses_api.responses import ResponseEvents, ResponseHead, dump


class Server(pooling.Server, Protocol):
    """What this route uses of `serve.app.Server`."""

    def engine_request(
        self,
        http: HttpRequest,
        id: str,
        messages: list[Message],
        sampling: Sampling,
        adapter: str | None = None,
    ) -> tuple[Request, RequestLog]: ...

    def with_images(
        self, request: Request, run: Coroutine[Any, Any, Response], param: str = "messages"
    ) -> Any: ...


async def responses(server: Server, request: HttpRequest) -> GenerationResponse:
    pooling.require_task(server, RESPONSES_PATH, ("generate",))
    body = parse_body(ResponsesBody, await server.read_body(request))
    sampling = responses_sampling(body)
    try:
        messages = regenerate_last_turn(input_messages(body))
    except RowError as exc:
        raise ApiError(400, str(exc), param="input") from exc
    if body.model is None:
        raise ApiError(400, "Missing required parameter: 'model'", param="model")
    adapter = server.check_model(body.model)
    engine_request, entry = server.engine_request(
        request, new_id("resp"), messages, sampling, adapter
    )
    head = ResponseHead(entry.id, adapter or server.model_name, body)
    head.check()
    if body.stream:
        run = _stream(server, engine_request, head, entry)
    else:
        run = _complete(server, engine_request, head, entry)
    return GenerationResponse(server.slots, server.with_images(engine_request, run, "input"), entry)


def _log_result(entry: RequestLog, result: Result) -> None:
    entry.usage = result.usage
    if entry.content is not None:
        entry.content["reply"] = [s.text for s in result.samples]


async def _complete(
    server: Server, request: Request, head: ResponseHead, entry: RequestLog
) -> Response:
    result = await server.answers.complete(request)
    _log_result(entry, result)
    if result.error is not None:
        raise error_from_info(result.error, entry.id)
    return JSONResponse(dump(head.finished(result)), headers={"x-request-id": entry.id})


async def _stream(
    server: Server, request: Request, head: ResponseHead, entry: RequestLog
) -> Response:
    """The event stream, started once the engine has produced something, so that a request
    the engine refuses at once still gets its HTTP error status."""
    items = server.answers.stream(request)
    first = await anext(items)
    if isinstance(first, Result) and first.error is not None:
        await items.aclose()
        _log_result(entry, first)
        raise error_from_info(first.error, entry.id)
    return EventStream(_events(first, items, ResponseEvents(head), entry), items, entry.id)


async def _events(
    first: Delta | Result,
    items: AsyncIterator[Delta | Result],
    events: ResponseEvents,
    entry: RequestLog,
) -> AsyncIterator[bytes]:
    async with aclosing(items):
        for line in events.start():
            yield line
        item: Delta | Result | None = first
        while item is not None:
            if isinstance(item, Delta):
                entry.streamed()  # for /metrics' time to first token
                lines = events.delta(item.text, item.reasoning) if item.text else []
            else:
                _log_result(entry, item)
                if item.error is not None:
                    lines = events.failed(error_from_info(item.error, entry.id))
                else:
                    lines = events.finish(item)
            for line in lines:
                yield line
            item = await anext(items, None)
