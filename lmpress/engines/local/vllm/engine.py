"""VLLM: vLLM's asynchronous engine (AsyncLLM).

`AsyncLLMRunner` streams requests into vLLM as they are submitted; vLLM's scheduler batches
whatever is in flight. AsyncLLM lives on an event loop of its own, on a worker thread, so one
engine serves any caller's loop (batch, chat, serve, and `generate()`, which starts a new loop
per call). Closing a request's stream aborts the request in vLLM.

Data parallelism is vLLM's own: `model.model_kwargs.data_parallel_size: N` goes to
AsyncEngineArgs like the tensor and pipeline sizes, and AsyncLLM starts N engine cores and
balances requests across them, as `vllm serve --data-parallel-size N` does.

Chat rows are rendered with vLLM's tokenizer and the model's chat template (or
`model.chat_template`), then tokenized by vLLM without adding special tokens again, as vLLM's
own `LLM.chat` does for text conversations. A row with images (read once by lmpress.vocabulary.images)
goes to the template as parts, so that it writes the model's image placeholders, and its
pixels go as the prompt's `multi_modal_data`, which vLLM's processor expands into image
tokens. vLLM refuses images for a text model; `model.model_kwargs.limit_mm_per_prompt` is
vLLM's own cap on images a prompt.

The rest of the package: api.py (the vLLM classes lmpress calls, and every version
difference) and translate.py (recipe -> engine arguments, GenerationParams -> SamplingParams,
RequestOutput -> Delta/Result).
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from lmpress.configs.schema import ModelParams, RunConfig
from lmpress.engines.base import Engine, check_text, error_result
from lmpress.engines.common.models import dtype_in_use
from lmpress.engines.common.prompts import render_chat_prompt, resolve_chat_template
from lmpress.engines.common.tool_parsers import ToolPlan, check_parser, tool_plan
from lmpress.engines.local.vllm import prompt_count
from lmpress.engines.local.vllm.api import (
    INSTALL_HINT,
    VllmApi,
    accelerator_reason,
    describe,
    failure,
    is_request_error,
    visible_gpus,
    vllm_version,
)
from lmpress.engines.local.vllm.logs import children_print_to_log
from lmpress.engines.local.vllm.translate import (
    EngineSettings,
    OutputAssembler,
    engine_settings,
    sampling_params,
)
from lmpress.engines.local.worker import CallerQueue
from lmpress.engines.prompt_count import PromptCounter
from lmpress.vocabulary.errors import (
    ConfigError,
    EngineUnavailableError,
    ErrorKind,
    LmpressError,
    ModelLoadError,
    RequestError,
    first_line,
)
from lmpress.vocabulary.images import load_images
from lmpress.vocabulary.types import Delta, ErrorInfo, Request, Result

# --- the engine -----------------------------------------------------------------------------


class VllmEngine(Engine):
    name = "VLLM"
    # Tools go into the prompt and calls come back out as on NATIVE (common/tool_calls.py); a
    # required call is generated under its grammar by vLLM's structured outputs.
    takes_tools = True
    supported_params = frozenset({
        "max_new_tokens", "temperature", "top_p", "top_k", "min_p", "repetition_penalty",
        "presence_penalty", "frequency_penalty", "stop_strings", "stop_token_ids", "min_tokens",
        "seed", "n", "logprobs", "top_logprobs", "logit_bias", "guided_decoding",
        "skip_special_tokens",
    })  # fmt: skip
    takes_hub_ids = True

    @classmethod
    def prompt_counter(cls, config: RunConfig) -> PromptCounter:
        return prompt_count.prompt_counter(config)

    @classmethod
    def dtype_in_use(cls, model: ModelParams) -> str | None:
        return dtype_in_use(str(model.model_kwargs.get("dtype") or model.torch_dtype_str))

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
        self.settings = engine_settings(config, self.api.engine_arg_names(), self.api.auto_dtype())
        sampling_params(self.api, config.generation, stream=False)  # refuse bad settings now
        template = config.model.chat_template
        self.chat_template = resolve_chat_template(template) if template else None
        self.tool_call_parser = check_parser(config.model.tool_call_parser)
        self.max_in_flight = 2 * self.settings.max_num_seqs * self.settings.data_parallel_size
        # One copy: vLLM checks tensor x pipeline against the GPUs itself, and says so plainly.
        if self.settings.data_parallel_size > 1:
            check_gpus(self.settings, visible_gpus())
        self._runner = AsyncLLMRunner(self)

    def stream(self, request: Request) -> AsyncIterator[Delta | Result]:
        return self._runner.run(request, deltas=True)

    async def complete(self, request: Request) -> Result:
        result = None
        async for item in self._runner.run(request, deltas=False):
            result = item
        assert isinstance(result, Result)
        return result

    async def aclose(self) -> None:
        await self._runner.aclose()


def check_gpus(settings: EngineSettings, visible: list[str]) -> None:
    """Refuse a data-parallel run that needs more GPUs than this process sees, before vLLM
    starts: vLLM finds out only while starting its engine processes, one per copy."""
    if len(visible) < settings.gpus:
        shown = ",".join(visible) or "none"
        raise ConfigError(
            f"model.model_kwargs.data_parallel_size: {settings.data_parallel_size} copies of the "
            f"model need {settings.gpus} GPUs (data x tensor x pipeline parallel size), but "
            f"{len(visible)} are visible (CUDA_VISIBLE_DEVICES: {shown})"
        )


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
            with children_print_to_log():
                started = asyncio.run_coroutine_threadsafe(self._start(settings.args), self._loop)
                self.llm, self.tokenizer = started.result()
        except BaseException:
            self._stop_loop()
            raise

    async def _start(self, args: dict[str, Any]) -> tuple[Any, Any]:
        # Built on this loop: AsyncLLM binds its output handler to the loop it starts on.
        try:
            llm = self.api.AsyncLLM.from_engine_args(self.api.engine_args(args))
        except LmpressError:
            raise
        except Exception as exc:
            raise ModelLoadError(
                f"vLLM could not start model '{args['model']}': {failure(exc)}"
            ) from exc
        return llm, await self.api.tokenizer(llm)

    # --- requests, on the caller's loop ---------------------------------------------------

    async def run(self, request: Request, *, deltas: bool) -> AsyncIterator[Delta | Result]:
        engine = self.engine
        started = time.perf_counter()
        try:
            check_text(request)
            plan = self.tool_plan(request)
            prompt, tokenization = self.render(request, plan)
            generation = request.params
            if plan is not None and plan.grammar:  # tool_choice required, or a named function
                generation = replace(generation, guided_decoding={"grammar": plan.grammar})
            params = sampling_params(self.api, generation, stream=deltas)
        except (RequestError, ConfigError) as exc:
            kind = getattr(exc, "kind", ErrorKind.INVALID_REQUEST)
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
                            f"vLLM's engine stopped ({failure(item.error)}); the rows written "
                            f"so far are kept"
                        )
                    yield error_result(request, engine, _error_info(item.error), started)
                    return
                for delta in assembler.feed(item):
                    if deltas and plan is None:  # a reply that may be a call arrives whole
                        yield delta
            latency = time.perf_counter() - started
            result = assembler.result(
                model=engine.model_name, engine=engine.name, latency_s=latency
            )
            if plan is not None:
                result.samples = [plan.read(sample) for sample in result.samples]
            yield result
        finally:
            # The consumer finished, was cancelled or went away: abort the request in vLLM.
            if not future.done():
                future.cancel()

    def tool_plan(self, request: Request) -> ToolPlan | None:
        """How the request's tools go into the prompt and its calls come out (None: none)."""
        template = self.engine.chat_template or getattr(self.tokenizer, "chat_template", None)
        return tool_plan(request, template, self.engine.tool_call_parser)

    def render(
        self, request: Request, plan: ToolPlan | None = None
    ) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """The prompt as vLLM takes it, and the tokenization arguments to go with it."""
        if request.prompt is not None:
            return {"prompt": request.prompt}, None
        images = load_images(request)
        text = render_chat_prompt(
            self.tokenizer,
            request,
            "VLLM",
            self.engine.model_name,
            self.engine.chat_template,
            self.engine.config.model.chat_template_kwargs,
            plan,
            reads_images=bool(images),
        )
        prompt: dict[str, Any] = {"prompt": text}
        if images:  # vLLM's processor expands each placeholder the template wrote
            prompt["multi_modal_data"] = {"image": images}
        # The template writes BOS and the other special tokens itself.
        return prompt, {"add_special_tokens": False}

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
    if is_request_error(exc) or (exc.__cause__ is not None and is_request_error(exc.__cause__)):
        # vLLM refused this request (its settings or its prompt): this request only.
        kind = (
            ErrorKind.CONTEXT_LENGTH_EXCEEDED
            if "context length" in message
            else ErrorKind.INVALID_REQUEST
        )
        return ErrorInfo(kind, message)
    return ErrorInfo(ErrorKind.GENERATION_ERROR, message)
