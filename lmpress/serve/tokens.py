"""The served engine's tokenizer: vLLM's `/tokenize`, `/detokenize` and `/tokenizer_info` at the
root (lm-eval's `remote` tokenizer backend finds a server by them), and what an echo of a
completions prompt needs (its tokens' text, a token-id prompt's text).

The tokenizer is the engine's own (`Engine.tokenizer`), loaded once, off the event loop, on the
first request that needs it; an engine that cannot tokenize (a remote API) answers 400 here.
A conversation is tokenized by the engine itself, as it would prompt the model: a request that
generates nothing returns its prompt's ids.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Protocol

from fastapi import FastAPI
from fastapi import Request as HttpRequest
from fastapi.responses import JSONResponse

from lmpress.data.messages import RowError, parse_messages
from lmpress.engines.base import Engine
from lmpress.serve import openapi
from lmpress.serve.asgi import new_id
from lmpress.vocabulary.errors import LmpressError, UnsupportedParamError
from lmpress.vocabulary.likelihood import Tokenizer
from lmpress.vocabulary.types import Request, Result
from lmpress.wire.openai import tokens as wire
from lmpress.wire.openai.errors import ApiError, error_from_info
from lmpress.wire.openai.prompt_logprobs import Echo, echo_of
from lmpress.wire.openai.requests import Prompt, parse_body


class EngineTokenizer:
    """The engine's tokenizer, loaded on first use; None (or a 400) where it has none."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self._lock = asyncio.Lock()
        self._loaded: Tokenizer | UnsupportedParamError | None = None

    async def get(self) -> Tokenizer | None:
        async with self._lock:
            if self._loaded is None:
                try:
                    self._loaded = await asyncio.to_thread(self.engine.tokenizer)
                except UnsupportedParamError as exc:
                    self._loaded = exc
        return None if isinstance(self._loaded, UnsupportedParamError) else self._loaded

    async def require(self) -> Tokenizer:
        tokenizer = await self.get()
        if tokenizer is None:
            raise ApiError(400, str(self._loaded), code="unsupported_parameter")
        return tokenizer


@dataclass
class Echoing:
    """What a completions body asked to have echoed: each prompt before its replies, with its
    tokens' logprobs where `logprobs` was given too."""

    prompts: list[Prompt]
    echo: bool
    logprobs: bool

    @property
    def needs_tokenizer(self) -> bool:
        """A token-id prompt's text, or the prompt's tokens' text, come from the tokenizer."""
        return self.echo and (self.logprobs or any(isinstance(p, list) for p in self.prompts))

    def of(self, results: list[Result], tokenizer: Tokenizer | None) -> list[Echo]:
        if not self.echo:
            return [Echo() for _ in results]
        return [
            echo_of(prompt, result, tokenizer, self.logprobs)
            for prompt, result in zip(self.prompts, results, strict=True)
        ]


class Server(Protocol):
    """What these routes use of `serve.app.Server`."""

    engine: Engine
    tokens: EngineTokenizer

    async def read_body(self, request: HttpRequest) -> bytes: ...

    def check_model(self, model: str) -> str | None: ...


def register(app: FastAPI, server: Server) -> None:
    """vLLM's three tokenizer routes on `app`."""

    async def tokenize(request: HttpRequest) -> JSONResponse:
        body = parse_body(wire.TokenizeBody, await server.read_body(request))
        if body.model is not None:
            server.check_model(body.model)
        tokenizer = await server.tokens.require()
        if (body.prompt is None) == (body.messages is None):
            raise ApiError(400, "give either 'prompt' (a text) or 'messages' (a conversation)")
        if body.prompt is not None:
            special = body.add_special_tokens is not False
            ids = await asyncio.to_thread(tokenizer.encode, body.prompt, special)
        else:
            ids = await _conversation_ids(server.engine, body)
        return JSONResponse(wire.tokenize_response(ids, tokenizer, body.return_token_strs))

    async def detokenize(request: HttpRequest) -> JSONResponse:
        body = parse_body(wire.DetokenizeBody, await server.read_body(request))
        if body.model is not None:
            server.check_model(body.model)
        tokenizer = await server.tokens.require()
        try:
            text = await asyncio.to_thread(tokenizer.decode, body.tokens)
        except (ValueError, IndexError, OverflowError, TypeError) as exc:
            raise ApiError(400, f"'tokens' cannot be decoded: {exc}", param="tokens") from None
        return JSONResponse({"prompt": text})

    async def info() -> JSONResponse:
        tokenizer = await server.tokens.require()
        return JSONResponse(wire.tokenizer_info(tokenizer, server.engine.model_name))

    for path, route, body in (
        (wire.TOKENIZE_PATH, tokenize, wire.TokenizeBody),
        (wire.DETOKENIZE_PATH, detokenize, wire.DetokenizeBody),
    ):
        app.add_api_route(
            path, route, methods=["POST"], openapi_extra=openapi.json_body(body),
            response_model=None, responses=openapi.replies(),
        )  # fmt: skip
    app.add_api_route(
        wire.TOKENIZER_INFO_PATH, info, methods=["GET"], response_model=None,
        responses=openapi.replies(),
    )  # fmt: skip


async def _conversation_ids(engine: Engine, body: wire.TokenizeBody) -> list[int]:
    """A conversation's prompt ids as the engine renders it: a request that generates
    nothing, whose Result names its prompt's ids."""
    if not body.add_generation_prompt or body.add_special_tokens:
        raise ApiError(
            400,
            "a conversation is tokenized as the engine prompts the model: with the generation "
            "prompt and no extra special tokens (leave add_generation_prompt and "
            "add_special_tokens out)",
        )
    if "prompt_logprobs" not in engine.supported_params:  # it cannot generate nothing
        raise ApiError(
            400, f"engine {engine.name} cannot tokenize a conversation; send 'prompt'",
            param="messages",
        )  # fmt: skip
    try:
        messages = parse_messages(body.messages)
    except RowError as exc:
        raise ApiError(400, str(exc), param="messages") from None
    params = engine.config.generation.replace(max_new_tokens=0)
    try:
        result = await engine.complete(Request(new_id("tokenize"), messages, params))
    except LmpressError as exc:
        raise ApiError(400, str(exc), param="messages") from None
    if result.error is not None:
        raise error_from_info(result.error, result.request_id)
    if result.prompt_ids is None:
        raise ApiError(
            400,
            f"engine {engine.name} does not say a conversation's tokens; send 'prompt'",
            param="messages",
        )
    return result.prompt_ids
