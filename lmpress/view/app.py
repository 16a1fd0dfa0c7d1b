"""The viewer's HTTP side: a FastAPI app serving the page (lmpress/view/static/) and the JSON
API the page reads (its routes below; docs/looking-at-results.md), and `serve`, which runs
it with uvicorn on a socket bound before the first request.

Every answer is JSON of plain text: the page sets it as text, never as HTML. The work a
request asks (an index to build or extend, a search through the file, rows to read) runs on a
worker thread (`asyncio.to_thread`), so the event loop keeps answering /api/live while a
search runs. With an API key (needed to listen beyond this machine), every route asks for it:
as serve takes it (`Authorization: Bearer KEY`, `x-api-key`), or once as `?key=KEY` on the
page's address, which leaves a cookie the page's own requests then carry.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import math
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

import lmpress.view.compare as compare
import lmpress.view.rows as rows
import lmpress.view.stats as stats
from lmpress.serve.asgi import carries_key
from lmpress.serve.server import listen as serve_listen
from lmpress.view.layout import DATASET, SourceKind
from lmpress.view.query import ONE_PAGE_MOST, Filters, QueryError, select
from lmpress.view.sources import OpenSource
from lmpress.vocabulary.errors import LmpressError, Terminated

STATIC = Path(__file__).resolve().parent / "static"
COOKIE = "lmpress_view_key"
# The page and everything it loads come from this server; rows' images are data: URLs.
SECURITY_HEADERS = [
    (b"content-security-policy", b"default-src 'self'; img-src 'self' data:; "
     b"style-src 'self' 'unsafe-inline'; script-src 'self'; object-src 'none'; "
     # A notebook on this machine (Jupyter's page, VS Code's webview) shows the page framed.
     b"frame-ancestors 'self' http://localhost:* http://127.0.0.1:* "
     b"vscode-webview:; base-uri 'none'"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
]  # fmt: skip


class Viewer:
    """The sources the viewer shows: `a` (PATH) and `b` (PATH2), opened at start, so a bad
    path is said before the server listens."""

    def __init__(self, paths: list[str]):
        self.sources = {
            name: OpenSource(path, name) for name, path in zip("ab", paths, strict=False)
        }

    def source(self, spec: str | None) -> tuple[OpenSource, str | None]:
        """The source a request names (`a`, `b`, or `a:MODEL` for one model of it)."""
        name, _, model = (spec or "a").partition(":")
        found = self.sources.get(name)
        if found is None:
            raise QueryError(f"source={spec}: no such source (this viewer has "
                             f"{', '.join(self.sources)})")  # fmt: skip
        return found, model or None

    def close(self) -> None:
        for source in self.sources.values():
            source.close()


def _int(params: dict[str, str], name: str, default: int, most: int | None = None) -> int:
    try:
        value = int(params.get(name, default))
    except ValueError:
        raise QueryError(f"{name}={params[name]}: give a whole number") from None
    if value < 0:
        raise QueryError(f"{name}={value}: give a number of 0 or more")
    return min(value, most) if most is not None else value


# --- the API, each answer made on a worker thread ---------------------------------------------


def sources_answer(viewer: Viewer, params: dict[str, str]) -> dict[str, Any]:
    listed = []
    for name, source in viewer.sources.items():
        snapshot = source.refresh()
        table = snapshot.table
        layout = snapshot.layout
        column = "step" if layout.kind in (SourceKind.PIPELINE, SourceKind.EVAL) else "model"
        counts = table.counts(column)
        names = table.labels[column]
        if layout.kind is SourceKind.PIPELINE:
            names = [n for n in (DATASET, *layout.steps) if n in counts or n != DATASET]
        listed.append(
            {
                "id": name,
                "path": source.given,
                "kind": layout.kind.value,
                "rows": snapshot.rows,
                "live": source.running(snapshot) is not None,
                "indexing": snapshot.indexing,
                "problems": source.problems(snapshot),
                "parts": [{"name": part, "rows": counts.get(part, 0)} for part in names],
            }
        )
    return {"sources": listed}


def overview_answer(viewer: Viewer, params: dict[str, str]) -> dict[str, Any]:
    source, _ = viewer.source(params.get("source"))
    return stats.overview(source, source.refresh())


def rows_answer(viewer: Viewer, params: dict[str, str]) -> dict[str, Any]:
    source, model = viewer.source(params.get("source"))
    snapshot = source.refresh()
    filters = Filters.of({**params, **({"model": model} if model else {})})
    chosen = select(source, snapshot, filters)
    offset = _int(params, "offset", 0)
    limit = _int(params, "limit", 100, ONE_PAGE_MOST)
    page = rows.table_rows(source, snapshot, chosen, offset, limit)
    # Filters on facts find only the rows whose facts are read: the total may grow.
    partial = snapshot.indexing is not None and filters.on_facts
    return {"total": int(len(chosen)), "offset": offset, "rows": page, "partial": partial}


def row_answer(viewer: Viewer, params: dict[str, str]) -> dict[str, Any]:
    source, _ = viewer.source(params.get("source"))
    if "n" not in params:
        raise QueryError("n: give the row's number (its n in /api/rows)")
    n = _int(params, "n", 0)
    found = rows.one_row(source, source.refresh(), n)
    if found is None:
        raise NotFound(f"n={n}: no such row in source {source.name}")
    return found


def _sides(viewer: Viewer, params: dict[str, str]) -> tuple[compare.Side, compare.Side]:
    a, model_a = viewer.source(params.get("a", "a"))
    b, model_b = viewer.source(params.get("b", "b" if "b" in viewer.sources else "a"))
    return compare.side(a, model_a), compare.side(b, model_b)


def compare_answer(viewer: Viewer, params: dict[str, str]) -> dict[str, Any]:
    only = params.get("only", "all")
    if only not in compare.ONLY:
        raise QueryError(f"only={only}: use {', '.join(compare.ONLY)}")
    a, b = _sides(viewer, params)
    offset = _int(params, "offset", 0)
    return compare.listing(a, b, only, offset, _int(params, "limit", 100, ONE_PAGE_MOST))


def compare_row_answer(viewer: Viewer, params: dict[str, str]) -> dict[str, Any]:
    if "id" not in params:
        raise QueryError("id: give the row's id")
    a, b = _sides(viewer, params)
    return compare.one(a, b, params["id"])


def live_answer(viewer: Viewer, params: dict[str, str]) -> dict[str, Any]:
    source, _ = viewer.source(params.get("source"))
    snapshot = source.refresh(force=True)  # what the page polls: the file as it is now
    source.live.observe(snapshot.rows)
    live = stats.live_state(source, snapshot, source.running(snapshot))
    return {
        "rows": snapshot.rows,
        "running": live["running"],
        "rate_rows_per_s": live["rate_rows_per_s"],
        "eta_s": live["eta_s"],
        "indexing": snapshot.indexing,
    }


ANSWERS: dict[str, Callable[[Viewer, dict[str, str]], dict[str, Any]]] = {
    "/api/sources": sources_answer,
    "/api/overview": overview_answer,
    "/api/rows": rows_answer,
    "/api/row": row_answer,
    "/api/compare": compare_answer,
    "/api/compare_row": compare_row_answer,
    "/api/live": live_answer,
}


class TextJSON(JSONResponse):
    """JSON as the page reads it: a number JSON has no word for (NaN, an infinity) as null,
    and a lone surrogate a line escaped (valid JSON, no UTF-8) escaped again."""

    def render(self, content: Any) -> bytes:
        try:
            return orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY)
        except TypeError:  # a lone surrogate, an integer beyond 64 bits
            return json.dumps(_finite(content), ensure_ascii=True).encode()


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


class NotFound(LookupError):
    """A row or source the request names is not there (404)."""


def _error(status: int, message: str) -> JSONResponse:
    return TextJSON({"error": {"message": message}}, status_code=status)


def create_app(viewer: Viewer, api_key: str | None = None) -> FastAPI:
    app = FastAPI(title="lmpress view", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.viewer = viewer

    def route(answer: Callable[[Viewer, dict[str, str]], dict[str, Any]]):
        async def endpoint(request: Request) -> Any:
            params = dict(request.query_params)
            try:
                return TextJSON(await asyncio.to_thread(answer, viewer, params))
            except QueryError as exc:
                return _error(400, str(exc))
            except NotFound as exc:
                return _error(404, str(exc))
            except (LmpressError, OSError) as exc:
                return _error(409, f"cannot read the output now: {exc}")

        return endpoint

    for path, answer in ANSWERS.items():
        app.add_api_route(path, route(answer), methods=["GET"])

    @app.get("/")
    async def page() -> Any:
        index = STATIC / "index.html"
        if not index.exists():
            return _error(404, "the page is not installed (lmpress/view/static/index.html)")
        return FileResponse(index, media_type="text/html; charset=utf-8")

    @app.get("/static/{name:path}")
    async def static(name: str) -> Any:
        path = (STATIC / name).resolve()
        if not path.is_file() or STATIC not in path.parents:
            return _error(404, f"/static/{name}: no such file")
        return FileResponse(path)

    @app.api_route("/{rest:path}", methods=["GET", "POST", "PUT", "DELETE", "PATCH"])
    async def unknown(rest: str) -> Any:
        return _error(404, f"/{rest}: no such route (the API is under /api/)")

    app.add_middleware(ViewKey, api_key=api_key)
    return app


class ViewKey:
    """Every route asks for the key, when the viewer has one; the security headers go on every
    answer. Without a key (a viewer on this machine only), a request must name this machine
    as its Host: a web page elsewhere that points its own name at 127.0.0.1 (DNS rebinding)
    would otherwise read every row."""

    def __init__(self, app: ASGIApp, api_key: str | None):
        self.app = app
        self.expected = api_key.encode() if api_key else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.expected is None and not _names_this_machine(scope):
            await _error(403, "this viewer answers requests to this machine's own address "
                         "only (127.0.0.1, localhost)")(scope, receive, send)  # fmt: skip
            return
        given = self._query_key(scope)
        key_given = (
            self.expected is not None
            and given is not None
            and hmac.compare_digest(given, self.expected)
        )
        if self.expected is not None and not (
            carries_key(dict(scope["headers"]), self.expected)
            or self._cookie_key(scope)
            or key_given
        ):
            await _error(401, "this viewer needs its API key: open the page as /?key=KEY, "
                         "or send 'Authorization: Bearer KEY'")(scope, receive, send)  # fmt: skip
            return
        cookie = key_given  # a wrong ?key= never replaces a good cookie

        async def send_with_headers(message: dict) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", [])) + SECURITY_HEADERS
                if cookie:
                    value = f"{COOKIE}={given.decode()}; Path=/; HttpOnly; SameSite=Strict"
                    headers.append((b"set-cookie", value.encode()))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)

    @staticmethod
    def _query_key(scope: Scope) -> bytes | None:
        from urllib.parse import parse_qs

        found = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("key")
        return found[0].encode() if found else None

    def _cookie_key(self, scope: Scope) -> bool:
        assert self.expected is not None
        for name, value in scope["headers"]:
            if name != b"cookie":
                continue
            for part in value.split(b";"):
                key, _, given = part.strip().partition(b"=")
                if key == COOKIE.encode() and hmac.compare_digest(given, self.expected):
                    return True
        return False


def _names_this_machine(scope: Scope) -> bool:
    """Whether the request's Host header names this machine (a loopback address, localhost)."""
    host = dict(scope["headers"]).get(b"host", b"").decode("latin-1")
    name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    return is_loopback(name.strip("[]"))


# --- listening ----------------------------------------------------------------------------------


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def listen(host: str, port: int) -> socket.socket:
    """A socket bound to host:port (0: a free port) and listening, or a one-line error: serve's."""
    return serve_listen(host, port, "view --host")


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://{f'[{host}]' if ':' in host else host}:{port}/"


def uvicorn_server(app: FastAPI) -> Any:
    import uvicorn

    config = uvicorn.Config(app, log_config=None, access_log=False, lifespan="off")
    return uvicorn.Server(config)


def serve(viewer: Viewer, sock: socket.socket, api_key: str | None) -> int:
    """Serve until Ctrl-C or SIGTERM (exit 0), having printed the address on stdout."""
    server = uvicorn_server(create_app(viewer, api_key))
    print(f"lmpress view: {url_of(sock)}", flush=True)
    try:
        asyncio.run(server.serve(sockets=[sock]))
    except (KeyboardInterrupt, Terminated):  # how the viewer is stopped: not an error
        pass
    finally:
        viewer.close()
    print("lmpress view: stopped", file=sys.stderr)
    return 0
