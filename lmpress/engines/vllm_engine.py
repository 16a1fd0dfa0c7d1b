"""VLLM: vLLM's asynchronous engine (AsyncLLM), on one group of GPUs or as data-parallel replicas.

Requests stream into vLLM as they are submitted and come back as each finishes; vLLM's
scheduler batches whatever is in flight. AsyncLLM lives on an event loop of its own, on a worker
thread, so one engine serves any caller's loop (batch, chat, serve, and `generate()`, which
starts a new loop per call). Closing a request's stream aborts the request in vLLM.

Where each concern lives:
- `VllmApi`: the vLLM classes lmpress calls, imported in one place; every difference between
  vLLM versions is handled there and nowhere else.
- `engine_settings()`: the recipe's `model` section -> AsyncEngineArgs keyword arguments
  (`model.model_kwargs` pass through and win over the fields they overlap).
- `sampling_params()`: GenerationParams -> SamplingParams, the one translation of sampling.
- `OutputAssembler`: RequestOutputs -> Deltas and the final Result, the one place vLLM's outputs
  are read.
- `data_parallel_size > 1`: `vllm_replicas.ReplicaPool` runs that many engine processes.

Chat rows are rendered with vLLM's tokenizer and the model's chat template (or
`model.chat_template`), then tokenized by vLLM without adding special tokens again, as vLLM's
own `LLM.chat` does for text conversations. Image parts are refused for now.
"""

from __future__ import annotations

import asyncio
import dataclasses
import difflib
import inspect
import itertools
import json
import os
import re
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lmpress.configs.schema import RunConfig
from lmpress.engines.base import Engine, error_result
from lmpress.engines.native import local_or_hub, resolve_chat_template
from lmpress.errors import (
    ConfigError,
    EngineUnavailableError,
    LmpressError,
    ModelLoadError,
    RequestError,
)
from lmpress.types import (
    Delta,
    ErrorInfo,
    GenerationParams,
    Request,
    Result,
    Sample,
    TokenLogprob,
    Usage,
)

INSTALL_HINT = "pip install -U 'lmpress[vllm]'"

# --- the vLLM API lmpress calls, and every version difference -------------------------------

# structured_outputs=StructuredOutputsParams(...) replaced guided decoding in vLLM 0.12.
MIN_VERSION = (0, 12)
# The LoRA ranks vLLM accepts (vllm.config.lora.MaxLoRARanks); an adapter's rank is rounded up.
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


@dataclass(frozen=True)
class VllmApi:
    """The vLLM classes lmpress calls, imported on first use (never at module level)."""

    version: str
    AsyncLLM: Any
    AsyncEngineArgs: Any
    SamplingParams: Any
    StructuredOutputsParams: Any
    RequestOutputKind: Any
    LoRARequest: Any

    @classmethod
    def load(cls) -> VllmApi:
        version = vllm_version()  # raises with the install hint when vllm is missing or too old
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.lora.request import LoRARequest
        from vllm.sampling_params import (
            RequestOutputKind,
            SamplingParams,
            StructuredOutputsParams,
        )
        from vllm.v1.engine.async_llm import AsyncLLM

        return cls(
            version,
            AsyncLLM,
            AsyncEngineArgs,
            SamplingParams,
            StructuredOutputsParams,
            RequestOutputKind,
            LoRARequest,
        )

    def engine_arg_names(self) -> set[str]:
        return {f.name for f in dataclasses.fields(self.AsyncEngineArgs)}

    @staticmethod
    async def tokenizer(llm: Any) -> Any:
        """AsyncLLM.get_tokenizer() is a coroutine in some vLLM versions and a plain method in
        later ones."""
        tokenizer = llm.get_tokenizer()
        if inspect.isawaitable(tokenizer):
            tokenizer = await tokenizer
        return tokenizer

    @staticmethod
    def is_dead(llm: Any) -> bool:
        """Whether the engine core has died (every later request would fail too)."""
        return bool(getattr(llm, "errored", False))


def vllm_version() -> str:
    """vLLM's version, or EngineUnavailableError saying how to install a usable one."""
    # vLLM logs to stdout unless told otherwise; lmpress's stdout carries replies and JSONL.
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    try:
        import vllm
    except ImportError as exc:
        raise EngineUnavailableError(
            f"engine VLLM needs vllm>={'.'.join(map(str, MIN_VERSION))}, which does not import "
            f"here ({first_line(exc)}): {INSTALL_HINT} (vLLM runs on Linux with a GPU)"
        ) from exc
    version = str(getattr(vllm, "__version__", "0"))
    if _version_tuple(version) < MIN_VERSION:
        raise EngineUnavailableError(
            f"engine VLLM needs vllm>={'.'.join(map(str, MIN_VERSION))}, found {version}: "
            f"{INSTALL_HINT}"
        )
    return version


def accelerator_reason() -> str | None:
    """Why vLLM cannot run on this machine's hardware, or None when it found a device."""
    from vllm.platforms import current_platform

    if not getattr(current_platform, "device_type", ""):
        return (
            "vLLM found no GPU on this machine (it needs a CUDA or ROCm GPU, or a vLLM build "
            "for another accelerator); on CPU use engine NATIVE or LLAMACPP"
        )
    return None


def visible_gpus() -> list[str]:
    """The GPUs this process may use: CUDA_VISIBLE_DEVICES when set, else every device."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [gpu.strip() for gpu in listed.split(",") if gpu.strip()]
    try:
        import torch  # vLLM depends on it

        return [str(i) for i in range(torch.cuda.device_count())]
    except Exception:
        return []


def _version_tuple(version: str) -> tuple[int, ...]:
    parts = re.findall(r"\d+", version.split("+")[0])[:3]
    return tuple(int(p) for p in parts) or (0,)


# --- engine arguments -------------------------------------------------------------------------


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _flag(value: Any) -> bool:
    return isinstance(value, bool)


# The engine arguments lmpress documents (recipes/vllm-*.yaml), checked here so that a wrong
# value fails at once with its key rather than deep inside vLLM minutes later.
DOCUMENTED_ARGS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "tensor_parallel_size": (_whole, "must be a whole number of GPUs, at least 1"),
    "pipeline_parallel_size": (_whole, "must be a whole number of GPUs, at least 1"),
    "data_parallel_size": (_whole, "must be a whole number of replicas, at least 1"),
    "gpu_memory_utilization": (
        lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= 1,
        "must be the fraction of each GPU's memory vLLM may take, in (0, 1], e.g. 0.9",
    ),
    "max_model_len": (_whole, "must be a number of tokens, at least 1"),
    "max_num_seqs": (_whole, "must be a number of sequences, at least 1"),
    "enable_prefix_caching": (_flag, "must be true or false"),
    "enforce_eager": (_flag, "must be true or false"),
    "trust_remote_code": (_flag, "must be true or false"),
    "quantization": (
        lambda v: v is None or isinstance(v, str),
        "must be a quantization method such as awq, gptq or fp8, or null",
    ),
    "dtype": (
        lambda v: isinstance(v, str),
        "must be auto, bfloat16, float16 or float32",
    ),
}

DTYPES = {
    "auto": "auto", "bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16",
    "fp16": "float16", "half": "float16", "float32": "float32", "fp32": "float32",
    "float": "float32",
}  # fmt: skip

# vLLM's default max_num_seqs on most GPUs; the engine keeps twice that many requests in flight
# per replica so the scheduler always has the next ones waiting.
DEFAULT_MAX_NUM_SEQS = 256


@dataclass
class EngineSettings:
    """What the recipe asks of vLLM, checked."""

    args: dict[str, Any]  # AsyncEngineArgs keyword arguments for one replica
    data_parallel_size: int = 1
    gpus_per_replica: int = 1
    adapter: str | None = None  # model.adapter_model, as vLLM should load it

    @property
    def max_num_seqs(self) -> int:
        return self.args.get("max_num_seqs") or DEFAULT_MAX_NUM_SEQS


def engine_settings(config: RunConfig, known_args: set[str] | None = None) -> EngineSettings:
    """The AsyncEngineArgs keyword arguments a run config asks for.

    `known_args` (the field names of vLLM's AsyncEngineArgs) catches a misspelt key in
    `model.model_kwargs` before vLLM starts.
    """
    model = config.model
    kwargs = dict(model.model_kwargs)
    for key, value in kwargs.items():
        if key in DOCUMENTED_ARGS:
            ok, allowed = DOCUMENTED_ARGS[key]
            if not ok(value):
                raise ConfigError(f"model.model_kwargs.{key}: {value!r} {allowed}")
        elif known_args is not None and key not in known_args:
            close = difflib.get_close_matches(key, sorted(known_args | set(DOCUMENTED_ARGS)), 1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ConfigError(
                f"model.model_kwargs.{key}: not an engine argument of vLLM{hint}; see "
                f"https://docs.vllm.ai/en/latest/configuration/engine_args.html"
            )
    dtype = DTYPES.get(model.torch_dtype_str.lower())
    if dtype is None:
        raise ConfigError(
            f"model.torch_dtype_str: unknown dtype '{model.torch_dtype_str}' for VLLM "
            f"(use auto, bfloat16, float16 or float32)"
        )
    args: dict[str, Any] = {
        "model": local_or_hub(model.model_name, "model.model_name"),
        "dtype": dtype,
        "trust_remote_code": model.trust_remote_code,
        "disable_log_stats": True,
    }
    if model.tokenizer_name:
        args["tokenizer"] = local_or_hub(model.tokenizer_name, "model.tokenizer_name")
    if model.model_revision:
        args["revision"] = model.model_revision
    if model.model_max_length:
        args["max_model_len"] = model.model_max_length
    adapter = None
    if model.adapter_model:
        adapter = local_or_hub(model.adapter_model, "model.adapter_model")
        args["enable_lora"] = True
        if "max_lora_rank" not in kwargs:
            args["max_lora_rank"] = lora_rank(adapter)
    data_parallel = kwargs.pop("data_parallel_size", 1)
    args.update(kwargs)
    per_replica = args.get("tensor_parallel_size", 1) * args.get("pipeline_parallel_size", 1)
    return EngineSettings(args, data_parallel, per_replica, adapter)


def lora_rank(adapter: str) -> int:
    """The LoRA rank vLLM must reserve for an adapter (its `r`, rounded up to a rank vLLM
    accepts), read from the adapter's adapter_config.json."""
    path = Path(adapter)
    config_file = path / "adapter_config.json"
    if not path.exists():
        try:
            from huggingface_hub import hf_hub_download

            config_file = Path(hf_hub_download(adapter, "adapter_config.json"))
        except Exception as exc:
            raise ModelLoadError(
                f"model.adapter_model: cannot read the adapter's rank from '{adapter}' "
                f"({first_line(exc)}); give a local adapter directory or set "
                f"model.model_kwargs.max_lora_rank"
            ) from exc
    try:
        peft = json.loads(config_file.read_text(encoding="utf-8"))
        ranks = [int(peft["r"]), *(int(r) for r in (peft.get("rank_pattern") or {}).values())]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ModelLoadError(
            f"model.adapter_model: {config_file} is not a PEFT LoRA config with a rank 'r' "
            f"({first_line(exc)})"
        ) from exc
    rank = max(ranks)
    for allowed in LORA_RANKS:
        if rank <= allowed:
            return allowed
    raise ModelLoadError(
        f"model.adapter_model: LoRA rank {rank} is above the {LORA_RANKS[-1]} vLLM supports"
    )


# --- GenerationParams -> SamplingParams -------------------------------------------------------

STRUCTURED_CONSTRAINTS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")
STRUCTURED_OPTIONS = (
    "disable_any_whitespace",
    "disable_additional_properties",
    "whitespace_pattern",
)


def sampling_params(api: VllmApi, params: GenerationParams, *, stream: bool) -> Any:
    """The vLLM SamplingParams for lmpress generation settings.

    `stream` asks for each output's new text as it is generated (RequestOutputKind.DELTA);
    otherwise vLLM sends one final output (FINAL_ONLY). Raises ConfigError naming the
    `generation.*` key when vLLM cannot honour a setting.
    """
    if params.n > 1 and params.temperature == 0:
        raise ConfigError(
            f"generation.n: {params.n} samples need generation.temperature > 0 on VLLM "
            f"(vLLM refuses n > 1 with greedy decoding)"
        )
    kind = api.RequestOutputKind
    try:
        return api.SamplingParams(
            n=params.n,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k or 0,  # vLLM: 0 means no limit
            min_p=params.min_p,
            repetition_penalty=params.repetition_penalty,
            presence_penalty=params.presence_penalty,
            frequency_penalty=params.frequency_penalty,
            stop=list(params.stop_strings),
            stop_token_ids=list(params.stop_token_ids),
            seed=params.seed,
            max_tokens=params.max_new_tokens,
            min_tokens=params.min_tokens,
            # vLLM returns the chosen token's logprob plus the top k; 0 means the chosen only.
            logprobs=params.top_logprobs if params.logprobs else None,
            skip_special_tokens=params.skip_special_tokens,
            logit_bias=_logit_bias(params.logit_bias),
            structured_outputs=_structured_outputs(api, params.guided_decoding),
            output_kind=kind.DELTA if stream else kind.FINAL_ONLY,
        )
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"generation: vLLM refused these settings: {first_line(exc)}") from exc


def _logit_bias(bias: dict[str, float]) -> dict[int, float] | None:
    if not bias:
        return None
    out = {}
    for key, value in bias.items():
        try:
            out[int(key)] = float(value)
        except (TypeError, ValueError) as exc:
            raise ConfigError(
                f"generation.logit_bias: key {key!r} is not a token id; vLLM biases token ids, "
                f"e.g. {{'1234': -100}}"
            ) from exc
    return out


def _structured_outputs(api: VllmApi, spec: dict[str, Any] | None) -> Any:
    if not spec:
        return None
    allowed = STRUCTURED_CONSTRAINTS + STRUCTURED_OPTIONS
    for key in spec:
        if key not in allowed:
            close = difflib.get_close_matches(key, allowed, 1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ConfigError(
                f"generation.guided_decoding.{key}: not a vLLM structured-output setting{hint}; "
                f"use one of {', '.join(STRUCTURED_CONSTRAINTS)}"
            )
    given = [key for key in STRUCTURED_CONSTRAINTS if spec.get(key) is not None]
    if len(given) != 1:
        got = ", ".join(given) or "none"
        raise ConfigError(
            f"generation.guided_decoding: give exactly one of "
            f"{', '.join(STRUCTURED_CONSTRAINTS)} (got {got})"
        )
    return api.StructuredOutputsParams(**spec)


# --- RequestOutput -> Delta / Result ------------------------------------------------------------

FINISH_REASONS = {"stop": "stop", "length": "length", "abort": "cancelled", "error": "error"}


@dataclass
class _SampleState:
    text: str = ""
    tokens: int = 0
    finish_reason: str | None = None
    logprobs: list[TokenLogprob] | None = None


@dataclass
class OutputAssembler:
    """vLLM's RequestOutputs for one request -> lmpress Deltas as they come, then the Result.

    Requests are sent with RequestOutputKind.DELTA or FINAL_ONLY, so each CompletionOutput
    carries only text and tokens not seen before (FINAL_ONLY sends everything once).
    `top_logprobs` is None when logprobs were not asked for.
    """

    request_id: str
    top_logprobs: int | None = None
    prompt_tokens: int = 0
    samples: dict[int, _SampleState] = field(default_factory=dict)

    def feed(self, output: Any) -> list[Delta]:
        if output.prompt_token_ids is not None:
            self.prompt_tokens = len(output.prompt_token_ids)
        deltas = []
        for completion in output.outputs:
            state = self.samples.setdefault(completion.index, _SampleState())
            state.text += completion.text
            state.tokens += len(completion.token_ids)
            if completion.finish_reason is not None:
                state.finish_reason = FINISH_REASONS.get(completion.finish_reason, "stop")
            if self.top_logprobs is not None and completion.logprobs:
                state.logprobs = (state.logprobs or []) + self._logprobs(completion)
            if completion.text:
                deltas.append(Delta(self.request_id, completion.text, completion.index))
        return deltas

    def _logprobs(self, completion: Any) -> list[TokenLogprob]:
        out = []
        for token_id, position in zip(completion.token_ids, completion.logprobs, strict=False):
            chosen = position.get(token_id)
            if chosen is None:  # not in the map: vLLM always includes the chosen token
                continue
            ranked = sorted(position.values(), key=lambda lp: -lp.logprob)[: self.top_logprobs]
            top = [(lp.decoded_token or "", lp.logprob) for lp in ranked]
            out.append(TokenLogprob(chosen.decoded_token or "", chosen.logprob, top))
        return out

    def result(self, *, model: str, engine: str, latency_s: float) -> Result:
        samples = []
        for index in sorted(self.samples):
            state = self.samples[index]
            if state.logprobs is None and self.top_logprobs is not None:
                state.logprobs = []
            samples.append(
                Sample(state.text, state.finish_reason or "length", state.logprobs, state.tokens)
            )
        return Result(
            request_id=self.request_id,
            samples=samples,
            usage=Usage(self.prompt_tokens, sum(s.completion_tokens for s in samples)),
            model=model,
            engine=engine,
            latency_s=latency_s,
        )


# --- the engine -----------------------------------------------------------------------------


class VllmEngine(Engine):
    name = "VLLM"
    supported_params = frozenset({
        "max_new_tokens", "temperature", "top_p", "top_k", "min_p", "repetition_penalty",
        "presence_penalty", "frequency_penalty", "stop_strings", "stop_token_ids", "min_tokens",
        "seed", "n", "logprobs", "top_logprobs", "logit_bias", "guided_decoding",
        "skip_special_tokens",
    })  # fmt: skip

    @classmethod
    def unavailable_reason(cls) -> str | None:
        try:
            vllm_version()
            return accelerator_reason()
        except EngineUnavailableError as exc:
            return str(exc).removeprefix("engine VLLM ")
        except Exception as exc:  # a broken install must not break `lmpress engines`
            return f"vllm is installed but fails to load ({first_line(exc)}): {INSTALL_HINT}"

    def __init__(self, config: RunConfig):
        super().__init__(config)
        self.api = VllmApi.load()
        self.settings = engine_settings(config, self.api.engine_arg_names())
        sampling_params(self.api, config.generation, stream=False)  # refuse bad settings now
        template = config.model.chat_template
        self.chat_template = resolve_chat_template(template) if template else None
        replicas = self.settings.data_parallel_size
        self.max_in_flight = 2 * self.settings.max_num_seqs * replicas
        self._backend: Any
        if replicas > 1:
            from lmpress.engines.vllm_replicas import ReplicaPool, replica_gpus

            groups = replica_gpus(replicas, self.settings.gpus_per_replica, visible_gpus())
            self._backend = ReplicaPool(self, groups)
        else:
            self._backend = AsyncLLMRunner(self)

    def stream(self, request: Request) -> AsyncIterator[Delta | Result]:
        return self._backend.run(request, deltas=True)

    async def complete(self, request: Request) -> Result:
        result = None
        async for item in self._backend.run(request, deltas=False):
            result = item
        assert isinstance(result, Result)
        return result

    async def aclose(self) -> None:
        await self._backend.aclose()


class _End:
    """The request's outputs are all delivered."""


@dataclass
class _Failure:
    error: BaseException
    engine_dead: bool


class AsyncLLMRunner:
    """One AsyncLLM on an event loop of its own, on a worker thread; requests from any caller's
    loop are bridged to it and their outputs bridged back."""

    def __init__(self, engine: VllmEngine):
        self.engine = engine
        self.api = engine.api
        settings = engine.settings
        self.lora_request = None
        if settings.adapter:
            self.lora_request = self.api.LoRARequest(
                lora_name=Path(settings.adapter).name or "adapter",
                lora_int_id=1,
                lora_path=settings.adapter,
            )
        self._ids = itertools.count(1)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="lmpress-vllm", daemon=True
        )
        self._thread.start()
        try:
            started = asyncio.run_coroutine_threadsafe(self._start(settings.args), self._loop)
            self.llm, self.tokenizer = started.result()
        except BaseException:
            self._stop_loop()
            raise

    async def _start(self, args: dict[str, Any]) -> tuple[Any, Any]:
        # Built on this loop: AsyncLLM binds its output handler to the loop it starts on.
        try:
            llm = self.api.AsyncLLM.from_engine_args(self.api.AsyncEngineArgs(**args))
        except LmpressError:
            raise
        except Exception as exc:
            raise ModelLoadError(
                f"vLLM could not start model '{args['model']}': {describe(exc)}"
            ) from exc
        return llm, await self.api.tokenizer(llm)

    # --- requests, on the caller's loop ---------------------------------------------------

    async def run(self, request: Request, *, deltas: bool) -> AsyncIterator[Delta | Result]:
        engine = self.engine
        started = time.perf_counter()
        try:
            prompt, tokenization = self.render(request)
            params = sampling_params(self.api, request.params, stream=deltas)
        except (RequestError, ConfigError) as exc:
            kind = getattr(exc, "kind", "invalid_request")
            yield error_result(request, engine, ErrorInfo(kind, str(exc)), started)
            return
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        vllm_id = f"{request.id}-{next(self._ids)}"
        pump = self._pump(vllm_id, prompt, params, tokenization, loop, queue)
        future = asyncio.run_coroutine_threadsafe(pump, self._loop)
        top = request.params.top_logprobs if request.params.logprobs else None
        assembler = OutputAssembler(request.id, top)
        try:
            while True:
                item = await queue.get()
                if isinstance(item, _End):
                    break
                if isinstance(item, _Failure):
                    if item.engine_dead:
                        raise EngineUnavailableError(
                            f"vLLM's engine stopped ({describe(item.error)}); the rows written "
                            f"so far are kept"
                        )
                    yield error_result(request, engine, _error_info(item.error), started)
                    return
                for delta in assembler.feed(item):
                    if deltas:
                        yield delta
            latency = time.perf_counter() - started
            yield assembler.result(model=engine.model_name, engine=engine.name, latency_s=latency)
        finally:
            # The consumer finished, was cancelled or went away: abort the request in vLLM.
            if not future.done():
                future.cancel()

    def render(self, request: Request) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """The prompt as vLLM takes it, and the tokenization arguments to go with it."""
        if request.prompt is not None:
            return {"prompt": request.prompt}, None
        if any(m.has_images() for m in request.messages):
            raise RequestError(
                "the VLLM engine in lmpress sends text only for now; this row has image parts",
                kind="invalid_request",
            )
        options: dict[str, Any] = {"tokenize": False, "add_generation_prompt": True}
        if self.engine.chat_template:
            options["chat_template"] = self.engine.chat_template
        elif not getattr(self.tokenizer, "chat_template", None):
            raise RequestError(
                f"model '{self.engine.model_name}' has no chat template; set model.chat_template "
                f"(a Jinja string, a template file, or 'chatml')",
                kind="invalid_request",
            )
        messages = [{"role": m.role, "content": m.text()} for m in request.messages]
        try:
            text = self.tokenizer.apply_chat_template(messages, **options)
        except Exception as exc:  # Jinja raises its own errors for refused conversations
            raise RequestError(f"chat template failed: {exc}", kind="invalid_request") from exc
        # The template writes BOS and the other special tokens itself.
        return {"prompt": text}, {"add_special_tokens": False}

    # --- requests, on the engine's loop -----------------------------------------------------

    async def _pump(
        self,
        vllm_id: str,
        prompt: dict[str, Any],
        params: Any,
        tokenization: dict[str, Any] | None,
        loop: asyncio.AbstractEventLoop,
        queue: asyncio.Queue,
    ) -> None:
        def send(item: Any) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, item)
            except RuntimeError:  # the caller's loop is closed: nobody is listening
                pass

        try:
            async for output in self.llm.generate(
                prompt,
                params,
                vllm_id,
                lora_request=self.lora_request,
                tokenization_kwargs=tokenization,
            ):
                send(output)
        except asyncio.CancelledError:
            # generate() aborts on cancellation itself; aborting by id as well costs nothing
            # and frees the sequence whatever the version does.
            await self.llm.abort(vllm_id)
            raise
        except Exception as exc:
            send(_Failure(exc, self.api.is_dead(self.llm)))
            return
        send(_End())

    # --- shutting down ----------------------------------------------------------------------

    async def aclose(self) -> None:
        if self._thread.is_alive():

            async def shutdown() -> None:
                self.llm.shutdown()

            await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(shutdown(), self._loop))
        await asyncio.to_thread(self._stop_loop)

    def _stop_loop(self) -> None:
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        if not self._loop.is_closed():
            self._loop.close()


def _error_info(exc: BaseException) -> ErrorInfo:
    message = describe(exc)
    if isinstance(exc, ValueError) or isinstance(exc.__cause__, ValueError):
        # vLLM's validation errors (VLLMValidationError is a ValueError): this request only.
        kind = "context_length_exceeded" if "context length" in message else "invalid_request"
        return ErrorInfo(kind, message)
    return ErrorInfo("generation_error", message)


def describe(exc: BaseException) -> str:
    """An exception's message on one line, looking through vLLM's wrappers (EngineGenerateError
    carries no message of its own, only its cause). Multi-line messages, such as pydantic's
    validation errors for engine arguments, are folded into one line."""
    seen: BaseException | None = exc
    while seen is not None:
        lines = [line.strip() for line in str(seen).splitlines() if line.strip()]
        lines = [line for line in lines if not line.startswith("For further information")]
        if lines:
            text = " ".join(lines)
            text = text if len(text) <= 500 else text[:497] + "..."
            return text if seen is exc else f"{type(exc).__name__}: {text}"
        seen = seen.__cause__ or seen.__context__
    return type(exc).__name__


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
