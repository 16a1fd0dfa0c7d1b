"""The pooling routes of `lmpress serve`: OpenAI's `/v1/embeddings`, and vLLM's `/v1/score` and
`/v1/rerank` (at every path vLLM answers them on: `/score`, `/rerank`, `/v2/rerank`),
`/classify` and `/pooling`, over the served engine's `embed` and `score`.

A server runs one task (`--task`, as a batch run does: NATIVE loads an encoder for `embed`, a
cross-encoder for `score` and `rerank`, a sequence classifier for `classify` and `reward`), so
a route of another task answers 400 in one line. `/pooling` gives a reward server's values.
Each request goes to the engine as it comes, as a generation does; the engine batches what is
waiting. Bodies are read and answered by `wire.openai.pooling`, as batch reads the same bodies.
"""

from __future__ import annotations

import time
from typing import Protocol

from fastapi import Request as HttpRequest
from fastapi.responses import JSONResponse

from lmpress.configs.schema import ServeParams
from lmpress.engines.base import Engine
from lmpress.serve import limits
from lmpress.serve.asgi import (
    GenerationResponse,
    RequestLog,
    Response,
    Slots,
    new_id,
    request_log,
)
from lmpress.vocabulary.embeddings import EmbedRequest, ScoreRequest, Task
from lmpress.vocabulary.types import Usage
from lmpress.wire.openai import pooling as wire
from lmpress.wire.openai.errors import ApiError, error_from_info
from lmpress.wire.openai.requests import parse_body


class Server(Protocol):
    """What these routes use of `serve.app.Server`."""

    engine: Engine
    settings: ServeParams
    model_name: str
    slots: Slots

    async def read_body(self, request: HttpRequest) -> bytes: ...

    def check_model(self, model: str) -> str | None: ...


def require_task(server: Server, path: str, tasks: tuple[Task, ...]) -> None:
    """A 400 for a route whose task this server does not run."""
    task = server.engine.config.task
    if task not in tasks:
        raise ApiError(
            400,
            f"{path}: this server runs the {task} task; start it with --task {tasks[0]} "
            f"(on an engine that can {tasks[0]}) to serve {path}",
            code="unsupported_task",
        )


def _model(server: Server, model: str | None) -> None:
    if model is None:
        raise ApiError(400, "Missing required parameter: 'model'", param="model")
    server.check_model(model)


def _bounded(server: Server, items: list, param: str, query: str | list[str] = ()) -> int:
    """Refuse more items (inputs, documents), or a longer text, than the caps allow
    (`serve.limits`); returns the places the request holds in the queue, one an item."""
    settings = server.settings
    limits.check_prompt_count(settings, len(items), param)
    texts = [query] if isinstance(query, str) else list(query)
    texts += [item for item in items if isinstance(item, str)]  # not token ids
    limits.check_prompt_bytes(settings, texts, param)
    limits.check_places(settings, len(items), f"items in '{param}'")
    return len(items)


def _logged(server: Server, request: HttpRequest, prefix: str, content: object) -> RequestLog:
    entry = request_log(request.scope)
    entry.id = new_id(prefix)
    if server.settings.log_content:
        entry.content = {"input": content}
    return entry


async def embeddings(server: Server, request: HttpRequest) -> GenerationResponse:
    require_task(server, wire.EMBEDDINGS_PATH, ("embed",))
    body = parse_body(wire.EmbeddingsBody, await server.read_body(request))
    _model(server, body.model)
    got = wire.embeddings_input(body)
    places = _bounded(server, got.inputs, "input")
    entry = _logged(server, request, "embd", got.inputs)
    embed = EmbedRequest(entry.id, got.inputs, got.dimensions, got.normalize)

    async def run() -> Response:
        result = await server.answers.embed(embed)
        entry.usage = Usage(result.usage.prompt_tokens, 0)
        if result.error is not None:
            raise error_from_info(result.error, entry.id)
        out = wire.embeddings_response(result, server.model_name, got.encoding_format)
        return JSONResponse(out, headers={"x-request-id": entry.id})

    return GenerationResponse(server.slots, run(), entry, places)


async def classify(server: Server, request: HttpRequest) -> GenerationResponse:
    require_task(server, wire.CLASSIFY_PATH, ("classify",))
    body = parse_body(wire.ClassifyBody, await server.read_body(request))
    return _headed(server, request, body, "classify", "float")


async def pooled(server: Server, request: HttpRequest) -> GenerationResponse:
    require_task(server, wire.POOLING_PATH, ("reward",))
    body = parse_body(wire.PoolingBody, await server.read_body(request))
    return _headed(server, request, body, "pooling", body.encoding_format or "float")


def _headed(
    server: Server,
    request: HttpRequest,
    body: wire.ClassifyBody | wire.PoolingBody,
    prefix: str,
    encoding: wire.EncodingFormat,
) -> GenerationResponse:
    """A classify or pooling request: each input through the classifier's head."""
    _model(server, body.model)
    inputs = wire.inputs_of(body)
    places = _bounded(server, inputs, "input")
    entry = _logged(server, request, prefix, inputs)

    async def run() -> Response:
        result = await server.answers.embed(EmbedRequest(entry.id, inputs))
        entry.usage = Usage(result.usage.prompt_tokens, 0)
        if result.error is not None:
            raise error_from_info(result.error, entry.id)
        created, model = int(time.time()), server.model_name
        if prefix == "classify":
            out = wire.classify_response(entry.id, created, result, model)
        else:
            out = wire.pooling_response(entry.id, created, result, model, encoding)
        return JSONResponse(out, headers={"x-request-id": entry.id})

    return GenerationResponse(server.slots, run(), entry, places)


async def score(server: Server, request: HttpRequest) -> GenerationResponse:
    require_task(server, request.url.path, ("score", "rerank"))
    body = parse_body(wire.ScoreBody, await server.read_body(request))
    _model(server, body.model)
    scoring = ScoreRequest("", *wire.score_pair(body))
    places = _bounded(server, scoring.documents, "text_2", scoring.query)
    entry = _logged(server, request, "score", scoring.texts())
    scoring.id = entry.id

    async def run() -> Response:
        result = await _scored(server, entry, scoring)
        out = wire.score_response(entry.id, int(time.time()), result, server.model_name)
        return JSONResponse(out, headers={"x-request-id": entry.id})

    return GenerationResponse(server.slots, run(), entry, places)


async def rerank(server: Server, request: HttpRequest) -> GenerationResponse:
    require_task(server, request.url.path, ("rerank", "score"))
    body = parse_body(wire.RerankBody, await server.read_body(request))
    _model(server, body.model)
    top_n = wire.top_n_of(body.top_n)
    places = _bounded(server, body.documents, "documents", body.query)
    entry = _logged(server, request, "rerank", [body.query, *body.documents])
    scored = ScoreRequest(entry.id, body.query, body.documents, top_n)

    async def run() -> Response:
        result = await _scored(server, entry, scored)
        out = wire.rerank_response(entry.id, result, body.documents, top_n, server.model_name)
        return JSONResponse(out, headers={"x-request-id": entry.id})

    return GenerationResponse(server.slots, run(), entry, places)


async def _scored(server: Server, entry: RequestLog, request: ScoreRequest):
    result = await server.answers.score(request)
    entry.usage = Usage(result.usage.prompt_tokens, 0)
    if result.error is not None:
        raise error_from_info(result.error, entry.id)
    return result
