"""The routes about the models a server holds: `/v1/models` (each model and each of its LoRA
adapters, an adapter with `parent` = its base's name and `root` = its files, as vLLM lists LoRA
modules), and vLLM's `/v1/load_lora_adapter` and `/v1/unload_lora_adapter`.

Loading an adapter reads a path the client names from the server's disk, so those two routes
answer only where the server was started with --allow-runtime-lora (`serve.allow_runtime_lora`,
as vLLM asks for VLLM_ALLOW_RUNTIME_LORA_UPDATING); like every /v1 route they need the API key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi import Request as HttpRequest
from fastapi.responses import PlainTextResponse
from openai.types import Model as OpenAIModel
from pydantic import BaseModel, ConfigDict

from lmpress.serve import openapi
from lmpress.serve.asgi import read_body
from lmpress.serve.router import ModelEntry, ModelRouter
from lmpress.vocabulary.errors import LmpressError
from lmpress.wire.openai import responses
from lmpress.wire.openai.errors import ApiError
from lmpress.wire.openai.requests import parse_body

OWNER = "lmpress"


class LoadLoraBody(BaseModel):
    """vLLM's body, and `model`: the base to load it on, where the server holds several."""

    model_config = ConfigDict(extra="forbid", strict=True)
    lora_name: str
    lora_path: str
    model: str | None = None


class UnloadLoraBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    lora_name: str
    lora_int_id: int | None = None  # vLLM's clients may send it; the name says which


def cards(router: ModelRouter) -> list[dict[str, Any]]:
    """Every model, loaded or not, then each of its adapters."""
    out = []
    for entry in router.entries.values():
        root = entry.config.model.model_name or None
        out.append(responses.model_card(entry.name, router.created, OWNER, root=root))
        for name, path in entry.adapters.items():
            card = responses.model_card(name, router.created, OWNER, root=path, parent=entry.name)
            out.append(card)
    return out


def register(app: FastAPI, router: ModelRouter) -> None:
    """The model routes of `app`, over `router`'s models."""

    @app.get("/v1/models", response_model=None, responses=openapi.replies(openapi.ModelList))
    async def list_models() -> dict[str, Any]:
        return {"object": "list", "data": cards(router)}

    @app.get("/v1/models/{model:path}", response_model=None, responses=openapi.replies(OpenAIModel))
    async def get_model(model: str) -> dict[str, Any]:
        router.find(model)  # 404 for a name not served
        return next(card for card in cards(router) if card["id"] == model)

    @app.post("/v1/load_lora_adapter", response_model=None, responses=openapi.replies())
    async def load_lora_adapter(request: HttpRequest) -> PlainTextResponse:
        body = parse_body(LoadLoraBody, await _lora_body(request, router))
        entry = _base(router, body.model)
        if any(body.lora_name in other.names() for other in router.entries.values()):
            raise ApiError(
                400,
                f"The lora adapter '{body.lora_name}' has already been loaded (or names a "
                f"model); unload it first or pick another lora_name",
                param="lora_name",
            )
        if not Path(body.lora_path).expanduser().exists():
            raise ApiError(400, f"lora_path '{body.lora_path}' does not exist", param="lora_path")
        router.take(entry)  # loaded first if it is not, so the engine checks the adapter now
        try:
            server = await router.hold(entry)
            await _engine_call(server.engine.load_adapter(body.lora_name, body.lora_path))
        finally:
            router.release(entry)
        entry.adapters[body.lora_name] = body.lora_path  # and on every later load of the model
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")

    @app.post("/v1/unload_lora_adapter", response_model=None, responses=openapi.replies())
    async def unload_lora_adapter(request: HttpRequest) -> PlainTextResponse:
        body = parse_body(UnloadLoraBody, await _lora_body(request, router))
        entry = next((e for e in router.entries.values() if body.lora_name in e.adapters), None)
        if entry is None:
            raise ApiError(
                404,
                f"The lora adapter '{body.lora_name}' cannot be found",
                param="lora_name",
                code="model_not_found",
            )
        if entry.server is not None:
            await _engine_call(entry.server.engine.unload_adapter(body.lora_name))
        del entry.adapters[body.lora_name]
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")


async def _lora_body(request: HttpRequest, router: ModelRouter) -> bytes:
    if not router.settings.allow_runtime_lora:
        raise ApiError(
            404,
            f"{request.url.path} is off: loading adapters at run time reads paths a client "
            f"names from this server's disk; start the server with --allow-runtime-lora",
            code="not_found",
        )
    return await read_body(request, router.settings.max_body_bytes)


def _base(router: ModelRouter, model: str | None) -> ModelEntry:
    """The model an adapter is loaded on: the one named, or the server's only one."""
    if model is not None:
        entry = router.entries.get(model)
        if entry is None:
            router.find(model)  # an adapter's name: 404 names what is served
            raise ApiError(400, f"'{model}' is an adapter; name its base model", param="model")
        return entry
    if len(router.entries) > 1:
        raise ApiError(
            400,
            "this server holds several models: name the one to load the adapter on in 'model'",
            param="model",
        )
    return next(iter(router.entries.values()))


async def _engine_call(call: Any) -> None:
    """An engine's adapter call; what it refuses (an engine that cannot, files that are not an
    adapter of this model) is the client's 400."""
    try:
        await call
    except (LmpressError, ValueError, OSError) as exc:  # OSError, ValueError: PEFT's reading
        raise ApiError(400, str(exc), param="lora_path") from exc
