"""The OpenAPI document of `lmpress serve`, at `/openapi.json`: what each route takes and
answers, for clients, code generators and fuzzers.

A route's request body is the pydantic model the route itself validates with (`parse_body`):
routes read their bodies themselves, to stop at `serve.max_body_bytes` as the bytes come and to
refuse in the API's own words, so FastAPI cannot see the body and `json_body(Model)` declares
it, with the one model this server serves and an example request. Replies are the `openai`
package's types the routes build their answers from (a Messages reply is described here, so
serving needs no `anthropic` package); errors are the API's error object (OpenAI's, or
Anthropic's on /v1/messages).

The document is public, as vLLM's is: it says what the server takes, never what it holds.
With --api-key it names the two ways to send the key, on the routes that need it.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from openai.types import Batch, CreateEmbeddingResponse, Embedding, ErrorObject, FileObject, Model
from pydantic import BaseModel, ConfigDict

from lmpress.serve.asgi import guarded

REF = "#/components/schemas/{model}"
ABOUT = "OpenAI's API (and Anthropic's Messages API) over the engine `lmpress serve` runs."
JSON = "application/json"


# --- reply types the `openai` package has no name for, and Anthropic's ------------------------


class OpenAIErrorBody(BaseModel):
    error: ErrorObject


class AnthropicErrorDetail(BaseModel):
    type: str
    message: str


class AnthropicErrorBody(BaseModel):
    type: Literal["error"]
    error: AnthropicErrorDetail


class ContentBlock(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: str  # text, thinking or tool_use, with that block's fields


class AnthropicUsage(BaseModel):
    model_config = ConfigDict(extra="allow")

    input_tokens: int
    output_tokens: int


class AnthropicMessage(BaseModel):
    """A Messages API reply (lmpress does not need the `anthropic` package to serve one)."""

    id: str
    type: Literal["message"]
    role: Literal["assistant"]
    model: str
    content: list[ContentBlock]
    stop_reason: str | None
    stop_sequence: str | None
    usage: AnthropicUsage


class TokensCount(BaseModel):
    input_tokens: int


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[Model]


class FileList(BaseModel):
    object: Literal["list"]
    data: list[FileObject]
    has_more: bool


class BatchList(BaseModel):
    object: Literal["list"]
    data: list[Batch]
    first_id: str | None
    last_id: str | None
    has_more: bool


class EmbeddingOut(Embedding):
    embedding: list[float] | str  # a str with encoding_format base64


class Embeddings(CreateEmbeddingResponse):
    data: list[EmbeddingOut]  # type: ignore[assignment]


# One server-sent event of a streamed answer (as Open API 3.1 describes a stream: by its
# events). Its data is the API's chunk as JSON, and OpenAI's streams end with `[DONE]`.
EVENT = {
    "type": "object",
    "properties": {"event": {"type": "string"}, "data": {"type": "string"}},
    "required": ["data"],
}

# A request each JSON body's document shows (with the served model): each is answered, so a
# client, or a fuzzer's first requests, reach the engine, not only the checks before it.
SAY_HI = [{"role": "user", "content": "Say hi"}]
EXAMPLES: dict[str, list[dict[str, Any]]] = {
    "ChatCompletionBody": [
        {"messages": SAY_HI, "max_tokens": 4},
        {"messages": SAY_HI, "max_tokens": 4, "stream": True},
    ],
    "CompletionBody": [{"prompt": "Once upon a time", "max_tokens": 4}],
    "ResponsesBody": [{"input": "Say hi", "max_output_tokens": 4}],
    "MessagesBody": [{"messages": SAY_HI, "max_tokens": 4}],
    "CountTokensBody": [{"messages": SAY_HI}],
    "EmbeddingsBody": [{"input": "a sentence to embed"}],
    "ScoreBody": [{"text_1": "a query", "text_2": ["a passage", "another passage"]}],
    "RerankBody": [{"query": "a query", "documents": ["a passage", "another passage"]}],
    "TokenizeBody": [{"prompt": "Once upon a time"}],
    "DetokenizeBody": [{"tokens": [1, 2, 3]}],
    "CreateBatchBody": [
        {"input_file_id": "file-1", "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    ],
}


# --- what a route declares -------------------------------------------------------------------


def json_body(model: type[BaseModel]) -> dict[str, Any]:
    """A route's `openapi_extra`: its JSON body is `model` (the route validates it itself)."""
    schema = model.model_json_schema(ref_template=REF)
    content = {JSON: {"schema": schema}}
    return {"requestBody": {"required": True, "content": content}}


def form_body(fields: dict[str, Any], required: list[str]) -> dict[str, Any]:
    """A route's `openapi_extra`: its body is a multipart form of `fields`."""
    schema = {"type": "object", "properties": fields, "required": required}
    content = {"multipart/form-data": {"schema": schema}}
    return {"requestBody": {"required": True, "content": content}}


def replies(
    ok: type[BaseModel] | None = None,
    *,
    stream: bool = False,
    media: str | None = None,
    anthropic: bool = False,
) -> dict[int | str, dict[str, Any]]:
    """A route's `responses`: `ok` as JSON (or `media`, or any JSON object), a server-sent event
    stream too where the route streams, and the API's error object for the rest."""
    if media is not None:
        success: dict[str, Any] = {"content": {media: {"schema": {"type": "string"}}}}
    elif ok is not None:
        success = {"model": ok}
    else:
        success = {"content": {JSON: {"schema": {"type": "object"}}}}
    if stream:
        success.setdefault("content", {})["text/event-stream"] = {"schema": EVENT}
    error = AnthropicErrorBody if anthropic else OpenAIErrorBody
    return {
        200: {"description": "the answer", **success},
        "4XX": {"description": "a request the server refuses", "model": error},
        "5XX": {"description": "the server or its engine failed", "model": error},
    }


# --- the document ----------------------------------------------------------------------------


def install(app: FastAPI, model_name: str, api_key: str | None) -> None:
    """Build `app`'s document (once, on its first request) from its routes."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = get_openapi(
                title=app.title, version=app.version, routes=app.routes, description=ABOUT
            )
            for name in _hoist_bodies(document):
                _served_model(document["components"]["schemas"][name], model_name)
            if api_key is not None:
                _require_key(document)
            app.openapi_schema = document
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _operations(document: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [
        (path, operation)
        for path, item in document.get("paths", {}).items()
        for operation in item.values()
    ]


def _hoist_bodies(document: dict[str, Any]) -> list[str]:
    """Each JSON body's schema, and the models it refers to, into the components, where the
    replies' already are: one definition a model, referred to by name. Returns the bodies'
    names."""
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    bodies = []
    for _, operation in _operations(document):
        content = operation.get("requestBody", {}).get("content", {}).get(JSON)
        if content is None or "$ref" in content["schema"]:
            continue
        schema = content["schema"]
        defs = {**schema.pop("$defs", {}), schema["title"]: schema}
        for name, definition in defs.items():
            known = schemas.setdefault(name, definition)
            if json.dumps(known, sort_keys=True) != json.dumps(definition, sort_keys=True):
                raise AssertionError(f"two request models named {name}: rename one")
        content["schema"] = {"$ref": REF.format(model=schema["title"])}
        bodies.append(schema["title"])
    return bodies


def _served_model(schema: dict[str, Any], model_name: str) -> None:
    """A body's `model`: the one this server serves, which every route requires (a batch line
    may leave it out, so the model itself does not); and its examples, naming that model."""
    served = {"model": model_name} if "model" in schema.get("properties", {}) else {}
    if served:
        schema["properties"]["model"] = {"type": "string", "enum": [model_name], "title": "Model"}
        if "model" not in schema.setdefault("required", []):
            schema["required"].append("model")
    examples = EXAMPLES.get(schema["title"])
    if examples:
        schema["examples"] = [{**served, **example} for example in examples]


def _require_key(document: dict[str, Any]) -> None:
    """The key, as a bearer token (OpenAI's clients) or `x-api-key` (Anthropic's), on every
    route that needs it (`asgi.guarded`)."""
    document["components"]["securitySchemes"] = {
        "bearer": {"type": "http", "scheme": "bearer"},
        "x-api-key": {"type": "apiKey", "in": "header", "name": "x-api-key"},
    }
    for path, operation in _operations(document):
        if guarded(path):
            operation["security"] = [{"bearer": []}, {"x-api-key": []}]
