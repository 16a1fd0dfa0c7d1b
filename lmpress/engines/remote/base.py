"""What every remote engine shares: the API key, the retry loop and the pacing around each request.

A provider module (openai_compat, anthropic) subclasses `RemoteEngine` and supplies three
things: `_make_client` (its SDK's async client, built with `client_options`), `_send` (one
non-streaming attempt) and `_send_stream` (one streaming attempt), plus, where the service is
picky, `check_request_params`. Failures of an attempt arrive here as exceptions and are sorted
by `classify`: 429, 5xx, timeouts, dropped connections and malformed bodies are retried with
backoff; other 4xx fail the row at once.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, ClassVar

from lmpress.configs.schema import RunConfig
from lmpress.engines.base import Engine, check_text, error_result
from lmpress.engines.remote.credentials import Redactor, resolve_api_key
from lmpress.engines.remote.pacing import (
    Pacer,
    Ticket,
    backoff_delay,
    estimate_tokens,
    parse_retry_after,
)
from lmpress.errors import ConfigError, RequestError, UnsupportedParamError
from lmpress.types import Delta, ErrorInfo, Request, Result, Sample, Usage

# 408 and 409 are retried too, as both SDKs do: a timeout and a conflict say "try again".
RETRYABLE_STATUS = frozenset({408, 409, 429})
# Statuses that mean "you are sending too much": they lower concurrency for everyone.
OVERLOAD_STATUS = frozenset({429, 503, 529})
STATUS_KINDS = {
    400: "bad_request",
    401: "authentication_error",
    403: "permission_denied",
    404: "not_found",
    408: "timeout",
    409: "conflict",
    413: "request_too_large",
    422: "unprocessable_entity",
    429: "rate_limited",
}
MESSAGE_LIMIT = 500  # characters of a provider's error message kept in a failed row


class MalformedResponse(Exception):
    """A 2xx response whose body is not what the API promises."""


@dataclass
class Failure:
    """One failed attempt, sorted."""

    kind: str
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


@dataclass
class Reply:
    """What one successful attempt produced."""

    samples: list[Sample]
    usage: Usage
    model: str = ""


class RemoteEngine(Engine):
    """An engine that sends each request to an HTTP API, concurrently, paced and retried."""

    default_api_url: ClassVar[str | None] = None
    default_key_env: ClassVar[str | None] = None
    key_required: ClassVar[bool] = True  # False: a keyless local server is fine
    model_required: ClassVar[bool] = True
    # Endpoint paths the SDK appends to the base URL, longest first: an api_url that ends in
    # one (Oumi's configs name the full endpoint) is cut back to its base.
    endpoint_paths: ClassVar[tuple[str, ...]] = ()

    def __init__(self, config: RunConfig):
        super().__init__(config)
        remote = config.remote_params
        self.remote = remote
        self.api_url = self.base_url(remote.api_url or self.default_api_url or "")
        if not self.api_url:
            raise ConfigError(
                f"engine {self.name} needs remote_params.api_url, the server's base URL "
                f"(e.g. --remote_params.api_url http://127.0.0.1:8000/v1)"
            )
        self.api_key = resolve_api_key(self)
        self.redactor = Redactor([self.api_key] if self.api_key else [])
        if self.model_required and not config.model.model_name:
            raise ConfigError(
                f"model.model_name: engine {self.name} needs the provider's model name "
                f"(--model.model_name NAME)"
            )
        try:
            self.check_request_params(config.generation)
        except RequestError as exc:
            raise UnsupportedParamError(f"engine {self.name}: {exc}") from exc
        # Callers keep twice num_workers submitted, as NATIVE keeps two batches: a row waiting
        # out a retry's backoff must not leave a worker idle (600 rows, 10% of them 500 once:
        # 6% faster than num_workers). The pacer still lets only num_workers requests out.
        self.max_in_flight = 2 * remote.num_workers
        self.pacer = Pacer(
            remote.num_workers,
            remote.requests_per_minute,
            remote.input_tokens_per_minute,
            remote.output_tokens_per_minute,
            remote.politeness_policy,
            adaptive=remote.use_adaptive_concurrency,
        )
        self._client: Any = None
        self._client_loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def base_url(cls, url: str) -> str:
        """The base URL the SDK takes, from a base URL or a full endpoint URL."""
        url = url.strip().rstrip("/")
        for path in cls.endpoint_paths:
            if url.endswith(path):
                return url[: -len(path)]
        return url

    # --- what a provider module supplies ---------------------------------------------------

    def _make_client(self) -> Any:
        raise NotImplementedError

    async def _send(self, client: Any, request: Request) -> Reply:
        """One non-streaming attempt. Raises on any failure."""
        raise NotImplementedError

    def _send_stream(self, client: Any, request: Request) -> AsyncIterator[Delta | Reply]:
        """One streaming attempt: Deltas, then one Reply. Raises on any failure."""
        raise NotImplementedError

    def _estimate(self, request: Request) -> int:
        """The request's input tokens, roughly, before the provider counts them."""
        if request.prompt is not None:
            return estimate_tokens(len(request.prompt))
        chars = sum(len(m.text()) for m in request.messages)
        images = sum(
            1
            for m in request.messages
            if not isinstance(m.content, str)
            for part in m.content
            if part.type == "image_url"
        )
        return estimate_tokens(chars, len(request.messages), images)

    def check_request_params(self, params: Any) -> None:
        """Refuse, before any request, parameter values this provider cannot take (a
        guided_decoding form it lacks, say). Raise ConfigError or RequestError."""

    def status_kind(self, status: int) -> str:
        if status >= 500:
            return "server_error"
        return STATUS_KINDS.get(status, "http_error")

    # --- the interface ---------------------------------------------------------------------

    async def complete(self, request: Request) -> Result:
        started = time.perf_counter()
        try:
            check_text(request)
            self.check_request_params(request.params)
        except (RequestError, ConfigError) as exc:
            return error_result(request, self, ErrorInfo("invalid_request", str(exc)), started)
        client = self._client_for_loop()
        input_tokens = self._estimate(request)
        output_tokens = request.params.max_new_tokens * request.params.n
        attempts = Attempts(self.remote.max_retries)
        while True:
            ticket = await self.pacer.acquire(input_tokens, output_tokens)
            try:
                reply = await self._send(client, request)
            except Exception as exc:
                failure, excusable = self._fail(ticket, exc)
            except BaseException:  # cancelled: the caller went away; free the slot
                self.pacer.release(ticket, ok=False)
                raise
            else:
                self._succeed(ticket, reply)
                return self._result(request, reply, started)
            delay = self._delay(attempts.backoff_index(), failure)
            if not attempts.may_retry(failure, excusable):
                return self._failed(request, failure, attempts.made, started)
            await asyncio.sleep(delay)

    async def stream(self, request: Request) -> AsyncIterator[Delta | Result]:
        """Deltas as the provider streams them, then the Result. An attempt that fails before
        its first delta is retried like `complete`; one that fails midway ends the request
        with an error, since the text already handed out cannot be taken back."""
        started = time.perf_counter()
        try:
            check_text(request)
            self.check_request_params(request.params)
        except (RequestError, ConfigError) as exc:
            yield error_result(request, self, ErrorInfo("invalid_request", str(exc)), started)
            return
        client = self._client_for_loop()
        input_tokens = self._estimate(request)
        output_tokens = request.params.max_new_tokens * request.params.n
        attempts = Attempts(self.remote.max_retries)
        while True:
            ticket = await self.pacer.acquire(input_tokens, output_tokens)
            sent_any = False
            released = False
            try:
                async with aclosing(self._send_stream(client, request)) as items:
                    async for item in items:
                        if isinstance(item, Reply):
                            self._succeed(ticket, item)
                            released = True
                            yield self._result(request, item, started)
                            return
                        sent_any = True
                        yield item
                raise MalformedResponse("the stream ended without a final message")
            except Exception as exc:
                if released:
                    raise
                failure, excusable = self._fail(ticket, exc)
                released = True
            finally:
                if not released:  # the consumer went away mid-stream
                    self.pacer.release(ticket, ok=False)
            delay = self._delay(attempts.backoff_index(), failure)
            if sent_any or not attempts.may_retry(failure, excusable):
                yield self._failed(request, failure, attempts.made, started)
                return
            await asyncio.sleep(delay)

    async def _complete_all(self, requests: list[Request], progress: bool) -> list[Result]:
        try:
            return await super()._complete_all(requests, progress)
        finally:
            await self.aclose()  # `generate` runs its own event loop; the client dies with it

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            try:
                await client.close()
            except RuntimeError:  # made on an event loop that is gone
                pass

    # --- the parts ---------------------------------------------------------------------------

    def _client_for_loop(self) -> Any:
        """The SDK client for the running event loop. Its connections belong to the loop that
        opened them, so a new loop (each `generate()` call runs one) gets a new client."""
        loop = asyncio.get_running_loop()
        if self._client is None or self._client_loop is not loop:
            if self._client is None:
                # The SDKs leave hundreds of thousands of objects from their imports; moved out
                # of the collector's sight, full collections stop pausing every request in
                # flight for 50-150 ms at a time.
                gc.freeze()
            self._client = self._make_client()
            self._client_loop = loop
            if self.pacer.budget is not None:
                self.pacer.budget.rebind()
        return self._client

    def _succeed(self, ticket: Ticket, reply: Reply) -> None:
        usage = reply.usage
        self.pacer.release(ticket, ok=True, usage=(usage.prompt_tokens, usage.completion_tokens))

    def _fail(self, ticket: Ticket, exc: BaseException) -> tuple[Failure, bool]:
        """The attempt's failure, sorted, and whether it says nothing against the request
        (see `Attempts`)."""
        failure = classify(exc, self)
        if failure.retry_after is not None:
            failure.retry_after = min(failure.retry_after, self.remote.retry_backoff_max)
        excusable = self.pacer.release(
            ticket, ok=False, overloaded=failure.overloaded, retry_after=failure.retry_after
        )
        return failure, excusable

    def _delay(self, attempt: int, failure: Failure) -> float:
        return backoff_delay(
            attempt,
            self.remote.retry_backoff_base,
            self.remote.retry_backoff_max,
            failure.retry_after,
        )

    def _result(self, request: Request, reply: Reply, started: float) -> Result:
        return Result(
            request_id=request.id,
            samples=reply.samples,
            usage=reply.usage,
            model=reply.model or self.model_name,
            engine=self.name,
            latency_s=time.perf_counter() - started,
        )

    def _failed(self, request: Request, failure: Failure, attempts: int, started: float) -> Result:
        tries = f" (after {attempts} attempts)" if attempts > 1 else ""
        status = f"HTTP {failure.status}: " if failure.status else ""
        # Redacted before it is shortened, so no cut can leave half a key behind.
        detail = self.redactor(failure.message)
        if len(detail) > MESSAGE_LIMIT:
            detail = detail[:MESSAGE_LIMIT] + "..."
        message = f"{self.name}: {status}{detail}{tries}"
        return error_result(
            request, self, ErrorInfo(failure.kind, message, failure.status), started
        )


def client_options(sdk: Any, num_workers: int, timeout_s: float) -> dict[str, Any]:
    """Keyword arguments shared by both SDKs' async clients: lmpress's timeout, a connection
    pool as large as num_workers, no SDK retries (lmpress retries, paced across all requests),
    and the SDK's aiohttp-backed HTTP client when aiohttp is installed.

    The SDKs recommend aiohttp for concurrency; measured here it halves the CPU each request
    costs, which at 32+ requests in flight is the difference between keeping a server busy and
    not (benchmarks/remote_throughput.py). LMPRESS_HTTP_BACKEND=httpx picks the default client.
    Types come from the SDK itself, so this works whichever httpx it is built on.
    """
    timeout = sdk.Timeout(timeout_s, connect=min(timeout_s, 30.0))
    limits = type(sdk.DEFAULT_CONNECTION_LIMITS)(
        max_connections=num_workers, max_keepalive_connections=num_workers
    )
    http_client = sdk.DefaultAsyncHttpxClient
    if os.environ.get("LMPRESS_HTTP_BACKEND", "").lower() != "httpx":
        try:
            import aiohttp  # noqa: F401

            http_client = sdk.DefaultAioHttpClient
        except ImportError:
            pass
    return {
        "timeout": timeout,
        "max_retries": 0,
        "http_client": http_client(limits=limits, timeout=timeout),
    }


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


def classify(exc: BaseException, engine: RemoteEngine) -> Failure:
    """Sort one attempt's exception: what kind, which HTTP status, retry or not, how long the
    server asked us to wait. Works on both SDKs' exceptions and on their transports' without
    importing either."""
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
            kind=engine.status_kind(status),
            message=_status_message(exc),
            status=status,
            retryable=status in RETRYABLE_STATUS or status >= 500,
            retry_after=retry_after,
        )
    names = {cls.__name__ for cause in _causes(exc) for cls in type(cause).__mro__}
    if isinstance(exc, _MALFORMED) or "ValidationError" in names:
        return Failure("malformed_response", _describe(exc), retryable=True)
    cause = connection_cause(exc)
    if cause is not None:  # before timeouts: some transports report a refusal as one
        deepest = _causes(exc)[-1]
        detail = f"{type(deepest).__name__}: {str(deepest).strip()}"
        return Failure("connection_error", f"{cause} ({detail})", retryable=True)
    if names & _DROPPED_NAMES:
        return Failure("connection_error", _describe(exc), retryable=True)
    if names & _TIMEOUT_NAMES:
        timeout = engine.remote.connection_timeout
        return Failure("timeout", f"timeout: no response within {timeout:g}s", retryable=True)
    if names & _CONNECTION_NAMES:
        return Failure("connection_error", _describe(exc), retryable=True)
    return Failure("client_error", _describe(exc))


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
