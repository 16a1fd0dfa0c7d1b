"""Stand-in for vllm/v1/engine/async_llm.py: AsyncLLM with vLLM's signatures for
from_engine_args, generate, abort, add_lora, remove_lora, get_tokenizer, get_supported_tasks,
shutdown and errored.

Its "model" echoes the prompt's words, one per token, then EOS. It honours what lmpress sends:
n, max_tokens, stop, stop_token_ids, logprobs, structured outputs (a choice's first option, or
a fixed JSON object), output_kind (CUMULATIVE, DELTA, FINAL_ONLY) and LoRA requests, and it
validates the way vLLM does where lmpress relies on it (context length, LoRA enabled, enough
GPUs for tensor x pipeline parallel). generate() aborts the request when its consumer is
cancelled or closes it, as vLLM's does.
"""

import asyncio
import json
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from vllm._standin_model import (
    BOS_ID,
    EOS_ID,
    StandinTokenizer,
    image_placeholder,
    log,
    max_model_len,
)
from vllm.exceptions import VLLMValidationError
from vllm.logprobs import Logprob
from vllm.outputs import CompletionOutput, RequestOutput
from vllm.sampling_params import RequestOutputKind
from vllm.v1.engine.exceptions import EngineDeadError

MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)

# Every engine started in this process, newest last: in-process tests inspect what it received.
ENGINES: list["AsyncLLM"] = []


@dataclass
class RecordedRequest:
    request_id: str
    prompt: Any
    prompt_token_ids: list[int]
    sampling_params: Any
    lora_request: Any
    tokenization_kwargs: dict[str, Any] | None


@dataclass
class _Sample:
    index: int
    words: list[str]
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[int, Logprob]] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    sent_text: int = 0  # characters already sent (DELTA)
    sent_tokens: int = 0  # tokens already sent (DELTA)


class AsyncLLM:
    def __init__(
        self,
        vllm_config: Any,
        executor_class: Any = None,
        log_stats: bool = False,
        usage_context: Any = None,
        mm_registry: Any = None,
        log_requests: bool = True,
        start_engine_loop: bool = True,
        stat_loggers: Any = None,
        aggregate_engine_logging: bool = False,
        client_addresses: Any = None,
        client_count: int = 1,
        client_index: int = 0,
    ) -> None:
        # vLLM passes a VllmConfig built from the engine args; the stand-in keeps the args.
        self.engine_args = vllm_config
        self.tokenizer = StandinTokenizer(vllm_config.tokenizer or vllm_config.model)
        self.max_model_len = max_model_len(vllm_config.model, vllm_config.max_model_len)
        self.image_placeholder = image_placeholder(vllm_config.model)
        # What the model's config.json says it pools for (a stand-in key), and its labels.
        config_file = Path(vllm_config.model) / "config.json"
        config = json.loads(config_file.read_text()) if config_file.is_file() else {}
        self._tasks = tuple(config.get("standin_tasks", ["generate"]))
        self.model_config = SimpleNamespace(
            max_model_len=self.max_model_len,
            hf_config=SimpleNamespace(num_labels=config.get("num_labels", 1)),
            pooler_config=None,
        )
        self.requests: list[RecordedRequest] = []
        self.loras: dict[int, Any] = {}  # loaded at run time (add_lora), by id
        self.aborted: list[str] = []
        self.running: set[str] = set()
        self.is_shut_down = False
        self._abort_flags: set[str] = set()
        self._accepted = 0
        self._dead = False
        # vLLM logs to stdout unless VLLM_LOGGING_STREAM says otherwise; so does the stand-in.
        stream = (
            sys.stderr
            if os.environ.get("VLLM_LOGGING_STREAM") == "ext://sys.stderr"
            else sys.stdout
        )
        print(
            f"INFO [stand-in] Initializing an engine with model={vllm_config.model}",
            file=stream,
            flush=True,
        )
        log("start", args=vllm_config.__dict__)
        ENGINES.append(self)

    @classmethod
    def from_engine_args(
        cls,
        engine_args: Any,
        start_engine_loop: bool = True,
        usage_context: Any = None,
        stat_loggers: Any = None,
    ) -> "AsyncLLM":
        _check_engine_args(engine_args)
        return cls(
            vllm_config=engine_args,
            log_requests=engine_args.enable_log_requests,
            log_stats=not engine_args.disable_log_stats,
            start_engine_loop=start_engine_loop,
            usage_context=usage_context,
            stat_loggers=stat_loggers,
        )

    @property
    def errored(self) -> bool:
        return self._dead

    async def add_lora(self, lora_request: Any) -> bool:
        if not self.engine_args.enable_lora:
            raise ValueError("LoRA is not enabled. Use --enable-lora to enable LoRA.")
        self.loras[lora_request.lora_int_id] = lora_request
        log("add_lora", name=lora_request.lora_name, id=lora_request.lora_int_id)
        return True

    async def remove_lora(self, lora_id: int) -> bool:
        log("remove_lora", id=lora_id)
        return self.loras.pop(lora_id, None) is not None

    def get_tokenizer(self) -> StandinTokenizer:
        return self.tokenizer

    async def get_supported_tasks(self) -> tuple[str, ...]:
        return self._tasks

    def shutdown(self, timeout: float | None = None) -> None:
        self.is_shut_down = True
        log("shutdown")

    async def abort(self, request_id: str | Iterable[str], internal: bool = False) -> None:
        ids = (request_id,) if isinstance(request_id, str) else list(request_id)
        for rid in ids:
            self.aborted.append(rid)
            self._abort_flags.add(rid)
            log("abort", request_id=rid)

    async def generate(
        self,
        prompt: Any,
        sampling_params: Any,
        request_id: str,
        *,
        prompt_text: str | None = None,
        lora_request: Any = None,
        tokenization_kwargs: dict[str, Any] | None = None,
        trace_headers: Any = None,
        priority: int = 0,
        data_parallel_rank: int | None = None,
        session_id: str | None = None,
        reasoning_ended: bool | None = None,
        reasoning_parser_kwargs: dict[str, Any] | None = None,
    ):
        if self._dead:
            raise EngineDeadError()
        if request_id in self.running:
            raise ValueError(f"Request id {request_id} already running.")
        if lora_request is not None and not self.engine_args.enable_lora:
            raise ValueError(f"Got lora_request {lora_request} but LoRA is not enabled!")
        ids = self._tokenize(prompt, tokenization_kwargs)
        self._accepted += 1
        die_after = os.environ.get("VLLM_STANDIN_DIE_AFTER")
        if die_after and self._accepted > int(die_after):
            self._dead = True
            log("dead")
            raise EngineDeadError()
        self.running.add(request_id)
        self.requests.append(
            RecordedRequest(
                request_id, prompt, ids, sampling_params, lora_request, tokenization_kwargs
            )
        )
        log("request", request_id=request_id, prompt=prompt)
        try:
            async for output in self._outputs(
                request_id, prompt, ids, sampling_params, lora_request
            ):
                yield output
        except (asyncio.CancelledError, GeneratorExit):
            # As vLLM does: a consumer that goes away aborts its request.
            await self.abort(request_id, internal=True)
            raise
        finally:
            self.running.discard(request_id)

    def _tokenize(self, prompt: Any, tokenization_kwargs: dict[str, Any] | None) -> list[int]:
        if isinstance(prompt, str):
            prompt = {"prompt": prompt}
        if "prompt_token_ids" in prompt:
            ids = list(prompt["prompt_token_ids"])
        else:
            add_special = (tokenization_kwargs or {}).get("add_special_tokens", True)
            ids = self.tokenizer.encode(prompt["prompt"], add_special_tokens=add_special)
        if prompt.get("multi_modal_data"):
            ids = self._expand_images(ids, prompt["multi_modal_data"])
        if len(ids) > self.max_model_len:
            raise VLLMValidationError(
                f"You passed {len(ids)} input tokens and requested 0 output tokens. However, "
                f"the model's context length is only {self.max_model_len} tokens, resulting in "
                f"a maximum input length of {self.max_model_len} tokens. Please reduce the "
                f"length of the input prompt.",
                parameter="input_tokens",
                value=len(ids),
            )
        return ids

    def _expand_images(self, ids: list[int], data: dict[str, Any]) -> list[int]:
        """As vLLM's multimodal processor does: each image placeholder in the prompt becomes
        that image's tokens (here image_seq_length words "<imageN:WxH>", so that a test sees
        which image went where), one placeholder per image."""
        if self.image_placeholder is None:
            raise ValueError("Your model does not support multi-modal inputs")
        unknown = set(data) - {"image"}
        if unknown:
            raise ValueError(f"Unsupported modality: {sorted(unknown)}")
        images = data["image"] if isinstance(data["image"], list) else [data["image"]]
        from PIL import Image

        if not all(isinstance(image, Image.Image) for image in images):
            raise ValueError("Invalid image item: expected a PIL image")
        limit = (self.engine_args.limit_mm_per_prompt or {}).get("image", 999)
        if len(images) > limit:
            raise ValueError(f"At most {limit} image(s) may be provided in one prompt.")
        word, count = self.image_placeholder
        placeholder = self.tokenizer.token_id(word)
        if ids.count(placeholder) != len(images):
            raise ValueError(
                f"Failed to apply prompt replacement for mm_items['image']: the prompt has "
                f"{ids.count(placeholder)} placeholders for {len(images)} image(s)"
            )
        expanded, seen = [], 0
        for token in ids:
            if token != placeholder:
                expanded.append(token)
                continue
            width, height = images[seen].size
            seen += 1
            expanded += [self.tokenizer.token_id(f"<image{seen}:{width}x{height}>")] * count
        return expanded

    async def _outputs(self, request_id, prompt, ids, params, lora_request):
        delay = float(os.environ.get("VLLM_STANDIN_TOKEN_DELAY_S") or 0)
        words = [self.tokenizer.word(i) for i in ids if i != BOS_ID]
        structured = _structured_reply(params.structured_outputs)
        if structured is not None:
            words = structured
        samples = []
        for i in range(params.n):
            shift = i % len(words) if words else 0
            samples.append(_Sample(i, words[shift:] + words[:shift]))
        kind = params.output_kind
        prompt_text = prompt.get("prompt") if isinstance(prompt, dict) else prompt

        def request_output(outputs: list[CompletionOutput], finished: bool) -> RequestOutput:
            return RequestOutput(
                request_id, prompt_text, ids, None, outputs, finished, lora_request=lora_request
            )

        while any(s.finish_reason is None for s in samples):
            await asyncio.sleep(delay)
            if self._dead:
                raise EngineDeadError()
            aborted = request_id in self._abort_flags
            advanced = []
            for sample in samples:
                if sample.finish_reason is None:
                    if aborted:
                        sample.finish_reason = "abort"
                    else:
                        self._advance(sample, params)
                    advanced.append(sample)
            done = all(s.finish_reason is not None for s in samples)
            if kind != RequestOutputKind.FINAL_ONLY:
                for j, sample in enumerate(advanced):
                    last = done and j == len(advanced) - 1
                    yield request_output([_completion(sample, params, kind)], last)
        if kind == RequestOutputKind.FINAL_ONLY:
            yield request_output([_completion(s, params, kind) for s in samples], True)

    def _advance(self, sample: _Sample, params: Any) -> None:
        position = len(sample.token_ids)
        if position >= len(sample.words):
            sample.token_ids.append(EOS_ID)
            sample.finish_reason = "stop"
            self._record_logprob(sample, params, EOS_ID, "")
            return
        word = sample.words[position]
        token_id = self.tokenizer.token_id(word)
        piece = word if position == 0 else " " + word
        sample.token_ids.append(token_id)
        self._record_logprob(sample, params, token_id, piece)
        if token_id in params.stop_token_ids:
            sample.finish_reason, sample.stop_reason = "stop", token_id
            return
        sample.text += piece
        hits = [(sample.text.find(s), s) for s in params.stop if s in sample.text]
        if hits:
            cut, stop = min(hits)
            sample.text = sample.text[:cut]
            sample.finish_reason, sample.stop_reason = "stop", stop
        elif params.max_tokens is not None and len(sample.token_ids) >= params.max_tokens:
            sample.finish_reason = "length"

    @staticmethod
    def _record_logprob(sample: _Sample, params: Any, token_id: int, piece: str) -> None:
        if params.logprobs is None:
            return
        entry = {token_id: Logprob(-0.5, 1, piece)}
        for rank in range(2, params.logprobs + 1):
            entry[90000 + rank] = Logprob(-1.0 * rank, rank, f"alt{rank}")
        sample.logprobs.append(entry)


def _completion(sample: _Sample, params: Any, kind: Any) -> CompletionOutput:
    holdback = 0
    if sample.finish_reason is None and params.stop:
        holdback = max(len(s) for s in params.stop) - 1
    visible = len(sample.text) - holdback
    logprobs = sample.logprobs if params.logprobs is not None else None
    if kind == RequestOutputKind.DELTA:
        text = sample.text[sample.sent_text : max(visible, sample.sent_text)]
        tokens = sample.token_ids[sample.sent_tokens :]
        if logprobs is not None:
            logprobs = logprobs[sample.sent_tokens :]
        sample.sent_text += len(text)
        sample.sent_tokens = len(sample.token_ids)
    else:
        text = sample.text[: max(visible, 0)]
        tokens = list(sample.token_ids)
    cumulative = sum(e[t].logprob for e, t in zip(sample.logprobs, sample.token_ids, strict=False))
    return CompletionOutput(
        index=sample.index,
        text=text,
        token_ids=tokens,
        cumulative_logprob=cumulative if params.logprobs is not None else None,
        logprobs=logprobs,
        finish_reason=sample.finish_reason,
        stop_reason=sample.stop_reason,
    )


def _structured_reply(spec: Any) -> list[str] | None:
    if spec is None:
        return None
    if spec.choice:
        return [spec.choice[0]]
    if spec.json is not None or spec.json_object:
        return ['{"standin":', "true}"]
    return None


def _check_engine_args(args: Any) -> None:
    """What vLLM checks when it builds its config from the engine args, where lmpress relies
    on it."""
    model = Path(args.model)
    if not model.is_dir():
        raise OSError(
            f"{args.model} is not a local folder and is not a valid model identifier listed on "
            f"'https://huggingface.co/models' (the stand-in cannot download models)"
        )
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    gpus = len([g for g in listed.split(",") if g.strip()]) if listed is not None else 1
    world = args.tensor_parallel_size * args.pipeline_parallel_size
    if world > gpus:
        raise ValueError(
            f"World size ({world}) is larger than the number of available GPUs ({gpus}) in "
            f"this node."
        )
    if args.max_lora_rank not in MAX_LORA_RANKS:
        raise ValueError(
            f"1 validation error for LoRAConfig\nmax_lora_rank\n  Input should be "
            f"{', '.join(map(str, MAX_LORA_RANKS))} [input_value={args.max_lora_rank}]"
        )
    if not 0 < args.gpu_memory_utilization <= 1:
        raise ValueError(
            f"GPU memory utilization must be less than 1.0. Got {args.gpu_memory_utilization}."
        )
