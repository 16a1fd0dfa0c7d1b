"""VLLM's scheduler: requests bridged into vLLM's AsyncLLM and its outputs bridged back.

`VllmScheduler` plays the part NATIVE's and LLAMACPP's schedulers play (the engine hands it
requests; it owns the backend loop), but vLLM schedules and batches itself, on an asyncio loop:
so this runs AsyncLLM on an event loop of its own, on a worker thread, and one engine serves any
caller's loop (batch, chat, serve, and `generate()`, which starts a new loop per call). Closing
a request's stream aborts the request in vLLM. It renders each prompt itself (with the
tokenizer AsyncLLM hands back once started) and reads vLLM's outputs through translate.py.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any

from lmpress.engines.base import Engine, check_adapter, check_text, error_result
from lmpress.engines.common.embeddings import cosine_scores
from lmpress.engines.common.prompts import render_chat_prompt
from lmpress.engines.common.tool_parsers import ToolPlan, tool_plan
from lmpress.engines.local.beams import beams_refusal
from lmpress.engines.local.reasoning import template_switches, template_text
from lmpress.engines.local.vllm.api import VllmApi, describe, failure, is_request_error
from lmpress.engines.local.vllm.logs import children_print_to_log
from lmpress.engines.local.vllm.lora import LoraRequests
from lmpress.engines.local.vllm.reasoning import VllmReasoning, budget_refusal
from lmpress.engines.local.vllm.translate import EngineSettings, OutputAssembler, sampling_params
from lmpress.engines.local.worker import CallerQueue
from lmpress.vocabulary.embeddings import (
    Embedding,
    EmbedRequest,
    EmbedResult,
    ScoreRequest,
    ScoreResult,
)
from lmpress.vocabulary.errors import (
    ConfigError,
    EngineUnavailableError,
    ErrorKind,
    LmpressError,
    ModelLoadError,
    RequestError,
)
from lmpress.vocabulary.images import load_images
from lmpress.vocabulary.types import Delta, ErrorInfo, Request, Result, Usage


class _End:
    """The request's outputs are all delivered."""


@dataclass
class _Failure:
    error: BaseException
    engine_dead: bool


class VllmScheduler:
    """One AsyncLLM on an event loop of its own, on a worker thread; requests from any caller's
    loop are bridged to it and their outputs bridged back."""

    def __init__(self, engine: Engine, api: VllmApi, settings: EngineSettings):
        """Start AsyncLLM with `settings` through `api`. `engine`: the VLLM engine, whose
        name, model, chat template and tool-call parser its requests are rendered and
        labelled with."""
        self.engine = engine
        self.api = api
        self.loras = LoraRequests(api.LoRARequest, settings.adapter, settings.adapters)
        self._ids = itertools.count(1)
        self.reasoning: VllmReasoning | None = None  # read_reasoning sets it once started
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="lmpress-vllm", daemon=True
        )
        self._thread.start()
        try:
            with children_print_to_log():
                started = asyncio.run_coroutine_threadsafe(self._start(settings.args), self._loop)
                self.llm, self.tokenizer, self.pooling_task = started.result()
        except BaseException:
            self._stop_loop()
            raise

    def read_reasoning(self, name: str | None) -> None:
        """Read replies with vLLM's reasoning parser `name` (reasoning.py), the one vLLM was
        started with; None: a model that does not think."""
        self.reasoning = None
        if not name or self.pooling_task is not None:
            return
        try:
            parser_class = self.api.reasoning_parser_class(name)
            self.reasoning = VllmReasoning(name, parser_class, self.tokenizer)
        except Exception as exc:  # a tokenizer without the parser's marks
            raise ModelLoadError(
                f"model.reasoning_parser '{name}': vLLM's parser cannot read model "
                f"'{self.engine.model_name}' ({describe(exc)}); set model.reasoning_parser "
                f"to the model's own, or none"
            ) from exc

    async def _start(self, args: dict[str, Any]) -> tuple[Any, Any, str | None]:
        # Built on this loop: AsyncLLM binds its output handler to the loop it starts on.
        try:
            llm = self.api.AsyncLLM.from_engine_args(self.api.engine_args(args))
        except LmpressError:
            raise
        except Exception as exc:
            raise ModelLoadError(
                f"vLLM could not start model '{args['model']}': {failure(exc)}"
            ) from exc
        pools = self.engine.config.task != "generate"  # vLLM's pooling runner
        pooling = await self.api.pooling_task(llm) if pools else None
        return llm, await self.api.tokenizer(llm), pooling

    # --- requests, on the caller's loop ---------------------------------------------------

    async def run(self, request: Request, *, deltas: bool) -> AsyncIterator[Delta | Result]:
        engine = self.engine
        started = time.perf_counter()
        try:
            check_text(request)
            check_adapter(engine, request)
            lora = self.loras.for_request(request)
            plan = self.tool_plan(request)
            prompt, tokenization = self.render(request, plan)
            generation = request.params
            if plan is not None and plan.grammar:  # tool_choice required, or a named function
                generation = replace(generation, guided_decoding={"grammar": plan.grammar})
            if self.reasoning is not None and self.reasoning.harmony:  # the channels' tokens
                generation = replace(generation, skip_special_tokens=False)
            # Token ids are read as given, never opened for a grammar.
            guided = generation.guided_decoding is not None
            if self.reasoning is not None and guided and "prompt" in prompt:
                prompt["prompt"] = self.reasoning.opened_for_grammar(prompt["prompt"])
            ids, params = [], None  # a beam search's prompt as token ids; or its sampling
            if generation.num_beams > 1:
                ids = self._beam_prompt(generation, prompt, tokenization)
            else:
                budget = self.thinking_budget(request, prompt)
                params = sampling_params(
                    self.api, generation, stream=deltas, thinking_budget=budget
                )
        except (RequestError, ConfigError) as exc:
            kind = getattr(exc, "kind", ErrorKind.INVALID_REQUEST)
            # The status where the error has one: an adapter the engine does not hold, 404.
            info = ErrorInfo(kind, str(exc), getattr(exc, "status", None))
            yield error_result(request, engine, info, started)
            return
        except Exception as exc:  # vLLM refused this request's settings: it fails alone
            yield error_result(request, engine, _error_info(exc), started)
            return
        replies = CallerQueue()
        vllm_id = f"{request.id}-{next(self._ids)}"
        if generation.num_beams > 1:
            pump = self._pump_beams(vllm_id, ids, generation, lora, replies)
        else:
            pump = self._pump(vllm_id, prompt, params, tokenization, lora, replies)
        future = asyncio.run_coroutine_threadsafe(pump, self._loop)
        assembler = self.assembler(request, deltas)
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
                    if plan is None:  # a reply that may be a call arrives whole
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

    def assembler(self, request: Request, deltas: bool) -> OutputAssembler:
        """What reads this request's outputs from vLLM (translate.py)."""
        params = request.params
        return OutputAssembler(
            request.id,
            params.top_logprobs if params.logprobs else None,
            reasoning=self.reasoning,
            stream=deltas,
            top_prompt=params.prompt_logprobs,
            score_from=request.score_from,
            generates=params.max_new_tokens > 0,
        )

    def tool_plan(self, request: Request) -> ToolPlan | None:
        """How the request's tools go into the prompt and its calls come out (None: none)."""
        return tool_plan(request, self.chat_template(), self.engine.tool_call_parser)

    def thinking_budget(self, request: Request, prompt: dict[str, Any]) -> int | None:
        """vLLM's thinking_token_budget for the row's `max_reasoning_tokens` (reasoning.py),
        from the prompt's text (token ids decoded: the marks are looked for in text)."""
        limit = request.params.max_reasoning_tokens
        if limit is None:
            return None
        name = None if self.reasoning is None else self.reasoning.name
        refusal = budget_refusal(name, self.engine.config.model)
        if refusal is not None or self.reasoning is None:
            raise RequestError(str(refusal), kind=ErrorKind.UNSUPPORTED_PARAM)
        text = prompt.get("prompt")
        if text is None:
            text = self.tokenizer.decode(prompt["prompt_token_ids"])
        return self.reasoning.budget(limit, text)

    def _beam_prompt(
        self, generation: Any, prompt: dict[str, Any], tokenization: dict[str, Any] | None
    ) -> list[int]:
        """A beam search's prompt as token ids, which vLLM's search extends beam by beam;
        what it cannot take is refused in a line."""
        if refusal := beams_refusal(generation):
            raise RequestError(refusal, kind=ErrorKind.UNSUPPORTED_PARAM)
        if "multi_modal_data" in prompt:
            raise RequestError(
                "generation.num_beams: vLLM's beam search takes no images",
                kind=ErrorKind.UNSUPPORTED_PARAM,
            )
        if "prompt_token_ids" in prompt:
            return list(prompt["prompt_token_ids"])
        special = (tokenization or {}).get("add_special_tokens", True)
        return self.tokenizer.encode(prompt["prompt"], add_special_tokens=special)

    def chat_template(self) -> Any:
        return self.engine.chat_template or getattr(self.tokenizer, "chat_template", None)

    def render(
        self, request: Request, plan: ToolPlan | None = None
    ) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """The prompt as vLLM takes it, and the tokenization arguments to go with it."""
        switches = template_switches(
            template_text(self.chat_template()), request, self.engine.model_name
        )  # reasoning_effort's, over the recipe's variables
        variables = {**(self.engine.config.model.chat_template_kwargs or {}), **switches}
        if request.prompt_ids is not None:  # as given: no template, no special tokens added
            return {"prompt_token_ids": list(request.prompt_ids)}, None
        if request.prompt is not None:
            return {"prompt": request.prompt}, None
        images = load_images(request)
        text = render_chat_prompt(
            self.tokenizer,
            request,
            "VLLM",
            self.engine.model_name,
            self.engine.chat_template,
            variables,
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
        lora: Any,
        replies: CallerQueue,
    ) -> None:
        # A put that finds the caller's loop closed is dropped: nobody is listening.
        try:
            async for output in self.llm.generate(
                prompt,
                params,
                vllm_id,
                lora_request=lora,
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

    async def _pump_beams(
        self, vllm_id: str, ids: list[int], generation: Any, lora: Any, replies: CallerQueue
    ) -> None:
        """`_pump` for a beam search: vLLM's own, whose one output holds every beam, best
        first; the best `n` are the reply's samples."""
        try:
            search = self.api.beam_search(self.llm, ids, vllm_id, generation, lora)
            async for output in search:
                output.outputs = output.outputs[: generation.n]
                replies.put(output)
        except Exception as exc:
            replies.put(_Failure(exc, self.api.is_dead(self.llm)))
            return
        replies.put(_End())

    async def on_engine_loop(self, call: Any) -> Any:
        """Await a coroutine of AsyncLLM's (add_lora, remove_lora) on the engine's loop."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(call, self._loop))

    # --- embeddings and head values: one vLLM request an input, as LLM.embed makes them ----

    async def embed(self, request: EmbedRequest, *, head: bool = False) -> EmbedResult:
        """Each input's vector, or with `head` its classification head's raw values."""
        engine = self.engine
        started = time.perf_counter()

        def answer(embeddings: list[Embedding], error: ErrorInfo | None = None) -> EmbedResult:
            usage = Usage(sum(e.prompt_tokens for e in embeddings), 0)
            latency = time.perf_counter() - started
            return EmbedResult(
                request.id, embeddings, usage, engine.model_name, engine.name, latency, error
            )

        try:
            params = self.api.head_params() if head else self.api.embed_params(request.dimensions)
            inputs = [self._input_ids(item) for item in request.inputs]
            outputs = await asyncio.gather(
                *(self._encode(request.id, ids, params) for ids, _ in inputs)
            )
        except Exception as exc:
            if self.api.is_dead(self.llm):
                raise EngineUnavailableError(f"vLLM's engine stopped ({failure(exc)})") from exc
            return answer([], _error_info(exc))
        return answer(
            [
                pooled_embedding(output, truncated)
                for output, (_, truncated) in zip(outputs, inputs, strict=True)
            ]
        )

    def _input_ids(self, item: str | list[int]) -> tuple[list[int], bool]:
        """An input's token ids, and whether they were cut at vLLM's `max_model_len` (which
        vLLM would refuse): cut by the tokenizer's own truncation, which keeps the end token,
        as sentence-transformers cuts."""
        limit = self.api.max_model_len(self.llm)
        if not isinstance(item, str):
            return list(item[:limit]), len(item) > limit
        ids = list(self.tokenizer(item)["input_ids"])
        if len(ids) <= limit:
            return ids, False
        return list(self.tokenizer(item, truncation=True, max_length=limit)["input_ids"]), True

    async def score(self, request: ScoreRequest, *, cross_encoder: bool) -> ScoreResult:
        """The documents' scores as vLLM's `LLM.score` gives them: a cross-encoder reads each
        (query, document) pair together and its logit is the score; an embedding model's is
        the cosine of the two texts' vectors, each text embedded once."""
        engine = self.engine
        started = time.perf_counter()
        try:
            if cross_encoder:  # (token ids, pooling params) a pair
                inputs = [
                    self._pair(query, document)
                    for query, document in zip(request.queries(), request.documents, strict=True)
                ]
            else:  # a text
                params = self.api.embed_params(None)
                inputs = [(self._input_ids(text)[0], params) for text in request.texts()]
            outputs = await asyncio.gather(
                *(self._encode(request.id, ids, params) for ids, params in inputs)
            )
        except Exception as exc:
            if self.api.is_dead(self.llm):
                raise EngineUnavailableError(f"vLLM's engine stopped ({failure(exc)})") from exc
            latency = time.perf_counter() - started
            info = _error_info(exc)
            return ScoreResult(
                request.id, [], Usage(), engine.model_name, engine.name, latency, info
            )
        pooled = [pooled_embedding(output) for output in outputs]
        if cross_encoder:
            scores = [float(p.vector[0]) for p in pooled]
        else:
            scores = cosine_scores(request, [p.vector for p in pooled])
        usage = Usage(sum(p.prompt_tokens for p in pooled), 0)
        latency = time.perf_counter() - started
        return ScoreResult(request.id, scores, usage, engine.model_name, engine.name, latency)

    def _pair(self, query: str, document: str) -> tuple[list[int], Any]:
        """A (query, document) pair as a cross-encoder reads it, as vLLM's scoring tokenizes
        it ([CLS] query [SEP] document [SEP] for BERT, with segment ids), cut at
        `max_model_len` by the tokenizer where it is longer (vLLM would refuse it)."""
        limit = self.api.max_model_len(self.llm)
        # An LLM as reranker reads the two texts as one, with no separator, as vLLM joins them.
        texts = {"text": query, "text_pair": document}
        if self.engine.pair_format == "joined":
            texts = {"text": query + document}
        encoding = self.tokenizer(**texts)
        if len(encoding["input_ids"]) > limit:
            encoding = self.tokenizer(**texts, truncation=True, max_length=limit)
        params = self.api.cross_encoder_params(encoding.get("token_type_ids"))
        return list(encoding["input_ids"]), params

    async def _encode(self, request_id: str, ids: list[int], params: Any) -> Any:
        prompt = {"prompt_token_ids": ids}
        vllm_id = f"{request_id}-{next(self._ids)}"
        # Cancelling the caller's await cancels the pump on the engine's loop, which aborts.
        pump = asyncio.run_coroutine_threadsafe(self._pool(vllm_id, prompt, params), self._loop)
        return await asyncio.wrap_future(pump)

    async def _pool(self, vllm_id: str, prompt: dict[str, Any], params: Any) -> Any:
        final = None
        try:
            async for output in self.llm.encode(
                prompt, params, vllm_id, lora_request=self.loras.default
            ):
                final = output
        except asyncio.CancelledError:
            await self.llm.abort(vllm_id)
            raise
        return final

    # --- shutting down ----------------------------------------------------------------------

    def close(self) -> None:
        """aclose for a caller with no event loop: the engine refusing its model at start."""
        if self._thread.is_alive():

            async def shutdown() -> None:
                self.llm.shutdown()

            asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result()
        self._stop_loop()

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


def pooled_embedding(output: Any, truncated: bool = False) -> Embedding:
    """A PoolingRequestOutput's vector (a tensor) as float32 numpy, and its prompt's length."""
    import numpy as np

    data = output.outputs.data
    vector = data.float().cpu().numpy() if hasattr(data, "cpu") else np.asarray(data, np.float32)
    return Embedding(vector, len(output.prompt_token_ids or ()), truncated)


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
