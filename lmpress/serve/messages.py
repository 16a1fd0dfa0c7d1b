"""Anthropic's Messages API on `lmpress serve`: `POST /v1/messages` and
`/v1/messages/count_tokens`, so that the official `anthropic` SDK (and the coding agents built
on it) talk to the served engine unchanged.

A body goes through `wire.anthropic.server` into the same Request the chat route builds, and
through the server's own checks (model, params, tools), so both routes accept and refuse alike; the
generation runs in a `GenerationResponse` as the chat route's does (the queue limit, the 499 and
the cancel on a client gone). Every error of these routes is in Anthropic's shape.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Coroutine
from contextlib import aclosing
from typing import Any, Protocol, TypeVar

from fastapi import FastAPI
from fastapi import Request as HttpRequest
from fastapi.responses import JSONResponse

from lmpress.engines.base import Engine
from lmpress.engines.prompt_count import PromptCounter
from lmpress.serve import openapi, pooling
from lmpress.serve.asgi import (
    EventStream,
    GenerationResponse,
    RequestLog,
    Response,
    new_id,
)
from lmpress.vocabulary.errors import RequestError
from lmpress.vocabulary.types import Delta, Message, Request, Result
from lmpress.wire.anthropic import server as wire
from lmpress.wire.openai.errors import ApiError, error_from_info
from lmpress.wire.openai.requests import Sampling, parse_body

Body = TypeVar("Body", bound=wire.CountTokensBody)


class Server(pooling.Server, Protocol):
    """What these routes use of `serve.app.Server`."""

    def engine_request(
        self,
        http: HttpRequest,
        id: str,
        messages: list[Message],
        sampling: Sampling,
        adapter: str | None = None,
    ) -> tuple[Request, RequestLog]: ...

    async def take_images(self, request: Request, param: str = "messages") -> None: ...

    def with_images(
        self, request: Request, run: Coroutine[Any, Any, Response], param: str = "messages"
    ) -> Any: ...


def register(app: FastAPI, server: Server) -> None:
    """Add the two routes to `app`."""
    routes = MessagesRoutes(server)
    for path, route, body, reply, stream in (
        (wire.MESSAGES_PATH, routes.messages, wire.MessagesBody, openapi.AnthropicMessage, True),
        (
            wire.COUNT_TOKENS_PATH,
            routes.count_tokens,
            wire.CountTokensBody,
            openapi.TokensCount,
            False,
        ),
    ):
        app.add_api_route(
            path, route, methods=["POST"], openapi_extra=openapi.json_body(body),
            response_model=None, responses=openapi.replies(reply, stream=stream, anthropic=True),
        )  # fmt: skip


def thinks(engine: Engine) -> bool:
    """Whether the served model reasons: a local engine knows its model's thinking format; a
    remote one is asked to think or not where it takes reasoning_effort."""
    model_reasoning = getattr(engine, "model_reasoning", None)
    if model_reasoning is not None:
        return model_reasoning.fmt is not None
    return "reasoning_effort" in engine.supported_params


class MessagesRoutes:
    def __init__(self, server: Server):
        self.server = server
        self._counter: PromptCounter | None = None
        self._counter_lock = asyncio.Lock()

    async def messages(self, request: HttpRequest) -> GenerationResponse:
        try:
            body = await self._body(request, wire.MessagesBody)
            engine_request, entry = self._request(request, body, new_id("msg"))
            if body.stream:
                run = self._stream(engine_request, entry)
            else:
                run = self._complete(engine_request, entry)
        except ApiError as exc:
            raise wire.anthropic_error(exc) from None
        run = self.server.with_images(engine_request, run)
        return GenerationResponse(self.server.slots, _in_anthropic_shape(run), entry)

    async def count_tokens(self, request: HttpRequest) -> JSONResponse:
        """The prompt's tokens as the engine counts them (its `prompt_counter`, the dry run's),
        which is the input_tokens a message with the same body reports."""
        try:
            body = await self._body(request, wire.CountTokensBody)
            engine_request, _ = self._request(request, body, new_id("count"))
            await self.server.take_images(engine_request)
            counter = await self._prompt_counter()
            try:
                tokens = await asyncio.to_thread(counter.count, engine_request)
            except RequestError as exc:
                raise ApiError(400, str(exc)) from None
        except ApiError as exc:
            raise wire.anthropic_error(exc) from None
        return JSONResponse({"input_tokens": tokens})

    # --- the request ---------------------------------------------------------------------

    async def _body(self, request: HttpRequest, model: type[Body]) -> Body:
        pooling.require_task(self.server, wire.MESSAGES_PATH, ("generate",))
        return parse_body(model, await self.server.read_body(request))

    def _request(
        self, http: HttpRequest, body: wire.CountTokensBody, id: str
    ) -> tuple[Request, RequestLog]:
        server = self.server
        messages = wire.request_messages(body)
        adapter = server.check_model(body.model)
        sampling = wire.request_sampling(body, thinks(server.engine))
        return server.engine_request(http, id, messages, sampling, adapter)

    async def _prompt_counter(self) -> PromptCounter:
        """The engine's prompt counter, loaded (a tokenizer, never weights) on first use."""
        async with self._counter_lock:
            if self._counter is None:
                engine = self.server.engine
                self._counter = await asyncio.to_thread(engine.prompt_counter, engine.config)
        return self._counter

    # --- the reply -----------------------------------------------------------------------

    def _finish_log(self, entry: RequestLog, result: Result) -> None:
        entry.usage = result.usage
        if entry.content is not None:
            entry.content["reply"] = [s.text for s in result.samples]

    async def _complete(self, request: Request, entry: RequestLog) -> Response:
        result = await self.server.answers.complete(request)
        self._finish_log(entry, result)
        if result.error is not None:
            raise error_from_info(result.error, entry.id)
        body = wire.message_body(entry.id, request.adapter or self.server.model_name, result)
        return JSONResponse(body, headers={"x-request-id": entry.id})

    async def _stream(self, request: Request, entry: RequestLog) -> Response:
        """An event stream, started once the engine has produced something, so that a request
        the engine refuses at once still gets its HTTP error status."""
        items = self.server.answers.stream(request)
        first = await anext(items)
        if isinstance(first, Result) and first.error is not None:
            await items.aclose()
            self._finish_log(entry, first)
            raise error_from_info(first.error, entry.id)
        events = MessageEvents(entry.id, request.adapter or self.server.model_name)
        return EventStream(self._events(first, items, events, entry), items, entry.id)

    async def _events(
        self,
        first: Delta | Result,
        items: AsyncIterator[Delta | Result],
        events: MessageEvents,
        entry: RequestLog,
    ) -> AsyncIterator[bytes]:
        yield events.start()
        async with aclosing(items):
            item: Delta | Result | None = first
            while item is not None:
                if isinstance(item, Delta):
                    entry.streamed()  # for /metrics' time to first token
                    for line in events.delta(item):
                        yield line
                else:
                    self._finish_log(entry, item)
                    if item.error is not None:
                        error = wire.anthropic_error(error_from_info(item.error, entry.id))
                        yield wire.event(error.body())
                        return
                    for line in events.finish(item):
                        yield line
                item = await anext(items, None)


async def _in_anthropic_shape(run: Coroutine[Any, Any, Response]) -> Response:
    try:
        return await run
    except ApiError as exc:
        raise wire.anthropic_error(exc) from None


class MessageEvents:
    """The events of one streamed message, in Anthropic's order: message_start; per content
    block (the thinking, the text, each tool call) its start, deltas and stop; message_delta
    with the stop reason and usage; message_stop."""

    def __init__(self, id: str, model: str):
        self.id = id
        self.model = model
        self.index = -1  # the open block's index
        self.open: str | None = None  # its type

    def start(self) -> bytes:
        message = {
            "id": self.id, "type": "message", "role": "assistant", "model": self.model,
            "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }  # fmt: skip
        return wire.event({"type": "message_start", "message": message}) + wire.event(
            {"type": "ping"}
        )

    def _block(self, block: dict[str, Any]) -> list[bytes]:
        out = self._close()
        self.index += 1
        self.open = block["type"]
        out.append(
            wire.event({"type": "content_block_start", "index": self.index, "content_block": block})
        )
        return out

    def _close(self) -> list[bytes]:
        if self.open is None:
            return []
        out = []
        if self.open == "thinking":
            delta = {"type": "signature_delta", "signature": wire.SIGNATURE}
            out.append(self._delta(delta))
        out.append(wire.event({"type": "content_block_stop", "index": self.index}))
        self.open = None
        return out

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return wire.event({"type": "content_block_delta", "index": self.index, "delta": delta})

    def delta(self, item: Delta) -> list[bytes]:
        kind = "thinking" if item.reasoning else "text"
        out = []
        if self.open != kind:
            block = {"type": "thinking", "thinking": "", "signature": ""} if item.reasoning else {
                "type": "text", "text": ""}  # fmt: skip
            out = self._block(block)
        if item.reasoning:
            out.append(self._delta({"type": "thinking_delta", "thinking": item.text}))
        else:
            out.append(self._delta({"type": "text_delta", "text": item.text}))
        return out

    def finish(self, result: Result) -> list[bytes]:
        sample = result.samples[0]
        out = []
        if self.index < 0 and not sample.tool_calls:  # nothing said: one empty text block
            out += self._block({"type": "text", "text": ""})
        for call in sample.tool_calls or ():
            block = {**wire.tool_use_block(call), "input": {}}
            out += self._block(block)
            out.append(self._delta({"type": "input_json_delta", "partial_json": call.arguments}))
        out += self._close()
        delta = {
            "stop_reason": wire.stop_reason(result),
            "stop_sequence": wire.stop_sequence(result),
        }
        out.append(wire.event({"type": "message_delta", "delta": delta,
                               "usage": wire.usage(result)}))  # fmt: skip
        out.append(wire.event({"type": "message_stop"}))
        return out
