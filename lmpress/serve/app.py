"""The FastAPI app of `lmpress serve`: OpenAI's routes over one engine (the pooling routes,
embeddings, score and rerank, in `serve.pooling`).

A route checks the body, the model and the parameters, then returns a `GenerationResponse`
that runs the engine and watches for the client going away; when it goes, the generation is
cancelled, which closes the engine's stream and so frees the request's place in the batch.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Coroutine
from contextlib import aclosing
from functools import partial
from typing import Any

from fastapi import FastAPI
from fastapi import Request as HttpRequest
from fastapi.responses import JSONResponse
from openai.types import Completion
from openai.types.chat import ChatCompletion
from openai.types.responses import Response as ApiResponse

from lmpress.cache.answers import CachedAnswers
from lmpress.cache.responses import CacheMode, ResponseCache, cache_mode
from lmpress.configs.schema import ServeParams
from lmpress.data.messages import RowError, parse_messages, regenerate_last_turn
from lmpress.engines.base import Engine, check_tools, unsupported_params
from lmpress.serve import (
    errors,
    limits,
    messages,
    metrics,
    model_routes,
    openapi,
    pooling,
    responses_api,
    tokens,
)
from lmpress.serve.asgi import (
    EventStream,
    GenerationResponse,
    LogRequests,
    RequestLog,
    RequireKey,
    Response,
    Slots,
    new_id,
    read_body,
    request_log,
)
from lmpress.serve.batches import add_batch_routes
from lmpress.serve.media import AfterImages, ClientImages
from lmpress.serve.router import ModelRouter
from lmpress.serve.tokens import Echoing
from lmpress.version import __version__
from lmpress.vocabulary.errors import InputError, UnsupportedParamError
from lmpress.vocabulary.types import Delta, GenerationParams, Message, Request, Result, Usage
from lmpress.wire.openai import pooling as wire
from lmpress.wire.openai import requests as bodies
from lmpress.wire.openai import responses
from lmpress.wire.openai.errors import ApiError, error_from_info, model_not_found
from lmpress.wire.openai.requests import Sampling
from lmpress.wire.openai.responses import ChatChunks, CompletionChunks
from lmpress.wire.openai.responses_api.requests import RESPONSES_PATH, ResponsesBody

log = logging.getLogger("lmpress.serve")


class Server:
    """One engine behind the OpenAI routes, with the settings of `lmpress serve`."""

    def __init__(
        self, engine: Engine, settings: ServeParams, shared: metrics.ServeMetrics | None = None
    ):
        self.engine = engine
        self.settings = settings
        self.model_name = settings.served_model_name or engine.model_name or engine.name.lower()
        self.created = int(time.time())
        self.slots = Slots(settings.queue_limit)
        # One server's metrics, or a router's shared by its models (serve/router.py).
        self.metrics = shared or metrics.ServeMetrics(
            self.model_name, lambda: [(self.model_name, engine, self.slots)]
        )
        # Generation goes through `answers`: the response cache where --cache asks for it.
        cache = None
        if cache_mode(settings.cache) is not CacheMode.OFF:
            say = logging.getLogger("lmpress.serve").warning
            cache = ResponseCache.open(engine.config, settings.cache, settings.cache_dir, say)
        self.answers = CachedAnswers(engine, cache)
        self.images = ClientImages(settings)
        self.tokens = tokens.EngineTokenizer(engine)

    def drop_engine(self) -> None:
        """Let go of the engine, once closed, and of all that holds it: FastAPI keeps each
        route's endpoint (this server's methods) in a process-wide cache, so the server of an
        unloaded model outlives its unloading, and must not keep the model's memory."""
        del self.engine, self.answers, self.tokens

    # --- checks shared by the generation routes ----------------------------------------------

    async def read_body(self, request: HttpRequest) -> bytes:
        return await read_body(request, self.settings.max_body_bytes)

    def check_model(self, model: str) -> str | None:
        """The adapter `model` names (None: the base model), or 404 for a name not served."""
        if model == self.model_name:
            return None
        if model in self.engine.adapter_names:
            return model
        raise model_not_found(model, [self.model_name, *sorted(self.engine.adapter_names)])

    def params(self, sampling: Sampling, prompts: int = 1) -> GenerationParams:
        """The server's generation settings with the request's, refusing what the engine
        does not honour and what is over the server's caps."""
        params = self.engine.config.generation.replace(**sampling.overrides)
        limits.check_samples(self.settings, params, sampling.source, prompts)
        if params.max_new_tokens == 0 and "prompt_logprobs" not in self.engine.supported_params:
            name = sampling.source.get("max_new_tokens", "max_tokens")
            raise sampling.refuse(
                name, f"0 only scores the prompt, which engine {self.engine.name} cannot do; "
                "ask for 1 or more tokens",
            )  # fmt: skip
        unsupported = unsupported_params(self.engine, params)
        if unsupported:
            names = list(dict.fromkeys(sampling.source.get(name, name) for name in unsupported))
            raise ApiError(
                400,
                f"engine {self.engine.name} does not support {', '.join(repr(n) for n in names)}",
                param=names[0],
                code="unsupported_parameter",
            )
        return params

    def engine_request(
        self,
        http: HttpRequest,
        id: str,
        messages: list[Message],
        sampling: Sampling,
        adapter: str | None = None,
    ) -> tuple[Request, RequestLog]:
        """A generation route's request for the engine (with `adapter`, from `check_model`),
        its settings and tools checked against the engine's; and the route's request log,
        named `id` and, with --log-content, given the conversation."""
        limits.check_prompt_bytes(self.settings, ["".join(m.text() for m in messages)], "messages")
        params = self.params(sampling)
        entry = request_log(http.scope)
        entry.id = id
        if self.settings.log_content:
            entry.content = {"messages": [m.to_openai() for m in messages]}
        request = Request(id, messages, params, tools=sampling.tools, adapter=adapter)
        self.check_tools(request)
        return request, entry

    def check_tools(self, request: Request) -> None:
        try:
            check_tools(self.engine, request)
        except UnsupportedParamError as exc:
            param = "tools" if request.tools else "messages"
            raise ApiError(400, str(exc), param=param, code="unsupported_parameter") from None
        except InputError as exc:
            raise ApiError(400, str(exc), param="tool_choice") from None

    async def take_images(self, request: Request, param: str = "messages") -> None:
        """The request's images checked and in hand before the engine sees it: fetched under
        the server's media policy, held to its caps (serve/media.py)."""
        await self.images.take(request.messages, param, request.id)

    def with_images(
        self, request: Request, run: Coroutine[Any, Any, Response], param: str = "messages"
    ) -> Any:
        """`run`, once the request's images are in hand; in the request's place in the queue,
        so a fetch counts under serve.queue_limit and stops when the client goes away."""
        return AfterImages(self.images, request, run, param)

    # --- the routes ----------------------------------------------------------------------

    async def chat_completions(self, request: HttpRequest) -> GenerationResponse:
        pooling.require_task(self, bodies.CHAT_PATH, ("generate",))
        body = bodies.parse_body(bodies.ChatCompletionBody, await self.read_body(request))
        sampling = bodies.chat_sampling(body)
        try:
            messages = regenerate_last_turn(parse_messages(body.messages))
        except RowError as exc:
            raise ApiError(400, str(exc), param="messages") from exc
        adapter = self.check_model(bodies.require_model(body))
        engine_request, entry = self.engine_request(
            request, new_id("chatcmpl"), messages, sampling, adapter
        )
        if body.stream:
            named = engine_request.adapter or self.model_name  # the name the client sent
            chunks = ChatChunks(entry.id, int(time.time()), named, body.include_usage)
            run = self._stream([engine_request], chunks, entry, [""])
        else:
            run = self._complete_chat(engine_request, entry)
        run = self.with_images(engine_request, run)
        return GenerationResponse(self.slots, run, entry, engine_request.params.n)

    async def completions(self, request: HttpRequest) -> GenerationResponse:
        pooling.require_task(self, bodies.COMPLETIONS_PATH, ("generate",))
        body = bodies.parse_body(bodies.CompletionBody, await self.read_body(request))
        sampling = bodies.completion_sampling(body)
        prompts = bodies.completion_prompts(body)
        texts = [p for p in prompts if isinstance(p, str)]
        limits.check_prompt_count(self.settings, len(prompts), "prompt")
        limits.check_prompt_bytes(self.settings, texts, "prompt")
        adapter = self.check_model(bodies.require_model(body))
        params = self.params(sampling, len(prompts))
        if len(texts) < len(prompts) and "prompt_logprobs" not in self.engine.supported_params:
            raise ApiError(
                400, f"engine {self.engine.name} takes prompts as text, not token ids; send text",
                param="prompt", code="unsupported_parameter",
            )  # fmt: skip
        entry = request_log(request.scope)
        entry.id = new_id("cmpl")
        if self.settings.log_content:
            entry.content = {"prompt": prompts}
        requests = [
            Request(f"{entry.id}-{i}", [], params, prompt=p if isinstance(p, str) else None,
                    prompt_ids=None if isinstance(p, str) else p, adapter=adapter)
            for i, p in enumerate(prompts)
        ]  # fmt: skip
        if body.stream:
            if any(not isinstance(p, str) for p in prompts) and body.echo:
                raise sampling.refuse("echo", "of token ids is not streamed; send 'stream': false")
            echoes = [p if body.echo and isinstance(p, str) else "" for p in prompts]
            chunks = CompletionChunks(
                entry.id, int(time.time()), adapter or self.model_name, body.include_usage
            )
            run = self._stream(requests, chunks, entry, echoes)
        else:
            echo = Echoing(prompts, body.echo or False, body.logprobs is not None)
            run = self._complete_text(requests, entry, echo)
        return GenerationResponse(self.slots, run, entry, len(prompts) * params.n)

    # --- running generations -------------------------------------------------------------

    def _finish_log(self, entry: RequestLog, results: list[Result]) -> None:
        entry.usage = Usage.summed(r.usage for r in results)
        if entry.content is not None:
            entry.content["reply"] = [s.text for r in results for s in r.samples]

    async def _complete_chat(self, request: Request, entry: RequestLog) -> Response:
        result = await self.answers.complete(request)
        self._finish_log(entry, [result])
        if result.error is not None:
            raise error_from_info(result.error, entry.id)
        named = request.adapter or self.model_name
        body = responses.chat_completion(entry.id, int(time.time()), named, result)
        return JSONResponse(body, headers={"x-request-id": entry.id})

    async def _complete_text(
        self, requests: list[Request], entry: RequestLog, echo: Echoing
    ) -> Response:
        results = list(await asyncio.gather(*(self.answers.complete(r) for r in requests)))
        self._finish_log(entry, results)
        for result in results:
            if result.error is not None:
                raise error_from_info(result.error, entry.id)
        tokenizer = await self.tokens.get() if echo.needs_tokenizer else None
        body = responses.text_completion(
            entry.id,
            int(time.time()),
            requests[0].adapter or self.model_name,
            results,
            echo.of(results, tokenizer),
        )
        return JSONResponse(body, headers={"x-request-id": entry.id})

    async def _stream(
        self,
        requests: list[Request],
        chunks: ChatChunks | CompletionChunks,
        entry: RequestLog,
        echoes: list[str],
    ) -> Response:
        """The response is an event stream, started once the engine has produced something,
        so that a request the engine refuses at once still gets its HTTP error status."""
        n = requests[0].params.n
        items = merged([self.answers.stream(r) for r in requests])
        first = await anext(items)
        if isinstance(first[1], Result) and first[1].error is not None:
            await items.aclose()
            self._finish_log(entry, [first[1]])
            raise error_from_info(first[1].error, entry.id)
        lines = self._events(first, items, chunks, entry, echoes, n)
        return EventStream(lines, items, entry.id)

    async def _events(
        self,
        first: tuple[int, Delta | Result],
        items: AsyncIterator[tuple[int, Delta | Result]],
        chunks: ChatChunks | CompletionChunks,
        entry: RequestLog,
        echoes: list[str],
        n: int,
    ) -> AsyncIterator[bytes]:
        started: set[int] = set()
        results: list[Result] = []

        def opening(index: int, prompt: int) -> list[bytes]:
            if index in started:
                return []
            started.add(index)
            out = [chunks.start(index)] if isinstance(chunks, ChatChunks) else []
            if echoes[prompt]:
                out.append(chunks.text(index, echoes[prompt]))
            return out

        async with aclosing(items):
            item: tuple[int, Delta | Result] | None = first
            while item is not None:
                prompt, value = item
                if isinstance(value, Delta):
                    entry.streamed()
                    index = prompt * n + value.index
                    for line in opening(index, prompt):
                        yield line
                    if value.reasoning and isinstance(chunks, ChatChunks):
                        yield chunks.reasoning(index, value.text)
                    elif not value.reasoning:  # a text completion shows no thinking
                        yield chunks.text(index, value.text)
                else:
                    if value.error is not None:
                        self._finish_log(entry, [*results, value])
                        yield responses.sse(error_from_info(value.error, entry.id).body())
                        yield responses.DONE
                        return
                    results.append(value)
                    for i, sample in enumerate(value.samples):
                        for line in opening(prompt * n + i, prompt):
                            yield line
                        if isinstance(chunks, ChatChunks):
                            for line in chunks.tool_calls(prompt * n + i, sample):
                                yield line
                        yield chunks.finish(prompt * n + i, sample)
                item = await anext(items, None)
        self._finish_log(entry, results)
        if chunks.include_usage:
            assert entry.usage is not None
            yield chunks.usage(entry.usage, any(r.reasoned for r in results))
        yield responses.DONE


async def merged(
    streams: list[AsyncIterator[Delta | Result]],
) -> AsyncIterator[tuple[int, Delta | Result]]:
    """The items of several engine streams as they come, each with its stream's index.
    Closing this closes them all (and so cancels their requests)."""
    if len(streams) == 1:
        async with aclosing(streams[0]) as stream:
            async for item in stream:
                yield 0, item
        return
    queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
    end = object()

    async def pump(i: int, stream: AsyncIterator[Delta | Result]) -> None:
        try:
            async with aclosing(stream):
                async for item in stream:
                    queue.put_nowait((i, item))
        except Exception as exc:
            queue.put_nowait((i, exc))
        finally:
            queue.put_nowait((i, end))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(tasks)
        while remaining:
            i, item = await queue.get()
            if item is end:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield i, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


# --- the app ---------------------------------------------------------------------------------


def create_app(engine: Engine, settings: ServeParams, api_key: str | None = None) -> FastAPI:
    """The OpenAI-compatible app over `engine`. The caller owns the engine (and closes it)."""
    server = Server(engine, settings)
    # The document, never the docs pages: those load their scripts from elsewhere.
    app = FastAPI(title="lmpress", version=__version__, docs_url=None, redoc_url=None)
    app.state.server = server

    @app.get("/health", response_model=None, responses=openapi.replies())
    async def health() -> dict[str, Any]:
        return {
            "status": "ok",
            "model": server.model_name,
            "engine": engine.name,
            "requests_in_flight": server.slots.in_use,
        }

    model_routes.register(app, ModelRouter.of_one(server))
    add_model_routes(app, server)
    app.state.batch_runs = add_batch_routes(app, engine, settings.state_dir, server.images)
    if app.state.batch_runs is not None:  # each batch line and its tokens, in /metrics
        app.state.batch_runs.line_listeners.append(server.metrics.count_batch_line)
    errors.install(app)
    openapi.install(app, server.model_name, api_key)
    app.add_middleware(RequireKey, api_key=api_key)
    metrics.install(app, server.metrics)  # GET /metrics, and the count of every request
    app.add_middleware(LogRequests)  # added last, so outermost: it sees every answer
    return app


def add_model_routes(app: FastAPI, server: Server) -> None:
    """The routes that answer with one model: generation, pooling, Anthropic's Messages and
    the tokenizer's. A server of several models has an app of these per model (serve/front.py)."""
    for paths, route, body, reply, stream in (
        ((bodies.CHAT_PATH,), server.chat_completions, bodies.ChatCompletionBody, ChatCompletion, True),
        ((bodies.COMPLETIONS_PATH,), server.completions, bodies.CompletionBody, Completion, True),
        ((RESPONSES_PATH,), partial(responses_api.responses, server), ResponsesBody, ApiResponse, True),
        ((wire.EMBEDDINGS_PATH,), partial(pooling.embeddings, server), wire.EmbeddingsBody, openapi.Embeddings, False),
        (wire.SCORE_PATHS, partial(pooling.score, server), wire.ScoreBody, None, False),
        (wire.RERANK_PATHS, partial(pooling.rerank, server), wire.RerankBody, None, False),
        ((wire.CLASSIFY_PATH,), partial(pooling.classify, server), wire.ClassifyBody, None, False),
        ((wire.POOLING_PATH,), partial(pooling.pooled, server), wire.PoolingBody, None, False),
    ):  # fmt: skip
        for path in paths:
            app.add_api_route(
                path, route, methods=["POST"], openapi_extra=openapi.json_body(body),
                response_model=None, responses=openapi.replies(reply, stream=stream),
            )  # fmt: skip
    messages.register(app, server)  # Anthropic's /v1/messages and its count_tokens
    tokens.register(app, server)  # vLLM's /tokenize, /detokenize and /tokenizer_info
