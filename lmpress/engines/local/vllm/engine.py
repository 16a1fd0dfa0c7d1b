"""VLLM: vLLM's asynchronous engine (AsyncLLM), on one group of GPUs or as data-parallel replicas.

Requests stream into vLLM as they are submitted and come back as each finishes; vLLM's
scheduler batches whatever is in flight. AsyncLLM lives on an event loop of its own, on a worker
thread, so one engine serves any caller's loop (batch, chat, serve, and `generate()`, which
starts a new loop per call). Closing a request's stream aborts the request in vLLM.

Where each concern lives:
- `VllmApi` (here): the vLLM classes lmpress calls, imported in one place; every difference
  between vLLM versions is handled there and nowhere else.
- vllm_translate.py: recipe -> AsyncEngineArgs (`engine_settings`), GenerationParams ->
  SamplingParams (`sampling_params`), RequestOutput -> Delta/Result (`OutputAssembler`).
- vllm_replicas.py: `data_parallel_size > 1`, one engine process per group of GPUs.

Chat rows are rendered with vLLM's tokenizer and the model's chat template (or
`model.chat_template`), then tokenized by vLLM without adding special tokens again, as vLLM's
own `LLM.chat` does for text conversations. Image parts are refused for now.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import itertools
import os
import re
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmpress.configs.schema import RunConfig
from lmpress.engines.base import Engine, check_text, error_result
from lmpress.engines.common.prompts import render_chat_prompt, resolve_chat_template
from lmpress.engines.local.vllm.translate import (
    OutputAssembler,
    engine_settings,
    sampling_params,
)
from lmpress.engines.local.worker import CallerQueue
from lmpress.errors import (
    ConfigError,
    EngineUnavailableError,
    LmpressError,
    ModelLoadError,
    RequestError,
    first_line,
)
from lmpress.types import Delta, ErrorInfo, Request, Result

INSTALL_HINT = "pip install -U 'lmpress[vllm]'"

# --- the vLLM API lmpress calls, and every version difference -------------------------------

# structured_outputs=StructuredOutputsParams(...) replaced guided decoding in vLLM 0.12.
MIN_VERSION = (0, 12)


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
            from lmpress.engines.local.vllm.replicas import ReplicaPool, replica_gpus

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
            check_text(request)
            prompt, tokenization = self.render(request)
            params = sampling_params(self.api, request.params, stream=deltas)
        except (RequestError, ConfigError) as exc:
            kind = getattr(exc, "kind", "invalid_request")
            yield error_result(request, engine, ErrorInfo(kind, str(exc)), started)
            return
        except Exception as exc:  # vLLM refused this request's settings: it fails alone
            yield error_result(request, engine, _error_info(exc), started)
            return
        replies = CallerQueue()
        vllm_id = f"{request.id}-{next(self._ids)}"
        pump = self._pump(vllm_id, prompt, params, tokenization, replies)
        future = asyncio.run_coroutine_threadsafe(pump, self._loop)
        top = request.params.top_logprobs if request.params.logprobs else None
        assembler = OutputAssembler(request.id, top)
        try:
            while True:
                item = await replies.get()
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
        text = render_chat_prompt(
            self.tokenizer,
            request,
            "VLLM",
            self.engine.model_name,
            self.engine.chat_template,
            self.engine.config.model.chat_template_kwargs,
        )
        # The template writes BOS and the other special tokens itself.
        return {"prompt": text}, {"add_special_tokens": False}

    # --- requests, on the engine's loop -----------------------------------------------------

    async def _pump(
        self,
        vllm_id: str,
        prompt: dict[str, Any],
        params: Any,
        tokenization: dict[str, Any] | None,
        replies: CallerQueue,
    ) -> None:
        # A put that finds the caller's loop closed is dropped: nobody is listening.
        try:
            async for output in self.llm.generate(
                prompt,
                params,
                vllm_id,
                lora_request=self.lora_request,
                tokenization_kwargs=tokenization,
            ):
                replies.put(output)
        except asyncio.CancelledError:
            # generate() aborts on cancellation itself; aborting by id as well costs nothing
            # and frees the sequence whatever the version does.
            await self.llm.abort(vllm_id)
            raise
        except Exception as exc:
            replies.put(_Failure(exc, self.api.is_dead(self.llm)))
            return
        replies.put(_End())

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
