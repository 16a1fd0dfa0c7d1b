"""The VLLM engine's translations between lmpress and vLLM, as plain functions of data:

- `engine_settings()`: the recipe's `model` section -> AsyncEngineArgs keyword arguments
  (`model.model_kwargs` pass through and win over the fields they overlap);
- `sampling_params()`: GenerationParams -> SamplingParams, the one translation of sampling;
- `OutputAssembler`: RequestOutputs -> Deltas and the final Result, the one place vLLM's
  outputs are read.

Nothing here imports vLLM; the classes come in through `VllmApi` (api.py).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmpress.builtin_models.packaged import NAMES as PACKAGED_NAMES
from lmpress.configs.schema import RunConfig, speculative_method
from lmpress.engines.common.dequantized import dequantized_copy
from lmpress.engines.common.models import DTYPE_CHOICES, dtype_name, local_or_hub
from lmpress.engines.local.vllm.api import is_request_error
from lmpress.engines.local.vllm.lora import adapter_paths, lora_args
from lmpress.engines.local.vllm.options import DOCUMENTED_ARGS, VllmOptions
from lmpress.vocabulary.errors import ConfigError, ModelLoadError, first_line
from lmpress.vocabulary.guided import GuidedDecoding
from lmpress.vocabulary.types import (
    Delta,
    FinishReason,
    GenerationParams,
    Result,
    Sample,
    TokenLogprob,
    Usage,
)

if TYPE_CHECKING:
    from lmpress.engines.local.vllm.api import VllmApi
    from lmpress.engines.local.vllm.reasoning import ReplyReader, VllmReasoning

# --- engine arguments -------------------------------------------------------------------------

VLLM_DTYPES = ("auto", "bfloat16", "float16", "float32")

# vLLM's default max_num_seqs on most GPUs; the engine keeps twice that many requests in flight
# per data-parallel rank so each rank's scheduler always has the next ones waiting.
DEFAULT_MAX_NUM_SEQS = 256


@dataclass
class EngineSettings:
    """What the recipe asks of vLLM, checked."""

    args: dict[str, Any]  # AsyncEngineArgs keyword arguments
    adapter: str | None = None  # model.adapter_model, as vLLM should load it
    adapters: dict[str, str] = field(default_factory=dict)  # model.adapters, paths checked

    @property
    def max_num_seqs(self) -> int:
        return self.args.get("max_num_seqs") or DEFAULT_MAX_NUM_SEQS

    @property
    def data_parallel_size(self) -> int:
        return self.args.get("data_parallel_size", 1)

    @property
    def gpus(self) -> int:
        """The GPUs vLLM will take: data x tensor x pipeline parallel."""
        tensor = self.args.get("tensor_parallel_size", 1)
        return self.data_parallel_size * tensor * self.args.get("pipeline_parallel_size", 1)


def engine_settings(
    config: RunConfig,
    known_args: set[str] | None = None,
    auto: str = "auto",
    *,
    spare_lora_slot: bool = False,
) -> EngineSettings:
    """The AsyncEngineArgs keyword arguments a run config asks for.

    `known_args` (the field names of vLLM's AsyncEngineArgs) catches a misspelt key in
    `model.model_kwargs` before vLLM starts. `auto` is the dtype `model.torch_dtype_str: auto`
    stands for on this machine (`VllmApi.auto_dtype`, the rule NATIVE follows too).
    `spare_lora_slot`: vLLM's CPU build, which needs an empty LoRA slot for base rows (lora.py).
    """
    model = config.model
    kwargs = dict(model.model_kwargs)
    # LLAMACPP's switch to one KV cache shared by its sequences (the smollm2 recipe sets it):
    # vLLM's paged cache always is one, so the key asks for nothing vLLM does not do.
    kwargs.pop("kv_unified", None)
    unset = VllmOptions.unset_by_null()  # null: vLLM's own default, or the model section's
    kwargs = {k: v for k, v in kwargs.items() if v is not None or k not in unset}
    for key, value in kwargs.items():
        if key in DOCUMENTED_ARGS:
            ok, allowed = DOCUMENTED_ARGS[key]
            if not ok(value):
                raise ConfigError(f"model.model_kwargs.{key}: {value!r} {allowed}")
        elif known_args is not None and key not in known_args:
            names = sorted(known_args | set(VllmOptions.names()))
            close = difflib.get_close_matches(key, names, 1)
            raise ConfigError(VllmOptions.unknown(key, close[0] if close else None, names))
    dtype = dtype_name(model.torch_dtype_str.lower())
    if dtype not in VLLM_DTYPES:
        raise ConfigError(
            f"model.torch_dtype_str: unknown dtype '{model.torch_dtype_str}' for VLLM "
            f"(use {DTYPE_CHOICES})"
        )
    args: dict[str, Any] = {
        "model": model_directory(model.model_name, "model.model_name"),
        "dtype": auto if dtype == "auto" else dtype,
        "trust_remote_code": model.trust_remote_code,
        "disable_log_stats": True,
    }
    if model.tokenizer_name:
        args["tokenizer"] = local_or_hub(model.tokenizer_name, "model.tokenizer_name")
    if model.model_revision:
        args["revision"] = model.model_revision
    if model.model_max_length:
        args["max_model_len"] = model.model_max_length
    if model.kv_cache_dtype != "auto":
        if "kv_cache_dtype" in kwargs:
            raise ConfigError(
                "model.kv_cache_dtype: set it or model.model_kwargs.kv_cache_dtype, not both"
            )
        args["kv_cache_dtype"] = model.kv_cache_dtype  # vLLM's own name for fp8
    if model.processor_kwargs:
        args["mm_processor_kwargs"] = dict(model.processor_kwargs)
    if not model.load_pretrained_weights:
        args["load_format"] = "dummy"  # vLLM's random weights, shaped by the model's config
    method = speculative_method(model)
    if method == "ngram":  # vLLM's own prompt lookup, by the same names
        args["speculative_config"] = {
            "method": "ngram",
            "num_speculative_tokens": model.num_speculative_tokens,
            "prompt_lookup_min": model.prompt_lookup_min,
            "prompt_lookup_max": model.prompt_lookup_max,
        }
    elif method == "draft_model":
        args["speculative_config"] = {
            "method": "draft_model",
            "model": model_directory(model.draft_model, "model.draft_model"),
            "num_speculative_tokens": model.num_speculative_tokens,
        }
    adapters = adapter_paths(model)
    adapter = None
    if model.adapter_model:
        adapter = local_or_hub(model.adapter_model, "model.adapter_model")
    args.update(kwargs)
    args.update(lora_args(adapter, adapters, kwargs, spare_slot=spare_lora_slot))
    return EngineSettings(args, adapter, adapters)


def model_directory(name: str, key: str) -> str:
    """What vLLM loads for a model name: a directory or hub id as given, a tiny model's
    directory, and for a packaged model (a GGUF file, which vLLM's CPU build cannot read) the
    Hugging Face directory NATIVE loads too, dequantized once by transformers (dequantized.py)."""
    path = local_or_hub(name, key)
    if name not in PACKAGED_NAMES:
        return path
    try:
        return str(dequantized_copy(Path(path)))
    except Exception as exc:
        raise ModelLoadError(
            f"{key}: cannot write the dequantized copy of '{name}' ({path}) into lmpress's "
            f"cache: {first_line(exc)}"
        ) from exc


# --- GenerationParams -> SamplingParams -------------------------------------------------------


def sampling_params(
    api: VllmApi, params: GenerationParams, *, stream: bool, thinking_budget: int | None = None
) -> Any:
    """The vLLM SamplingParams for lmpress generation settings.

    `stream` asks for each output's new text as it is generated (RequestOutputKind.DELTA);
    otherwise vLLM sends one final output (FINAL_ONLY). `thinking_budget` is vLLM's
    `thinking_token_budget` for `generation.max_reasoning_tokens` as the row's prompt makes it
    (reasoning.py `VllmReasoning.budget`); not given, `max_reasoning_tokens` as it is.
    Raises ConfigError naming the `generation.*` key when vLLM cannot honour a setting.
    """
    if params.n > 1 and params.temperature == 0:
        raise ConfigError(
            f"generation.n: {params.n} samples need generation.temperature > 0 on VLLM "
            f"(vLLM refuses n > 1 with greedy decoding)"
        )
    kind = api.RequestOutputKind
    if thinking_budget is None:
        thinking_budget = params.max_reasoning_tokens
    # Only where set: a vLLM without reasoning support takes no such field.
    extra = {} if thinking_budget is None else {"thinking_token_budget": thinking_budget}
    if params.ignore_eos:
        extra["ignore_eos"] = True
    if params.bad_words:
        extra["bad_words"] = list(params.bad_words)
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
            # vLLM refuses max_tokens 0 ("must be at least 1"), as vLLM's own server does for
            # echo without generation: one token is generated and OutputAssembler drops it.
            max_tokens=params.max_new_tokens or 1,
            min_tokens=params.min_tokens,
            # vLLM returns the chosen token's logprob plus the top k; 0 means the chosen only.
            logprobs=params.top_logprobs if params.logprobs else None,
            prompt_logprobs=params.prompt_logprobs,
            skip_special_tokens=params.skip_special_tokens,
            logit_bias=_logit_bias(params.logit_bias),
            structured_outputs=_structured_outputs(api, params.guided_decoding),
            output_kind=kind.DELTA if stream else kind.FINAL_ONLY,
            **extra,
        )
    except Exception as exc:
        if not (isinstance(exc, TypeError) or is_request_error(exc)):
            raise
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


def _structured_outputs(api: VllmApi, guided: GuidedDecoding | None) -> Any:
    """The one guided-decoding value as StructuredOutputsParams: vLLM takes every form and
    option under lmpress's names, which are its own (REMOTE_VLLM sends the same fields)."""
    return None if guided is None else api.StructuredOutputsParams(**guided.vllm_fields())


# --- RequestOutput -> Delta / Result ------------------------------------------------------------

FINISH_REASONS: dict[str, FinishReason] = {
    "stop": "stop",
    "length": "length",
    "abort": "cancelled",
    "error": "error",
}


@dataclass
class _SampleState:
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    stop_sequence: str | None = None  # the stop string vLLM matched (its `stop_reason`)
    logprobs: list[TokenLogprob] | None = None
    reader: ReplyReader | None = None  # a reasoning model's thinking, read apart


@dataclass
class OutputAssembler:
    """vLLM's RequestOutputs for one request -> lmpress Deltas as they come, then the Result.

    Requests are sent with RequestOutputKind.DELTA or FINAL_ONLY, so each CompletionOutput
    carries only text and tokens not seen before (FINAL_ONLY sends everything once).
    `top_logprobs` is None when logprobs were not asked for. With `reasoning` (a reasoning
    model's parser, reasoning.py) each sample's thinking streams as reasoning Deltas (`stream`)
    and ends in Sample.reasoning, apart from the answer.

    `top_prompt` (GenerationParams.prompt_logprobs) reads vLLM's prompt logprobs, which come
    whole once the prompt is prefilled, from position `score_from` on. `generates` False
    (max_new_tokens 0): the one token vLLM had to generate is dropped, and each sample is
    empty, cut at its length.
    """

    request_id: str
    top_logprobs: int | None = None
    prompt_tokens: int = 0
    samples: dict[int, _SampleState] = field(default_factory=dict)
    reasoning: VllmReasoning | None = None
    stream: bool = True  # False: the Deltas are not wanted (a FINAL_ONLY request)
    prompt_token_ids: list[int] | None = None
    top_prompt: int | None = None
    score_from: int = 1
    generates: bool = True
    prompt_logprobs: list[TokenLogprob | None] | None = None

    def feed(self, output: Any) -> list[Delta]:
        if output.prompt_token_ids is not None:
            self.prompt_token_ids = list(output.prompt_token_ids)
            self.prompt_tokens = len(self.prompt_token_ids)
        if self.top_prompt is not None and output.prompt_logprobs:
            self._read_prompt_logprobs(output.prompt_logprobs)
        deltas = []
        for completion in output.outputs:
            state = self.samples.get(completion.index)
            if state is None:
                state = self.samples[completion.index] = _SampleState()
                if self.reasoning is not None and self.generates:
                    state.reader = self.reasoning.reader(self.prompt_token_ids)
            if not self.generates:
                continue
            token_ids = list(completion.token_ids)
            state.text += completion.text
            state.token_ids += token_ids
            if completion.finish_reason is not None:
                state.finish_reason = FINISH_REASONS.get(completion.finish_reason, "stop")
                # vLLM's stop_reason: the stop string matched, a stop token's id, or None.
                stop = getattr(completion, "stop_reason", None)
                state.stop_sequence = stop if isinstance(stop, str) else None
            if self.top_logprobs is not None and completion.logprobs:
                state.logprobs = (state.logprobs or []) + self._logprobs(completion)
            if not self.stream:
                continue
            if state.reader is None:
                if completion.text:
                    deltas.append(Delta(self.request_id, completion.text, completion.index))
                continue
            pieces = [state.reader.feed(completion.text, token_ids)] if completion.text else []
            if completion.finish_reason is not None:
                pieces.append(state.reader.finish())
            index = completion.index
            for thinking, answer in pieces:
                if thinking:
                    deltas.append(Delta(self.request_id, thinking, index, reasoning=True))
                if answer:
                    deltas.append(Delta(self.request_id, answer, index))
        return deltas

    def _logprobs(self, completion: Any) -> list[TokenLogprob]:
        out = []
        for token_id, position in zip(completion.token_ids, completion.logprobs, strict=False):
            logprob = token_logprob(token_id, position, self.top_logprobs or 0)
            if logprob is not None:  # vLLM always includes the chosen token
                out.append(logprob)
        return out

    def _read_prompt_logprobs(self, positions: Any) -> None:
        # vLLM's list is None at the first token (nothing precedes it); each other entry maps
        # the prompt token and the top k likeliest to their logprobs.
        ids = self.prompt_token_ids or []
        read = self.prompt_logprobs = self.prompt_logprobs or []
        for position in positions:
            at = len(read)
            if position is None or at < self.score_from or at >= len(ids):
                read.append(None)
            else:
                read.append(token_logprob(ids[at], position, self.top_prompt or 0))

    def result(self, *, model: str, engine: str, latency_s: float) -> Result:
        samples = []
        for index in sorted(self.samples):
            state = self.samples[index]
            if state.logprobs is None and self.top_logprobs is not None:
                state.logprobs = []
            sample = Sample(
                state.text, state.finish_reason or "length", state.logprobs, len(state.token_ids)
            )
            sample.stop_sequence = state.stop_sequence
            if state.reader is not None:
                thinking, answer, spent = state.reader.whole(state.text, state.token_ids)
                sample.text, sample.reasoning, sample.reasoning_tokens = answer, thinking, spent
            samples.append(sample)
        usage = Usage(
            self.prompt_tokens,
            sum(s.completion_tokens for s in samples),
            sum(s.reasoning_tokens for s in samples),
        )
        return Result(
            request_id=self.request_id,
            samples=samples,
            usage=usage,
            model=model,
            engine=engine,
            latency_s=latency_s,
            prompt_logprobs=self.prompt_logprobs,
            prompt_ids=self.prompt_token_ids,
        )


def token_logprob(token_id: int, position: Any, top: int) -> TokenLogprob | None:
    """A token's logprob and the `top` likeliest at its position, from vLLM's map of token id
    to Logprob there; None where the token is not in the map. vLLM puts the token itself first,
    so a token tied with the likeliest stays ahead of it (the greedy flag holds)."""
    chosen = position.get(token_id)
    if chosen is None:
        return None
    ranked = sorted(position.items(), key=lambda item: -item[1].logprob)[:top]
    return TokenLogprob(
        chosen.decoded_token or "",
        chosen.logprob,
        [(lp.decoded_token or "", lp.logprob) for _, lp in ranked],
        token_id,
        [i for i, _ in ranked],
    )
