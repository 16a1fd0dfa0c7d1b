"""The app of `lmpress serve` over several models: the routes about the models and the server
(health, /v1/models, adapters, /metrics) answered here, every other POST forwarded to the app
of the model its body's `model` names (`app.add_model_routes` over that model's `Server`).

A forwarded request's body is read here (within serve.max_body_bytes) to find the model, then
handed to the model's app as it came, so each route reads, checks and answers it as it does on
a one-model server. The request holds the model, so the router does not unload it, from before
the model is loaded until the last byte of its answer is sent.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

from fastapi import FastAPI
from fastapi import Request as HttpRequest
from starlette.responses import Response as StarletteResponse
from starlette.types import Message, Receive, Scope, Send

from lmpress.configs.schema import ServeParams
from lmpress.engines.base import Engine
from lmpress.serve import errors, metrics, model_routes
from lmpress.serve.app import Server, add_model_routes
from lmpress.serve.asgi import (
    LogRequests,
    RequireKey,
    error_response,
    read_body,
    request_log,
    wait_for_disconnect,
)
from lmpress.serve.router import ModelEntry, ModelRouter
from lmpress.version import __version__
from lmpress.wire.anthropic.server import MESSAGES_PATH, anthropic_error
from lmpress.wire.openai.errors import ApiError


def create_front_app(
    entries: list[ModelEntry], settings: ServeParams, api_key: str | None = None
) -> FastAPI:
    """The app over several models, none loaded yet (`app.state.router.start()` opens the
    remote ones; the caller closes them all with `app.state.router.close()`)."""
    shared = metrics.ServeMetrics(
        entries[0].name,
        lambda: [(e.name, e.server.engine, e.server.slots) for e in router.loaded()],  # type: ignore[union-attr]
        several=True,
    )

    def open_server(entry: ModelEntry, engine: Engine) -> Server:
        own = dataclasses.replace(settings, served_model_name=entry.name)
        server = Server(engine, own, shared)
        inner = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
        add_model_routes(inner, server)
        errors.install(inner)
        entry.app = inner
        return server

    router = ModelRouter(entries, settings, open_server)
    for entry in entries[1:]:
        shared.add_model(entry.name)
    app = FastAPI(title="lmpress", version=__version__, docs_url=None, redoc_url=None)
    app.state.router = router

    @app.get("/health", response_model=None)
    async def health() -> dict[str, Any]:
        models = [
            {
                "model": entry.name,
                "engine": entry.config.engine,
                "loaded": entry.server is not None,
                "requests_in_flight": entry.in_flight,
            }
            for entry in router.entries.values()
        ]
        in_flight = sum(entry.in_flight for entry in router.entries.values())
        return {"status": "ok", "models": models, "requests_in_flight": in_flight}

    model_routes.register(app, router)

    @app.post("/{path:path}", response_model=None)
    async def forward(request: HttpRequest) -> Forwarded:
        body = await read_body(request, settings.max_body_bytes)
        entry = router.find(_named_model(body, router))
        return Forwarded(router, entry, body)

    errors.install(app)
    app.add_middleware(RequireKey, api_key=api_key)
    metrics.install(app, shared)
    app.add_middleware(LogRequests)
    return app


def _named_model(body: bytes, router: ModelRouter) -> str:
    """The body's `model`; a server of one model entry answers a body that names none."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"the request body is not valid JSON: {exc}") from exc
    model = data.get("model") if isinstance(data, dict) else None
    if isinstance(model, str):
        return model
    if len(router.entries) == 1:
        return next(iter(router.entries))
    names = ", ".join(f"'{name}'" for name in router.entries)
    raise ApiError(
        400, f"Missing required parameter: 'model' (this server serves {names})", param="model"
    )


class Forwarded(StarletteResponse):
    """A request handed to its model's app: the model loaded first if it is not (waiting as
    long as the client does), held until the answer's last byte is sent."""

    def __init__(self, router: ModelRouter, entry: ModelEntry, body: bytes):
        self.router = router
        self.entry = entry
        self.body = body
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        entry = self.entry
        self.router.take(entry)
        try:
            loaded = await self._loaded(scope, receive)
            if loaded:
                request_log(scope).model = entry.name
                await entry.app(scope, self._replay(receive), send)
        except ApiError as exc:
            if scope["path"].startswith(MESSAGES_PATH):
                exc = anthropic_error(exc)
            await error_response(exc)(scope, receive, send)
        finally:
            self.router.release(entry)

    async def _loaded(self, scope: Scope, receive: Receive) -> bool:
        """Whether the model is ready (False: the client went away while it loaded)."""
        if self.entry.server is not None:
            return True
        hold = asyncio.ensure_future(self.router.hold(self.entry))
        watch = asyncio.ensure_future(wait_for_disconnect(receive))
        done, _ = await asyncio.wait({hold, watch}, return_when=asyncio.FIRST_COMPLETED)
        watch.cancel()
        if hold in done:
            hold.result()
            return True
        hold.cancel()
        await asyncio.gather(hold, watch, return_exceptions=True)
        request_log(scope).cancelled = True
        return False

    def _replay(self, receive: Receive) -> Receive:
        """`receive` with the body, already read here, given again first."""
        pending = [{"type": "http.request", "body": self.body, "more_body": False}]

        async def replayed() -> Message:
            return pending.pop() if pending else await receive()

        return replayed
