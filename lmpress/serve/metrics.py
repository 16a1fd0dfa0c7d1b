"""`GET /metrics` of `lmpress serve`: Prometheus' text format, under vLLM's names where vLLM
has one, so that a dashboard made for `vllm serve` reads `lmpress serve` too.

Each app has a registry of its own (never prometheus_client's global one), so two apps in one
process do not clash. Requests are counted by a middleware that sees every route, by the
route's path template (`/v1/models/{model:path}`, never a raw path: a client must not be able
to make new series), so a route added later is counted without doing anything. The tokens
are the usage a route writes on its request log (`RequestLog.usage`, what the log line
shows), and a streaming route marks each delta it sends (`RequestLog.streamed`) for the time
to first token and the inter-token latency. Requests running and waiting, and the KV cache's
use, are read from the engine (`Engine.occupancy`) when scraped.

For the batch runner: `metrics.batch_lines("completed").inc()` per line done (or "failed"),
and `metrics.count_usage(usage)` for the tokens of lines that no HTTP request carries.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Literal, get_args

from fastapi import FastAPI
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from starlette.requests import Request as HttpRequest
from starlette.responses import Response as HttpResponse
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from lmpress.engines.base import Engine
from lmpress.serve import openapi
from lmpress.serve.asgi import CLIENT_CLOSED, Slots, request_log
from lmpress.vocabulary.types import Usage

METRICS_PATH = "/metrics"
# The route label of a request that matched no route (a 404): one series, not one per path.
UNMATCHED = "unmatched"

BatchLineOutcome = Literal["completed", "failed"]
# A loaded model as the gauges read it: its name, its engine and its server's queue.
Loaded = tuple[str, Engine, Slots]

# vLLM's buckets (vllm/v1/metrics/buckets.py), so that its dashboards' quantiles read the same.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
INTER_TOKEN_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
                       5.0, 7.5, 10.0, 20.0, 40.0, 80.0)  # fmt: skip
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
               60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip

# The methods counted by name. The HTTP parser takes any token as a method, so a client could
# otherwise add a series to the registry with every request; the rest count as "other".
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


class ServeMetrics:
    """The metrics of one `lmpress serve` app, in a registry of its own."""

    def __init__(
        self, model_name: str, loaded: Callable[[], Iterable[Loaded]], several: bool = False
    ):
        """`model_name`: the model a series is labelled with where the request names none
        (on a server of `several`, a request that reached no model is counted under "");
        `loaded`: the models loaded now, read when scraped (one, or a router's)."""
        self.registry = CollectorRegistry()
        self.model_name = model_name
        self.unnamed = "" if several else model_name
        model = ["model_name"]

        def counter(name: str, doc: str, labels: Sequence[str] = model) -> Counter:
            return Counter(name, doc, labels, registry=self.registry)

        def histogram(name: str, doc: str, buckets: Sequence[float]) -> Histogram:
            return Histogram(name, doc, model, registry=self.registry, buckets=buckets)

        self.requests = counter(
            "lmpress_http_requests",
            "HTTP requests answered, by model, route (path template), method and status "
            "(499: the client went away first).",
            [*model, "route", "method", "status"],
        )
        self.prompt_tokens = counter("vllm:prompt_tokens", "Prompt tokens processed.")
        self.generation_tokens = counter(
            "vllm:generation_tokens", "Generation tokens produced (reasoning included)."
        )
        self.reasoning_tokens = counter(
            "lmpress_reasoning_tokens",
            "Reasoning tokens produced (part of vllm:generation_tokens).",
        )
        self.ttft = histogram(
            "vllm:time_to_first_token_seconds",
            "Time from a streamed request's arrival to its first delta.",
            TTFT_BUCKETS,
        )
        self.inter_token = histogram(
            "vllm:inter_token_latency_seconds",
            "Time between consecutive deltas of a streamed request.",
            INTER_TOKEN_BUCKETS,
        )
        self.e2e = histogram(
            "vllm:e2e_request_latency_seconds",
            "Time from a generation request's arrival to the end of its answer.",
            E2E_BUCKETS,
        )
        self._batch_lines = counter(
            "lmpress_batch_lines", "Batch lines done, by outcome.", [*model, "outcome"]
        )
        self.registry.register(_LoadCollector(loaded))
        self.add_model(model_name)

    def add_model(self, model: str) -> None:
        """Every series of `model` from the start, at 0, so that rate() counts its first
        requests too."""
        for metric in (self.prompt_tokens, self.generation_tokens, self.reasoning_tokens,
                       self.ttft, self.inter_token, self.e2e):  # fmt: skip
            self.labels(metric, model)
        for outcome in get_args(BatchLineOutcome):
            self.batch_lines(outcome, model)

    def labels(self, metric: Counter | Histogram, model: str | None = None) -> Any:
        return metric.labels(model_name=model or self.model_name)

    def batch_lines(self, outcome: BatchLineOutcome, model: str | None = None) -> Counter:
        """The counter of batch lines done with `outcome`: call `.inc()` on it."""
        return self._batch_lines.labels(model_name=model or self.model_name, outcome=outcome)

    def count_batch_line(self, outcome: BatchLineOutcome, usage: Usage) -> None:
        """Count a batch line that ended, and the tokens it used."""
        self.batch_lines(outcome).inc()
        self.count_usage(usage)

    def count_usage(self, usage: Usage, model: str | None = None) -> None:
        """Count the tokens of a request (or batch line) that the engine processed."""
        self.labels(self.prompt_tokens, model).inc(usage.prompt_tokens)
        self.labels(self.generation_tokens, model).inc(usage.completion_tokens)
        self.labels(self.reasoning_tokens, model).inc(usage.reasoning_tokens)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class _LoadCollector(Collector):
    """The gauges, read when scraped, one series per loaded model: requests running and
    waiting in the engine (where it cannot tell, those in flight at the routes count as
    running), the KV cache's use where the engine bounds one, and the requests in flight at
    the routes."""

    def __init__(self, loaded: Callable[[], Iterable[Loaded]]):
        self.loaded = loaded

    def collect(self) -> Iterator[GaugeMetricFamily]:
        def gauge(name: str, doc: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=["model_name"])

        running = gauge("vllm:num_requests_running", "Requests generating now.")
        waiting = gauge(
            "vllm:num_requests_waiting", "Requests waiting for a place in the engine's batch."
        )
        kv = gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        in_flight = gauge(
            "lmpress_requests_in_flight",
            "Places held in the server's queue (serve.queue_limit): one a sequence or text.",
        )
        for name, engine, slots in self.loaded():
            held = engine.occupancy()
            running.add_metric([name], held.running if held is not None else slots.in_use)
            if held is not None:
                waiting.add_metric([name], held.waiting)
                if held.kv_cache_usage is not None:
                    kv.add_metric([name], held.kv_cache_usage)
            in_flight.add_metric([name], slots.in_use)
        for family in (running, waiting, kv, in_flight):
            if family.samples:
                yield family
        if not in_flight.samples:  # no model loaded: nothing is in flight
            yield in_flight


class CountRequests:
    """Counts every request when its answer ends: by route, method and status; its tokens,
    latency and (streamed) time to first token, from its request log. Sits inside
    `LogRequests` (whose log it reads) and outside `RequireKey` (so a 401 counts too)."""

    def __init__(self, app: ASGIApp, metrics: ServeMetrics, routes: list[BaseRoute]):
        self.app = app
        self.metrics = metrics
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500  # what the app answers when it raises before a response starts

        async def send_counted(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_counted)
        finally:
            self._count(scope, status)

    def _count(self, scope: Scope, status: int) -> None:
        entry = request_log(scope)
        if entry.cancelled:
            status = CLIENT_CLOSED
        metrics = self.metrics
        route = self._route(scope)
        method = scope["method"] if scope["method"] in METHODS else "other"
        model_name = entry.model or metrics.unnamed
        labels = {"route": route, "method": method, "status": str(status)}
        metrics.requests.labels(model_name=model_name, **labels).inc()
        if entry.usage is None:  # not a generation, or one that never reached the engine
            return
        model = entry.model  # None on a one-model server: its model
        metrics.count_usage(entry.usage, model)
        if entry.first_token is not None:
            metrics.labels(metrics.ttft, model).observe(entry.first_token - entry.started)
            inter_token = metrics.labels(metrics.inter_token, model)
            for gap in entry.token_gaps:
                inter_token.observe(gap)
        if status < 400:
            metrics.labels(metrics.e2e, model).observe(time.perf_counter() - entry.started)

    def _route(self, scope: Scope) -> str:
        """The path template of the route that answered (or would have, behind a 401)."""
        route = scope.get("route")
        if route is not None and hasattr(route, "path"):
            return route.path
        for candidate in self.routes:
            match, _ = candidate.matches(scope)
            if match is not Match.NONE and hasattr(candidate, "path"):
                return candidate.path
        return UNMATCHED


def install(app: FastAPI, metrics: ServeMetrics) -> None:
    """Add `GET /metrics` and the middleware that counts every request to `app` (a FastAPI
    app, between its `RequireKey` and `LogRequests` middleware)."""

    async def metrics_route(request: HttpRequest) -> HttpResponse:
        return HttpResponse(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    app.add_api_route(
        METRICS_PATH, metrics_route, methods=["GET"], responses=openapi.replies(media="text/plain")
    )
    app.add_middleware(CountRequests, metrics=metrics, routes=app.router.routes)
