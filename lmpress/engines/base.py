"""The one interface every engine implements, and the checks every engine shares.

Everything the rest of lmpress asks of an engine is here, as a method or attribute of
`Engine`, with a remote API's answer as the default: what it supports (`supported_params`,
`takes_tools`), whether its model may be a hub id (`takes_hub_ids`), the `model.model_kwargs`
settings it reads (`options`), how it counts prompts for the dry run (`prompt_counter`) and what
its provider's prompt cache bills apart (`prompt_cache_tally`), the dtype it loads a model in
(`dtype_in_use`), what a `--ray` replica of it needs (`key_variable`, `replica_config`), and the
requests it holds now (`occupancy`, for serve's /metrics). A new engine overrides what differs,
in its own folder, and needs no other module to know its name.
"""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from lmpress.configs.schema import ModelParams, RunConfig, speculative_method
from lmpress.engines.options import EngineOptions
from lmpress.engines.prompt_count import (
    NoPromptCache,
    PromptCacheTally,
    PromptCounter,
    tokenizer_counter,
)
from lmpress.progress import ProgressBar
from lmpress.vocabulary.embeddings import (
    EmbedRequest,
    EmbedResult,
    ScoreRequest,
    ScoreResult,
    tasks_like,
)
from lmpress.vocabulary.errors import (
    ErrorKind,
    InputError,
    RequestError,
    UnsupportedParamError,
    exception_line,
)
from lmpress.vocabulary.likelihood import LoglikelihoodRequest, LoglikelihoodResult, Tokenizer
from lmpress.vocabulary.tools import ToolError, check_request, uses_tools
from lmpress.vocabulary.types import (
    ErrorInfo,
    GenerationParams,
    Message,
    Request,
    Result,
    Sample,
    Usage,
)


@dataclass(frozen=True)
class Occupancy:
    """The requests an engine holds now, as `lmpress serve`'s /metrics shows them."""

    running: int  # in the backend's batch, generating
    waiting: int  # submitted, waiting for a place in the batch
    kv_cache_usage: float | None = None  # the fraction of a bounded KV cache in use


class Engine(ABC):
    """Runs requests on one backend. Callers submit requests and consume what comes back; the
    engine owns scheduling (a local engine batches whatever is in flight, a remote one sends
    requests concurrently).

    Subclasses set `name` and `supported_params`, load their backend in `__init__` (importing
    it there, never at module level) and implement `stream`.
    """

    name: ClassVar[str]
    supported_params: ClassVar[frozenset[str]]
    # Generation values the backend always uses and cannot be asked for: asking for exactly
    # them is accepted (an API that samples at temperature 1 honours `temperature: 1.0`).
    inherent_params: ClassVar[dict[str, Any]] = {}
    # Whether `model.generation_defaults: use` means something here: the engine can read the
    # sampling defaults a checkpoint ships. Every engine ignores them by default.
    uses_generation_defaults: ClassVar[bool] = False
    # The `model.speculative_method`s other than off it decodes by
    # (engines/local/speculation.py); it refuses any other before any work.
    speculative_methods: ClassVar[frozenset[str]] = frozenset()
    # Whether requests may offer tools (and hold earlier tool calls): the engine sends them
    # to its API, or renders them and parses the calls out of the reply. `check_tools` refuses
    # them, before any work, on an engine that cannot.
    takes_tools: ClassVar[bool] = False
    # Whether `model.model_name` may be a Hugging Face hub id: `create_engine` checks that one
    # is on this machine or downloadable before the engine loads it.
    takes_hub_ids: ClassVar[bool] = False
    # The environment variable an API key is read from when the config names none.
    default_key_env: ClassVar[str | None] = None
    # The tokenizer (a hub id) that counts its prompts when the config names none: the one its
    # provider publishes, from its row of the providers' table (engines/remote/presets.py).
    default_tokenizer: ClassVar[str | None] = None
    # The tasks it answers (vocabulary/embeddings.py): `generate` through `stream`, `embed`
    # through `embed`, `score` and `rerank` through `score`. A run of another task is refused
    # before any work.
    tasks: ClassVar[frozenset[str]] = frozenset({"generate"})
    # The `model.model_kwargs` settings it reads, typed (engines/options.py), checked right
    # after the config loads (`registry.check_engine`); None: it reads none, and the config's
    # model_kwargs are not checked.
    options: ClassVar[type[EngineOptions] | None] = None
    # Whether rows may choose one of `model.adapters` (LoRA adapters over the base model) by
    # `Request.adapter`. `check_adapters_taken` refuses a config that names adapters, before
    # any work, on an engine that cannot.
    takes_adapters: ClassVar[bool] = False
    # The `model.kv_cache_dtype` values besides auto that it can hold its KV cache in;
    # `check_kv_cache_dtype` refuses another before any work.
    kv_cache_dtypes: ClassVar[frozenset[str]] = frozenset()
    # Whether it merges `model.adapter_model`, one adapter for every request, into its model.
    # An engine that cannot refuses it before any work, rather than answer from the base.
    merges_adapter_model: ClassVar[bool] = False

    @classmethod
    def model_task(cls, config: RunConfig) -> str:
        """The task `config`'s model is made for, for a run that chose none: generate, unless
        the engine can tell from the checkpoint that the model only pools (NATIVE: an
        embedding model embeds, a cross-encoder scores)."""
        return "generate"

    @classmethod
    def answered_tasks(cls, config: RunConfig) -> frozenset[str]:
        """The tasks an engine started for `config` answers, request by request: by default
        those of the one task its model was loaded for (`tasks_like`)."""
        return tasks_like(config.task) & cls.tasks

    def __init__(self, config: RunConfig):
        self.config = config
        check_task(self, config.task)
        check_params(self, config.generation)
        check_adapters_taken(self, config)
        if config.model.generation_defaults == "use" and not self.uses_generation_defaults:
            raise UnsupportedParamError(
                f"model.generation_defaults: engine {self.name} cannot read a checkpoint's "
                f"generation defaults; set the values under generation instead, or use ignore"
            )
        method = speculative_method(config.model)
        if method != "off" and method not in self.speculative_methods:
            known = sorted(self.speculative_methods)
            raise UnsupportedParamError(
                f"model.speculative_method: engine {self.name} does not decode speculatively"
                + (f" by {method}; use {' or '.join(known)}" if known else "")
                + "; or use off"
                + ("" if known else ", or a local engine (NATIVE, LLAMACPP, VLLM)")
            )
        # How many requests callers should keep submitted to keep this engine busy.
        self.max_in_flight: int = max(1, config.generation.batch_size)

    @classmethod
    def unavailable_reason(cls) -> str | None:
        """Why this engine cannot run on this machine (no GPU, say), or None when it can."""
        return None

    @classmethod
    def prompt_counter(cls, config: RunConfig) -> PromptCounter:
        """Counts prompts as this engine will report them, for the dry run and the budgets.
        Loads a tokenizer, never weights. The default is a remote API's: `model.tokenizer_name`,
        else the provider's tokenizer (`default_tokenizer`), else an estimate marked inexact."""
        return tokenizer_counter(config, cls.default_tokenizer)

    @classmethod
    def prompt_cache_tally(cls, config: RunConfig) -> PromptCacheTally:
        """The dry run's estimate of the prompt tokens the provider bills as cached: none by
        default (a local engine's own prefix cache costs nothing apart)."""
        return NoPromptCache()

    @classmethod
    def dtype_in_use(cls, model: ModelParams) -> str | None:
        """The dtype this engine will load `model` in on this machine, for `lmpress config
        show`; None where the engine has no such choice (a remote API, a GGUF file)."""
        return None

    @classmethod
    def key_variable(cls, config: RunConfig) -> str | None:
        """The environment variable the engine reads its API key from, if any: a `--ray` job
        hands it to replicas on machines whose environment lacks it. The one the config names
        (`remote_params.api_key_env_varname`), else the engine's default."""
        return config.remote_params.api_key_env_varname or cls.default_key_env

    @classmethod
    def replica_config(cls, config: RunConfig, replicas: int) -> RunConfig:
        """The config each of `replicas` copies of this engine gets in a `--ray` job, so that
        all of them together keep to the limits one run has. A local replica is a whole engine
        of its own: the config as given."""
        return config

    @property
    def model_name(self) -> str:
        return self.config.model.model_name

    @abstractmethod
    def stream(self, request: Request) -> AsyncIterator[Any]:
        """Yield `Delta`s as text is generated, then exactly one final `Result`.

        Closing the iterator early (the consumer went away, was cancelled) must stop the
        request's generation and free what it held in the backend. A failure of this one
        request comes back as a Result with `error` set, not as an exception.
        """

    async def complete(self, request: Request) -> Result:
        """The final Result of a request, deltas discarded."""
        result: Result | None = None
        async for item in self.stream(request):
            if isinstance(item, Result):
                result = item
        assert result is not None, f"{self.name} ended a stream without a Result"
        return result

    async def complete_together(self, requests: list[Request]) -> list[Result]:
        """Each request's final Result, in order. A local engine puts them before its worker
        at once, so it takes them in the same round (the choices of one question share their
        context's pass), never some before the rest have arrived."""
        return list(await asyncio.gather(*(self.complete(r) for r in requests)))

    async def embed(self, request: EmbedRequest) -> EmbedResult:
        """The request's inputs as vectors, one each, on an engine whose `tasks` include
        `embed`. A failure of this request comes back as an EmbedResult with `error` set."""
        raise UnsupportedParamError(f"engine {self.name} cannot embed")

    async def score(self, request: ScoreRequest) -> ScoreResult:
        """One relevance score per document against the query, on an engine whose `tasks`
        include `score`. A failure of this request comes back as a ScoreResult with `error`."""
        raise UnsupportedParamError(f"engine {self.name} cannot score")

    def tokenizer(self) -> Tokenizer:
        """The model's tokenizer, for `/tokenize`, scoring text and lm-eval; an engine that
        cannot tokenize (a remote API) refuses."""
        raise UnsupportedParamError(f"engine {self.name} cannot tokenize")

    async def loglikelihood(self, request: LoglikelihoodRequest) -> LoglikelihoodResult:
        """Each continuation's log-likelihood after the context, its greedy flag and token
        count (vocabulary/likelihood.py), from the prompt logprobs `stream` returns: on an
        engine whose `supported_params` hold `prompt_logprobs`. A failure comes back as a
        LoglikelihoodResult with `error` set."""
        from lmpress.engines.scoring import loglikelihood

        if "prompt_logprobs" not in self.supported_params:
            raise UnsupportedParamError(f"engine {self.name} cannot score prompts")
        return await loglikelihood(self, request)

    @property
    def adapter_names(self) -> frozenset[str]:
        """The adapters a request may choose now (`check_adapter`): those the config names,
        unless the engine loads and unloads them at run time and says otherwise."""
        return frozenset(self.config.model.adapters)

    async def load_adapter(self, name: str, path: str) -> None:
        """Load the LoRA adapter at `path` under `name`, while the engine runs (serve's
        /v1/load_lora_adapter); requests may choose it once this returns."""
        raise UnsupportedParamError(f"engine {self.name} cannot load adapters at run time")

    async def unload_adapter(self, name: str) -> None:
        """Drop the adapter `name` (serve's /v1/unload_lora_adapter); requests choosing it
        afterwards fail with not_found."""
        raise UnsupportedParamError(f"engine {self.name} cannot unload adapters at run time")

    def occupancy(self) -> Occupancy | None:
        """The requests running and waiting in the backend now; None where the engine cannot
        tell (a remote API queues on the provider's side). Called from the event loop while
        the engine works, so it reads and never waits."""
        return None

    async def aclose(self) -> None:
        """Release the backend. The engine is unusable afterwards."""

    def generate(
        self,
        inputs: Iterable[str | Sequence[dict[str, Any]] | Sequence[Message] | Request],
        params: GenerationParams | None = None,
        *,
        progress: bool = False,
    ) -> list[Result]:
        """Complete many inputs synchronously, in order: the convenience for Python users.

        An input is a prompt string, a list of chat messages, or a Request.
        """
        from lmpress.data.messages import parse_messages

        requests = []
        for i, item in enumerate(inputs):
            if isinstance(item, Request):
                requests.append(item)
                continue
            messages = (
                [Message("user", item)] if isinstance(item, str) else parse_messages(list(item))
            )
            requests.append(Request(str(i), messages, params or self.config.generation))
        for request in requests:
            check_params(self, request.params)
            check_tools(self, request)
        return asyncio.run(self._complete_all(requests, progress))

    async def _complete_all(self, requests: list[Request], progress: bool) -> list[Result]:
        slots = asyncio.Semaphore(self.max_in_flight)
        bar = ProgressBar("generate") if progress else None
        done = tokens = 0

        async def one(request: Request) -> Result:
            nonlocal done, tokens
            async with slots:
                result = await self.complete(request)
            if bar is not None:
                done, tokens = done + 1, tokens + result.usage.completion_tokens
                bar.update(done, tokens=tokens)
            return result

        try:
            if bar is not None:
                bar.start(len(requests))
            return await asyncio.gather(*(one(r) for r in requests))
        finally:
            if bar is not None:
                bar.stop()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run(self.aclose())


def unsupported_params(engine: Engine | type[Engine], params: GenerationParams) -> list[str]:
    """The generation fields set away from lmpress's defaults that the engine does not honour.
    A value the engine's API always uses (`inherent_params`) is honoured by construction."""
    inherent = engine.inherent_params
    return sorted(
        name
        for name, value in params.changed_fields().items()
        if name not in engine.supported_params and inherent.get(name, object()) != value
    )


def check_task(engine: Engine | type[Engine], task: str) -> None:
    """Refuse, before any work, a task the engine does not answer."""
    if task not in engine.tasks:
        answers = ", ".join(sorted(engine.tasks))
        raise UnsupportedParamError(
            f"task: engine {engine.name} cannot {task} (it answers {answers}); pick an engine "
            f"that can ('lmpress engines' lists what each answers)"
        )


def check_params(engine: Engine | type[Engine], params: GenerationParams) -> None:
    """Refuse, before any work, a generation parameter the engine does not honour."""
    unsupported = unsupported_params(engine, params)
    if unsupported:
        listed = ", ".join(f"generation.{name}" for name in unsupported)
        if "max_reasoning_tokens" in unsupported and "reasoning_effort" in engine.supported_params:
            # OpenAI's chat completions has an effort level and no token budget for thinking.
            listed += " (it bounds thinking with generation.reasoning_effort: use that)"
        raise UnsupportedParamError(
            f"engine {engine.name} does not support {listed}; remove it from the recipe or "
            f"overrides, or pick an engine that does ('lmpress engines' lists them)"
        )


def check_kv_cache_dtype(engine: Engine | type[Engine], config: RunConfig) -> None:
    """Refuse, before any work, a `model.kv_cache_dtype` the engine cannot hold."""
    wanted = config.model.kv_cache_dtype
    if wanted == "auto" or wanted in engine.kv_cache_dtypes:
        return
    takes = ", ".join(sorted(engine.kv_cache_dtypes))
    raise UnsupportedParamError(
        f"model.kv_cache_dtype: engine {engine.name} cannot hold its KV cache as {wanted}; "
        + (f"it takes {takes} (or auto)" if takes else "set it to auto")
    )


def check_adapters_taken(engine: Engine | type[Engine], config: RunConfig) -> None:
    """Refuse, before any work, `model.adapters` or `model.adapter_model` on an engine that
    cannot run them."""
    if config.model.adapter_model and not engine.merges_adapter_model:
        raise UnsupportedParamError(
            f"model.adapter_model: engine {engine.name} cannot merge an adapter into its model; "
            + (
                "name it under model.adapters and choose it per row (its `adapter` column)"
                if engine.takes_adapters
                else "remove it, or use NATIVE or VLLM"
            )
        )
    if config.model.adapters and not engine.takes_adapters:
        raise UnsupportedParamError(
            f"model.adapters: engine {engine.name} cannot run LoRA adapters chosen per row; "
            f"remove them, or use a local engine that can (NATIVE, VLLM, LLAMACPP)"
        )


def check_adapter(engine: Engine, request: Request) -> None:
    """Fail a request whose adapter the engine does not hold (now: serve may have unloaded
    it) alone, with vLLM's 404 for an unknown model."""
    if request.adapter is None or request.adapter in engine.adapter_names:
        return
    held = sorted(engine.adapter_names)
    raise RequestError(
        f"The model '{request.adapter}' does not exist: engine {engine.name} holds "
        + (f"the adapters {', '.join(repr(n) for n in held)}" if held else "no adapters"),
        ErrorKind.NOT_FOUND,
        status=404,
    )


def check_tools(engine: Engine | type[Engine], request: Request) -> None:
    """Refuse, before any work, tools on an engine that cannot take them
    (UnsupportedParamError), or a tool_choice that does not fit the tools (InputError)."""
    if uses_tools(request) and not engine.takes_tools:
        raise UnsupportedParamError(
            f"engine {engine.name} cannot take tools (the request offers tools or holds earlier "
            f"tool calls); remove them, or pick an engine that takes tools such as OPENAI, "
            f"ANTHROPIC or REMOTE"
        )
    try:
        check_request(request)
    except ToolError as exc:
        raise InputError(str(exc)) from None


def check_text(request: Request) -> None:
    """Refuse text that has no UTF-8 form, such as a lone surrogate: JSON allows the escape
    "\\ud800" and Python keeps it in a str, but every tokenizer fails on it deep in the
    backend, where the failure would not name the row's text."""
    texts = [("the prompt", request.prompt)] if request.prompt is not None else []
    texts += [(f"message {i} content", m.text()) for i, m in enumerate(request.messages, 1)]
    texts += [("generation.stop_strings", s) for s in request.params.stop_strings]
    for where, text in texts:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            bad = text[exc.start].encode("unicode_escape").decode("ascii")
            raise RequestError(
                f"{where} is not valid Unicode text: a lone surrogate {bad} at character "
                f"{exc.start + 1}; fix or remove that escape in the input",
                kind=ErrorKind.INVALID_REQUEST,
            ) from None


def check_token_settings(params: GenerationParams, n_vocab: int) -> None:
    """Refuse settings that name more tokens than the model has: a top_k above the vocabulary
    means nothing, and a stop token id past it would index outside the logits."""
    if params.top_k is not None and params.top_k > n_vocab:
        raise RequestError(
            f"generation.top_k: {params.top_k} is more than the model's {n_vocab} tokens; "
            f"use null for no limit",
            kind=ErrorKind.INVALID_REQUEST,
        )
    for token in params.stop_token_ids:
        if not 0 <= token < n_vocab:
            raise RequestError(
                f"generation.stop_token_ids: {token} is not a token id of this model "
                f"(0 to {n_vocab - 1})",
                kind=ErrorKind.INVALID_REQUEST,
            )


def error_result(request: Request, engine: Engine, error: ErrorInfo, started: float) -> Result:
    return Result(
        request_id=request.id,
        samples=[Sample(text="", finish_reason="error")],
        usage=Usage(),
        model=engine.model_name,
        engine=engine.name,
        latency_s=time.perf_counter() - started,
        error=error,
    )


def failure_info(exc: Exception) -> ErrorInfo:
    """The error a request gets when its step raised something unforeseen."""
    return ErrorInfo(ErrorKind.GENERATION_ERROR, exception_line(exc))
