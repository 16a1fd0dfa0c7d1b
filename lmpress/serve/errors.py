"""How `lmpress serve` answers what goes wrong: every error in the API's own shape (OpenAI's
error object, or Anthropic's on the Messages routes), with a status that says whose fault it
was, never FastAPI's `{"detail": ...}` or a library's words.

A route raises `ApiError` for what it refuses. What the framework refuses before a route runs
(an unknown path, a method the path does not take, a query parameter of the wrong type) is
answered here in the same shape; a 405 names the methods the path takes in `Allow`, as HTTP
asks. Anything else is a bug: a 500 that says so, the traceback in the server's log only.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI
from fastapi import Request as HttpRequest
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from lmpress.serve.asgi import error_response, request_log
from lmpress.wire.anthropic.server import MESSAGES_PATH, anthropic_error
from lmpress.wire.openai.errors import ApiError

log = logging.getLogger("lmpress.serve")

HTTP_CODES = {404: "not_found", 405: "method_not_allowed"}


def install(app: FastAPI) -> None:
    """Answer every exception a request can end in, in the API's shape."""
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _invalid_parameter)
    app.add_exception_handler(ClientDisconnect, _disconnected)
    app.add_exception_handler(Exception, _internal_error)


def answer(request: HttpRequest, error: ApiError) -> JSONResponse:
    """`error` in the shape of the API the request's path belongs to."""
    if request.url.path.startswith(MESSAGES_PATH):
        error = anthropic_error(error)
    return error_response(error)


def allowed_methods(app: FastAPI, path: str) -> list[str]:
    """The methods some route of `app` takes at `path` (a path can have one route a method)."""
    methods: set[str] = set()
    for route in app.router.routes:
        regex = getattr(route, "path_regex", None)
        if regex is not None and regex.match(path):
            methods |= getattr(route, "methods", None) or set()
    return sorted(methods)


async def _api_error(request: HttpRequest, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return answer(request, exc)


async def _http_error(request: HttpRequest, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    where = f"{request.method} {request.url.path}"
    headers = {k: v for k, v in (exc.headers or {}).items() if k.lower() != "allow"}
    if exc.status_code == 404:
        message = f"no route {where}"
    elif exc.status_code == 405:
        allowed = allowed_methods(request.app, request.url.path)
        headers["allow"] = ", ".join(allowed)
        message = f"{where}: this path takes {' or '.join(allowed)}"
    else:
        message = f"{where}: {exc.detail}"
    code = HTTP_CODES.get(exc.status_code)
    error = ApiError(exc.status_code, message, code=code, headers=headers)
    return answer(request, error)


async def _invalid_parameter(request: HttpRequest, exc: Exception) -> JSONResponse:
    """A path or query parameter of the wrong type: 400, naming it, as a body argument is."""
    assert isinstance(exc, RequestValidationError)
    first = exc.errors()[0]
    name = ".".join(str(part) for part in first["loc"][1:]) or str(first["loc"][0])
    if first["type"] == "missing":
        error = ApiError(400, f"Missing required parameter: '{name}'", param=name)
    else:
        error = ApiError(400, f"Invalid value for '{name}': {first['msg']}", param=name)
    return answer(request, error)


async def _disconnected(request: HttpRequest, exc: Exception) -> JSONResponse:
    request_log(request.scope).cancelled = True
    return answer(request, ApiError(400, "the client went away while sending its request"))


async def _internal_error(request: HttpRequest, exc: Exception) -> JSONResponse:
    request_id = request_log(request.scope).id
    log.exception("internal error in %s", request_id)
    message = f"internal server error; the server's log has the details ({request_id})"
    # Answered outside the middleware that names every answer: named here.
    headers = {"x-request-id": request_id}
    return answer(request, ApiError(500, message, type="server_error", headers=headers))
