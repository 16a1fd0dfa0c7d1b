"""What every remote engine shares: the API key, the retry loop and the pacing around each request.

A provider module (openai_compat, anthropic) subclasses `RemoteEngine` and supplies three
things: `_make_client` (its SDK's async client, built with `client_options`), `_send` (one
non-streaming attempt) and `_send_stream` (one streaming attempt), plus, where the service is
picky, `check_request_params`; where it embeds or scores (its `tasks`), `_send_embed` and
`_send_score`, which go through the same retry loop (`_with_retries`) as `_send`. Failures of
an attempt arrive here as exceptions and are sorted by `retry.classify`: 429, 5xx, timeouts,
dropped connections and malformed bodies are retried with backoff; other 4xx fail the row at
once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import math
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from lmpress.configs.schema import RunConfig
from lmpress.engines.base import Engine, check_text, check_tools, error_result
from lmpress.engines.prompt_count import (
    NoPromptCache,
    PromptCacheTally,
    estimate_request_tokens,
    estimate_tokens,
)
from lmpress.engines.remote.credentials import Redactor, resolve_api_key
from lmpress.engines.remote.pacing import Pacer, Ticket, backoff_delay
from lmpress.engines.remote.prompt_cache import CacheEstimate
from lmpress.engines.remote.retry import (
    Attempts,
    Failure,
    classify,
    status_kind,
)
from lmpress.vocabulary.embeddings import (
    EmbedRequest,
    EmbedResult,
    ScoreRequest,
    ScoreResult,
)
from lmpress.vocabulary.errors import (
    ConfigError,
    ErrorKind,
    LmpressError,
    RequestError,
    UnsupportedParamError,
)
from lmpress.vocabulary.types import Delta, ErrorInfo, Request, Result, Usage
from lmpress.wire.replies import EmbedReply, MalformedResponse, Reply, ScoreReply

MESSAGE_LIMIT = 500  # characters of a provider's error message kept in a failed row


R = TypeVar("R", "Reply", "EmbedReply", "ScoreReply")


@dataclass
class Failed:
    """A request that failed for good: its last failure and how many attempts it made."""

    failure: Failure
    attempts: int


class RemoteEngine(Engine):
    """An engine that sends each request to an HTTP API, concurrently, paced and retried."""

    default_api_url: ClassVar[str | None] = None
    key_required: ClassVar[bool] = True  # False: a keyless local server is fine
    model_required: ClassVar[bool] = True
    # Endpoint paths the SDK appends to the base URL, longest first: an api_url that ends in
    # one (Oumi's configs name the full endpoint) is cut back to its base.
    endpoint_paths: ClassVar[tuple[str, ...]] = ()
    takes_tools = True  # each provider module sends tools in its API's own form
    provider: ClassVar[Any] = None  # its row in presets.PROVIDERS, bound by presets.engine_class

    @classmethod
    def prompt_cache_tally(cls, config: RunConfig) -> PromptCacheTally:
        """The provider's prompt cache as its row says it works (prompt_cache.py)."""
        caching = cls.provider.prompt_caching if cls.provider is not None else None
        if caching is None:
            return NoPromptCache()
        return CacheEstimate(caching, config.model.model_name, config.remote_params.prompt_cache)

    @classmethod
    def answered_tasks(cls, config: RunConfig) -> frozenset[str]:
        """Every task the API has: each request is a call of its own, to its own endpoint."""
        return cls.tasks

    @classmethod
    def replica_config(cls, config: RunConfig, replicas: int) -> RunConfig:
        """Concurrency and rate limits split evenly, so that all replicas together keep to the
        limits one run has."""
        remote = config.remote_params
        split = {"num_workers": max(1, math.ceil(remote.num_workers / replicas))}
        for name in ("requests_per_minute", "input_tokens_per_minute", "output_tokens_per_minute"):
            if (limit := getattr(remote, name)) is not None:
                split[name] = max(1, limit // replicas)
        return dataclasses.replace(config, remote_params=dataclasses.replace(remote, **split))

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
        self.api_key = resolve_api_key(
            self.name, remote, self.key_variable(config), self.key_required
        )
        self.redactor = Redactor([self.api_key] if self.api_key else [])
        if self.model_required and not config.model.model_name:
            raise ConfigError(
                f"model.model_name: engine {self.name} needs the provider's model name "
                f"(--model.model_name NAME)"
            )
        try:
            self.check_request_params(config.generation)
        except RequestError as exc:
            message = (
                str(exc) if f"engine {self.name} " in str(exc) else f"engine {self.name}: {exc}"
            )
            raise UnsupportedParamError(message) from exc
        # Callers keep four times num_workers submitted: a row waiting out a retry's backoff
        # (half a second on average at the default retry_backoff_base) must not leave a worker
        # idle. With 35% of first attempts failing (benchmarks/remote_faults.py), twice
        # num_workers ran at 0.63 of the fault-free speed, four times at 0.71. The pacer still
        # lets only num_workers requests out.
        self.max_in_flight = 4 * remote.num_workers
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

    async def _send_embed(self, client: Any, request: EmbedRequest) -> EmbedReply:
        """One embeddings attempt, on an engine whose `tasks` include `embed`."""
        raise NotImplementedError

    async def _send_score(self, client: Any, request: ScoreRequest) -> ScoreReply:
        """One scoring attempt, on an engine whose `tasks` include `score`."""
        raise NotImplementedError

    def _estimate(self, request: Request) -> int:
        """The request's input tokens, roughly, before the provider counts them."""
        return estimate_request_tokens(request)

    def check_request_params(self, params: Any) -> None:
        """Refuse, before any request, parameter values this provider cannot take (a
        guided_decoding form it lacks, say). Raise ConfigError or RequestError."""

    def status_kind(self, status: int) -> ErrorKind:
        return status_kind(status)

    # --- the interface ---------------------------------------------------------------------

    async def complete(self, request: Request) -> Result:
        started = time.perf_counter()
        try:
            check_text(request)
            check_tools(self, request)
            check_prompt_ids(self, request)
            self.check_request_params(request.params)
        except (RequestError, LmpressError) as exc:
            return error_result(
                request, self, ErrorInfo(ErrorKind.INVALID_REQUEST, str(exc)), started
            )
        client = self.client_for_loop()
        output_tokens = request.params.max_new_tokens * request.params.n
        outcome = await self._with_retries(
            lambda: self._send(client, request), self._estimate(request), output_tokens
        )
        if isinstance(outcome, Failed):
            return error_result(request, self, self._failure_info(outcome), started)
        return self.result_of(request, outcome, started)

    async def embed(self, request: EmbedRequest) -> EmbedResult:
        """The inputs' vectors from the provider's embeddings endpoint, one request paced and
        retried as a chat request is; `normalize` is applied here (providers do not)."""
        started = time.perf_counter()
        client = self.client_for_loop()
        outcome = await self._with_retries(
            lambda: self._send_embed(client, request), estimate_input_tokens(request.inputs), 0
        )
        if isinstance(outcome, Failed):
            return self.embed_result_of(request, self._failure_info(outcome), started)
        return self.embed_result_of(request, outcome, started)

    def embed_result_of(
        self, request: EmbedRequest, outcome: EmbedReply | ErrorInfo, started: float
    ) -> EmbedResult:
        """The result of an embeddings request, live or from a provider batch's output."""
        latency = time.perf_counter() - started
        if isinstance(outcome, ErrorInfo):
            return EmbedResult(
                request.id, [], Usage(), self.model_name, self.name, latency, outcome
            )
        embeddings = outcome.embeddings
        if request.normalize:
            embeddings = [
                dataclasses.replace(e, vector=l2_normalized(e.vector)) for e in embeddings
            ]
        model = outcome.model or self.model_name
        return EmbedResult(request.id, embeddings, outcome.usage, model, self.name, latency)

    async def score(self, request: ScoreRequest) -> ScoreResult:
        """The documents' scores against the query from the provider's scoring endpoint,
        paced and retried as a chat request is."""
        started = time.perf_counter()
        client = self.client_for_loop()
        texts = request.texts()
        outcome = await self._with_retries(
            lambda: self._send_score(client, request), estimate_input_tokens(texts), 0
        )
        latency = time.perf_counter() - started
        if isinstance(outcome, Failed):
            info = self._failure_info(outcome)
            return ScoreResult(request.id, [], Usage(), self.model_name, self.name, latency, info)
        model = outcome.model or self.model_name
        return ScoreResult(request.id, outcome.scores, outcome.usage, model, self.name, latency)

    async def _with_retries(
        self, send: Callable[[], Awaitable[R]], input_tokens: int, output_tokens: int
    ) -> R | Failed:
        """What `send` answers, tried until it succeeds or may not be tried again, each attempt
        paced (concurrency, rate limits) and its failure sorted by `retry.classify`."""
        attempts = Attempts(self.remote.max_retries)
        while True:
            ticket = await self.pacer.acquire(input_tokens, output_tokens)
            try:
                reply = await send()
            except Exception as exc:
                failure, excusable = self._fail(ticket, exc)
            except BaseException:  # cancelled: the caller went away; free the slot
                self.pacer.release(ticket, ok=False)
                raise
            else:
                self._succeed(ticket, reply)
                return reply
            delay = self._delay(attempts.backoff_index(), failure)
            if not attempts.may_retry(failure, excusable):
                return Failed(failure, attempts.made)
            await asyncio.sleep(delay)

    async def stream(self, request: Request) -> AsyncIterator[Delta | Result]:
        """Deltas as the provider streams them, then the Result. An attempt that fails before
        its first delta is retried like `complete`; one that fails midway ends the request
        with an error, since the text already handed out cannot be taken back."""
        started = time.perf_counter()
        try:
            check_text(request)
            check_tools(self, request)
            check_prompt_ids(self, request)
            self.check_request_params(request.params)
        except (RequestError, LmpressError) as exc:
            yield error_result(
                request, self, ErrorInfo(ErrorKind.INVALID_REQUEST, str(exc)), started
            )
            return
        client = self.client_for_loop()
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
                            yield self.result_of(request, item, started)
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

    def client_for_loop(self) -> Any:
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

    def _succeed(self, ticket: Ticket, reply: Reply | EmbedReply | ScoreReply) -> None:
        usage = reply.usage
        self.pacer.release(ticket, ok=True, usage=(usage.prompt_tokens, usage.completion_tokens))

    def classify_failure(self, exc: BaseException) -> Failure:
        """A failed call to the provider sorted as this engine sorts one (`retry.classify`):
        retryable or not, after how long, and the error kind; the providers' batch APIs sort
        their lifecycle calls' failures here too."""
        return classify(exc, self.status_kind, self.remote.connection_timeout)

    def _fail(self, ticket: Ticket, exc: BaseException) -> tuple[Failure, bool]:
        """The attempt's failure, sorted, and whether it says nothing against the request
        (see `Attempts`)."""
        failure = self.classify_failure(exc)
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

    def result_of(self, request: Request, reply: Reply, started: float) -> Result:
        return Result(
            request_id=request.id,
            samples=reply.samples,
            usage=reply.usage,
            model=reply.model or self.model_name,
            engine=self.name,
            latency_s=time.perf_counter() - started,
            prompt_logprobs=reply.prompt_logprobs,
            prompt_ids=reply.prompt_ids,
        )

    def _failed(self, request: Request, failure: Failure, attempts: int, started: float) -> Result:
        return error_result(request, self, self._failure_info(Failed(failure, attempts)), started)

    def _failure_info(self, failed: Failed) -> ErrorInfo:
        failure = failed.failure
        tries = f" (after {failed.attempts} attempts)" if failed.attempts > 1 else ""
        status = f"HTTP {failure.status}: " if failure.status else ""
        # Redacted before it is shortened, so no cut can leave half a key behind.
        detail = self.redactor(failure.message)
        if len(detail) > MESSAGE_LIMIT:
            detail = detail[:MESSAGE_LIMIT] + "..."
        message = f"{self.name}: {status}{detail}{tries}"
        return ErrorInfo(failure.kind, message, failure.status)


def check_prompt_ids(engine: RemoteEngine, request: Request) -> None:
    """Refuse a prompt of token ids where the provider takes text only: the ids are a local
    model's, and only a server that scores prompts (one serving such a model) reads them."""
    if request.prompt_ids is not None and "prompt_logprobs" not in engine.supported_params:
        raise RequestError(
            f"engine {engine.name} takes prompts as text, not token ids; send text, or use a "
            f"server that reads token ids (REMOTE, REMOTE_VLLM, SGLANG)",
            kind=ErrorKind.INVALID_REQUEST,
        )


def estimate_input_tokens(inputs: Sequence[str] | Sequence[list[int]]) -> int:
    """Embedding inputs' tokens, roughly: token ids counted, text as the chat estimate does."""
    return sum(len(i) if isinstance(i, list) else estimate_tokens(len(i)) for i in inputs)


def l2_normalized(vector: Sequence[float]) -> list[float]:
    norm = math.sqrt(sum(float(v) * float(v) for v in vector))
    return [float(v) / norm for v in vector] if norm else [float(v) for v in vector]


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
