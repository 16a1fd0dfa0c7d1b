"""Retrying a remote request: sorting an attempt's failure (`classify`), and counting a
request's attempts against remote_params.max_retries (`Attempts`).

`classify` works on both SDKs' exceptions and on their transports' (httpx, aiohttp) without
importing any of them, so that every remote engine sorts failures the same way.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lmpress.engines.remote.pacing import parse_retry_after
from lmpress.vocabulary.errors import ErrorKind, RequestError
from lmpress.wire.replies import MalformedResponse

# 408 and 409 are retried too, as both SDKs do: a timeout and a conflict say "try again".
RETRYABLE_STATUS = frozenset({408, 409, 429})
# Statuses that mean "you are sending too much": they lower concurrency for everyone.
OVERLOAD_STATUS = frozenset({429, 503, 529})
STATUS_KINDS: dict[int, ErrorKind] = {
    400: ErrorKind.BAD_REQUEST,
    401: ErrorKind.AUTHENTICATION_ERROR,
    403: ErrorKind.PERMISSION_DENIED,
    404: ErrorKind.NOT_FOUND,
    408: ErrorKind.TIMEOUT,
    409: ErrorKind.CONFLICT,
    413: ErrorKind.REQUEST_TOO_LARGE,
    422: ErrorKind.UNPROCESSABLE_ENTITY,
    429: ErrorKind.RATE_LIMITED,
}


def status_kind(status: int) -> ErrorKind:
    """The kind of an HTTP error status (an engine may refine it: Anthropic's 529)."""
    if status >= 500:
        return ErrorKind.SERVER_ERROR
    return STATUS_KINDS.get(status, ErrorKind.HTTP_ERROR)


@dataclass
class Failure:
    """One failed attempt, sorted."""

    kind: ErrorKind
    message: str
    status: int | None = None
    retryable: bool = False
    retry_after: float | None = None

    @property
    def overloaded(self) -> bool:
        return self.status in OVERLOAD_STATUS


# Rate-limit pushback a request may be excused, as a multiple of max_retries.
EXCUSED_PER_RETRY = 4


@dataclass
class Attempts:
    """A request's tries so far, and whether a failure may be tried again.

    `max_retries` bounds the failures charged to the request. A 429 (or 503, 529) while other
    requests are getting through (see `Pacer.release`) is contention for the provider's rate
    limit, not the request's failure: up to EXCUSED_PER_RETRY * max_retries of those are not
    charged, so that no row runs out of retries while the engine finds and keeps to the limit.
    A provider that turns everything away ends each row after max_retries."""

    max_retries: int
    charged: int = 0
    excused: int = 0

    @property
    def made(self) -> int:
        return 1 + self.charged + self.excused

    def backoff_index(self) -> int:
        """The exponent for the next retry's backoff (0 for the first charged retry)."""
        return self.charged

    def may_retry(self, failure: Failure, excusable: bool) -> bool:
        """Count the failure; True when the request may go again."""
        if not failure.retryable:
            return False
        if excusable and self.excused < EXCUSED_PER_RETRY * self.max_retries:
            self.excused += 1
            return True
        if self.charged >= self.max_retries:
            return False
        self.charged += 1
        return True


# --- sorting failures --------------------------------------------------------------------------

# Exception class names, looked for along an exception's chain of causes, so that both SDKs and
# both HTTP backends (httpx, aiohttp) sort the same way without importing any of them. A dropped
# connection is looked for first: the aiohttp backend reports one as a connect *timeout*.
_DROPPED_NAMES = frozenset({
    "ServerDisconnectedError", "RemoteProtocolError", "ClientPayloadError", "ClientOSError",
    "ReadError", "WriteError", "ConnectError", "ClientConnectorError", "ConnectionResetError",
    "BrokenPipeError", "EndOfStream", "IncompleteRead", "ContentLengthError",
})  # fmt: skip
_TIMEOUT_NAMES = frozenset({
    "TimeoutException", "APITimeoutError", "TimeoutError", "SocketTimeoutError",
    "ServerTimeoutError",
})  # fmt: skip
_CONNECTION_NAMES = frozenset({
    "APIConnectionError", "TransportError", "NetworkError", "ProtocolError", "ConnectionError",
    "ClientConnectionError", "BrokenResourceError", "ClosedResourceError",
})  # fmt: skip
_MALFORMED = (MalformedResponse, json.JSONDecodeError, UnicodeDecodeError)


def classify(exc: BaseException, kind_of: Callable[[int], ErrorKind], timeout_s: float) -> Failure:
    """Sort one attempt's exception: what kind, which HTTP status, retry or not, how long the
    server asked us to wait. `kind_of` names an HTTP status's kind (the engine's
    `status_kind`); `timeout_s` is the timeout a timeout message names."""
    if isinstance(exc, RequestError):
        return Failure(exc.kind, str(exc), exc.status)
    status = getattr(exc, "status_code", None)
    response = getattr(exc, "response", None)
    if isinstance(status, int) and 200 <= status < 300:
        # An error event inside a 200 stream: sort it by the error's type.
        error_type = _error_type(getattr(exc, "body", None))
        status = {"rate_limit_error": 429, "overloaded_error": 529}.get(error_type, 500)
    if isinstance(status, int) and response is not None:
        retry_after = parse_retry_after(getattr(response, "headers", None))
        return Failure(
            kind=kind_of(status),
            message=_status_message(exc),
            status=status,
            retryable=status in RETRYABLE_STATUS or status >= 500,
            retry_after=retry_after,
        )
    names = {cls.__name__ for cause in _causes(exc) for cls in type(cause).__mro__}
    if isinstance(exc, _MALFORMED) or "ValidationError" in names:
        return Failure(ErrorKind.MALFORMED_RESPONSE, _describe(exc), retryable=True)
    cause = connection_cause(exc)
    if cause is not None:  # before timeouts: some transports report a refusal as one
        deepest = _causes(exc)[-1]
        detail = f"{type(deepest).__name__}: {str(deepest).strip()}"
        return Failure(ErrorKind.CONNECTION_ERROR, f"{cause} ({detail})", retryable=True)
    if names & _DROPPED_NAMES:
        return Failure(ErrorKind.CONNECTION_ERROR, _describe(exc), retryable=True)
    if names & _TIMEOUT_NAMES:
        message = f"timeout: no response within {timeout_s:g}s"
        return Failure(ErrorKind.TIMEOUT, message, retryable=True)
    if names & _CONNECTION_NAMES:
        return Failure(ErrorKind.CONNECTION_ERROR, _describe(exc), retryable=True)
    return Failure(ErrorKind.CLIENT_ERROR, _describe(exc))


# What, along an exception's causes, says why a connection failed: class names and the texts
# that the OS, asyncio, httpx and aiohttp put in their messages.
_CONNECTION_CAUSES = (
    ("connection refused", {"ConnectionRefusedError"}, ("connection refused", "connect call failed")),
    ("DNS lookup failed", {"gaierror", "ClientConnectorDNSError"},
     ("name or service not known", "nodename nor servname", "temporary failure in name resolution",
      "getaddrinfo failed", "no address associated")),
    ("TLS error", {"SSLError", "SSLCertVerificationError", "ClientConnectorCertificateError",
                   "ClientConnectorSSLError", "ClientSSLError"},
     ("certificate verify failed", "[ssl:", "wrong version number", "tlsv1")),
)  # fmt: skip


def connection_cause(exc: BaseException) -> str | None:
    """'connection refused', 'DNS lookup failed' or 'TLS error' when the chain of causes says
    so; a user fixes each differently, and an SDK's "Connection error." or "Request timed out"
    names none of them."""
    chain = _causes(exc)
    names = {cls.__name__ for cause in chain for cls in type(cause).__mro__}
    text = " ".join(str(cause) for cause in chain).lower()
    for label, classes, phrases in _CONNECTION_CAUSES:
        if names & classes or any(phrase in text for phrase in phrases):
            return label
    return None


def _causes(exc: BaseException) -> list[BaseException]:
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and len(chain) < 6 and all(c is not current for c in chain):
        chain.append(current)
        current = current.__cause__ or current.__context__
    return chain


def _error_type(body: Any) -> str | None:
    error = body.get("error", body) if isinstance(body, dict) else None
    return error.get("type") if isinstance(error, dict) else None


def _status_message(exc: BaseException) -> str:
    """The provider's own error message, else the SDK's."""
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return error["message"]
    return str(getattr(exc, "message", None) or exc)


def _describe(exc: BaseException) -> str:
    """The exception and its causes in one line: an SDK's "Connection error." says little, the
    transport error under it says what happened."""
    parts = []
    for cause in _causes(exc)[:3]:
        text = str(cause).strip().splitlines()[0] if str(cause).strip() else ""
        parts.append(f"{type(cause).__name__}: {text}" if text else type(cause).__name__)
    return " <- ".join(parts)
