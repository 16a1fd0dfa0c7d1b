"""Stand-in for vllm/engine/arg_utils.py: EngineArgs fields with vLLM's names and defaults (a
subset: the ones lmpress documents plus common others). lmpress checks `model.model_kwargs`
keys against these dataclass fields, as it does against the real AsyncEngineArgs."""

from dataclasses import dataclass
from typing import Any


@dataclass
class EngineArgs:
    model: str = "Qwen/Qwen3-0.6B"
    served_model_name: str | list[str] | None = None
    tokenizer: str | None = None
    skip_tokenizer_init: bool = False
    tokenizer_mode: str = "auto"
    trust_remote_code: bool = False
    download_dir: str | None = None
    load_format: str = "auto"
    dtype: str = "auto"
    kv_cache_dtype: str = "auto"
    seed: int = 0
    max_model_len: int | None = None
    runner: str = "auto"  # "pooling": vLLM's pooling runner
    distributed_executor_backend: str | None = None
    pipeline_parallel_size: int = 1
    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    enable_expert_parallel: bool = False
    block_size: int | None = None
    enable_prefix_caching: bool | None = None
    swap_space: float = 4
    cpu_offload_gb: float = 0
    gpu_memory_utilization: float = 0.9
    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None
    max_logprobs: int = 20
    disable_log_stats: bool = False
    revision: str | None = None
    tokenizer_revision: str | None = None
    quantization: str | None = None
    enforce_eager: bool = False
    limit_mm_per_prompt: dict[str, int] | None = None
    enable_lora: bool = False
    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None
    enable_chunked_prefill: bool | None = None
    generation_config: str = "auto"
    hf_overrides: dict[str, Any] | None = None
    compilation_config: dict[str, Any] | None = None

    def __post_init__(self):
        if not self.tokenizer:
            self.tokenizer = self.model


@dataclass
class AsyncEngineArgs(EngineArgs):
    enable_log_requests: bool = False
