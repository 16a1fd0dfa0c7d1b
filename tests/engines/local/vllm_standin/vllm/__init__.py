"""STAND-IN for vLLM, for lmpress's contract tests only (see ../README.md). This is not vLLM:
it mirrors the public signatures of the vLLM classes lmpress calls and runs no model."""

import os

__version__ = os.environ.get("VLLM_STANDIN_VERSION") or "0.33.0"

from vllm.engine.arg_utils import AsyncEngineArgs, EngineArgs
from vllm.entrypoints.llm import LLM
from vllm.lora.request import LoRARequest
from vllm.outputs import CompletionOutput, RequestOutput
from vllm.sampling_params import SamplingParams, StructuredOutputsParams

__all__ = [
    "AsyncEngineArgs",
    "CompletionOutput",
    "EngineArgs",
    "LLM",
    "LoRARequest",
    "RequestOutput",
    "SamplingParams",
    "StructuredOutputsParams",
]
