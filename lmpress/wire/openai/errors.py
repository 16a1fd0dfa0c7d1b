"""Errors in OpenAI's shape: the error object a server answers with, and the HTTP status each
kind of failed request earns (serve's answer, the status of an OpenAI Batch error line)."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from lmpress.vocabulary.errors import ErrorKind
from lmpress.vocabulary.types import ErrorInfo

log = logging.getLogger("lmpress.serve")

# Every kind, decided: a kind added to ErrorKind without a status here fails the test that
# checks this table is whole, rather than reaching clients as a 500.
HTTP_STATUS: dict[ErrorKind, int] = {
    ErrorKind.INVALID_REQUEST: 400,
    ErrorKind.INVALID_JSON: 400,
    ErrorKind.INVALID_ROW: 400,
    ErrorKind.UNSUPPORTED_PARAM: 400,
    ErrorKind.CONTEXT_LENGTH_EXCEEDED: 400,
    ErrorKind.BAD_REQUEST: 400,
    ErrorKind.AUTHENTICATION_ERROR: 401,
    ErrorKind.PERMISSION_DENIED: 403,
    ErrorKind.NOT_FOUND: 404,
    ErrorKind.CONFLICT: 409,
    ErrorKind.REQUEST_TOO_LARGE: 413,
    ErrorKind.UNPROCESSABLE_ENTITY: 422,
    ErrorKind.RATE_LIMITED: 429,
    ErrorKind.OVERLOADED: 503,
    # A remote API or the engine failed: the server's fault as the client sees it.
    ErrorKind.SERVER_ERROR: 500,
    ErrorKind.HTTP_ERROR: 500,
    ErrorKind.TIMEOUT: 500,
    ErrorKind.CONNECTION_ERROR: 500,
    ErrorKind.MALFORMED_RESPONSE: 500,
    ErrorKind.CLIENT_ERROR: 500,
    ErrorKind.BATCH_EXPIRED: 500,
    ErrorKind.INVALID_OUTPUT: 500,
    ErrorKind.GENERATION_ERROR: 500,
    ErrorKind.ENGINE_CLOSED: 500,
}


class ApiError(Exception):
    """A failure to answer with an OpenAI error object and an HTTP status."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        # Imported here: the openai package takes most of a second to import, and a batch job
        # loads this module for its error kinds without ever answering a client.
        from openai.types import ErrorObject

        error = ErrorObject(message=self.message, type=self.type, param=self.param, code=self.code)
        return {
            "error": error.model_dump(mode="json", include={"message", "type", "param", "code"})
        }


def status_of(error: ErrorInfo) -> int:
    """The HTTP status for a failed request: the remote API's own, else its kind's."""
    return error.status if error.status is not None else HTTP_STATUS[error.kind]


def error_from_info(error: ErrorInfo, request_id: str) -> ApiError:
    """The HTTP error for a request the engine could not complete. An exception the engine did
    not foresee is a bug whose words (torch's, a library's) are not the client's to read: the
    client gets the request id, the server's log the exception."""
    status = status_of(error)
    type_ = "invalid_request_error" if 400 <= status < 500 else "server_error"
    message = error.message
    if error.kind == ErrorKind.GENERATION_ERROR:
        log.error("%s: the engine failed: %s", request_id, message)
        message = (
            f"the engine failed on this request; the server's log has the details ({request_id})"
        )
    return ApiError(status, message, type=type_, code=str(error.kind))


def model_not_found(model: str, served: Iterable[str]) -> ApiError:
    """The 404 for a request naming a model the server does not serve, naming those it does."""
    return ApiError(
        404,
        f"The model '{model}' does not exist; this server serves "
        + ", ".join(f"'{name}'" for name in served),
        param="model",
        code="model_not_found",
    )
