"""VLLM's `model.model_kwargs`: the engine arguments lmpress documents (recipes/vllm-*.yaml) and
reads, typed (engines/options.py). Every key goes to vLLM's AsyncEngineArgs and wins over the
fields it overlaps, but `kv_unified` (llama.cpp's, which asks for nothing vLLM does not do) and
a null, which leaves a setting to vLLM. The other keys are checked against AsyncEngineArgs'
fields when the engine starts, before the model loads (translate.engine_settings).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lmpress.engines.common.models import DTYPE_CHOICES
from lmpress.engines.options import EngineOptions, setting

ENGINE_ARGS_URL = "https://docs.vllm.ai/en/latest/configuration/engine_args.html"


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _flag(value: Any) -> bool:
    return isinstance(value, bool)


# The documented engine arguments' checks, so that a wrong value fails at once with its key
# rather than deep inside vLLM minutes later.
DOCUMENTED_ARGS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "tensor_parallel_size": (_whole, "must be a whole number of GPUs, at least 1"),
    "pipeline_parallel_size": (_whole, "must be a whole number of GPUs, at least 1"),
    "data_parallel_size": (_whole, "must be a whole number of model copies, at least 1"),
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
        f"must be {DTYPE_CHOICES}",
    ),
}


@dataclass
class VllmOptions(EngineOptions):
    passes_to = "vLLM's engine arguments"
    known_as = "an engine argument of vLLM"

    tensor_parallel_size: int = setting(1, "GPUs each layer is sharded across")
    pipeline_parallel_size: int = setting(1, "GPUs the layer stack is split across")
    data_parallel_size: int = setting(
        1, "copies of the model, each on tensor x pipeline GPUs; vLLM balances rows across them"
    )
    gpu_memory_utilization: float | None = setting(
        None, "the share of each GPU for weights and KV cache (null: vLLM's, about 0.9)"
    )
    max_model_len: int | None = setting(
        None, "prompt and reply tokens (null: model.model_max_length or the model's)"
    )
    max_num_seqs: int | None = setting(None, "sequences decoded at once (null: vLLM's, 256)")
    enable_prefix_caching: bool | None = setting(
        None, "rows sharing a prefix reuse its KV cache (null: vLLM's default)"
    )
    enforce_eager: bool = setting(False, "skip CUDA graph capture: a faster start, a slower decode")
    trust_remote_code: bool | None = setting(None, "overrides model.trust_remote_code for vLLM")
    quantization: str | None = setting(None, "awq, gptq, fp8, ... (null: the checkpoint's own)")
    dtype: str | None = setting(None, "the weights' dtype (null: model.torch_dtype_str)")
    tokenizer_mode: str = setting("auto", "vLLM's tokenizer: auto or hf count prompts exactly")
    reasoning_parser: str | None = setting(
        None, "how the model writes its thinking (as model.reasoning_parser)"
    )
    limit_mm_per_prompt: dict | None = setting(
        None, "the most images a prompt may carry, e.g. {image: 1} (null: vLLM's)"
    )
    kv_unified: bool = setting(
        False, "llama.cpp's shared KV cache, accepted so its recipes run (vLLM's always is)"
    )

    @classmethod
    def unknown(cls, key: str, meant: str | None, names: list[str]) -> str:
        hint = f" (did you mean '{meant}'?)" if meant else ""
        return f"model.model_kwargs.{key}: not {cls.known_as}{hint}; see {ENGINE_ARGS_URL}"

    @classmethod
    def unset_by_null(cls) -> set[str]:
        """The settings whose null means "not given": vLLM's own default, or lmpress's."""
        return {s.name for s in cls.settings() if s.default is None}

    @classmethod
    def value_problem(cls, key: str, value: Any, tp: Any) -> str | None:
        if value is None and key in cls.unset_by_null():
            return None
        if key in DOCUMENTED_ARGS:
            ok, allowed = DOCUMENTED_ARGS[key]
            return None if ok(value) else allowed
        return super().value_problem(key, value, tp)
