"""LoRA adapters on VLLM: the engine arguments that make room for them, and the LoRARequest
each request generates with.

vLLM applies one LoRA adapter to a request, named by a LoRARequest (a name, an integer id
unique in the engine, the adapter's directory), and batches requests of different adapters and
of the base model together. It must be told at start how many adapters one batch may hold
(`max_loras`) and the largest rank among them (`max_lora_rank`, one of the ranks it accepts):
lmpress derives both from `model.adapters` (and `model.adapter_model`), and
`model.model_kwargs.max_loras` / `max_lora_rank` set them by hand.

vLLM's CPU build (0.32) gives a base-model row batched beside adapter rows the adapter in the
last of its `max_loras` slots: its PyTorch LoRA kernels read the "no adapter" index, -1, as the
last slot (reported upstream, vllm-project/vllm pull request 48421). So on a CPU lmpress asks
for one slot more than the adapters can fill; the last stays empty (zeros) and base rows get
the base model's replies. The GPU kernels skip index -1 and need no spare slot.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

from lmpress.configs.schema import ModelParams
from lmpress.engines.common.models import local_or_hub
from lmpress.vocabulary.errors import (
    ConfigError,
    ErrorKind,
    ModelLoadError,
    RequestError,
    UnsupportedParamError,
    first_line,
)
from lmpress.vocabulary.types import Request

# The LoRA ranks vLLM accepts (vllm.config.lora.MaxLoRARanks); an adapter's rank is rounded up.
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def adapter_paths(model: ModelParams) -> dict[str, str]:
    """`model.adapters`, each path checked (a directory or hub id), by name."""
    if model.adapters and model.adapter_model:
        raise ConfigError(
            "model.adapter_model and model.adapters: vLLM applies one LoRA adapter to a "
            "request, so it cannot apply adapter_model beneath a row's adapter; merge "
            "adapter_model into the model first (PEFT's merge_and_unload), or name it in "
            "model.adapters and choose it per row"
        )
    return {
        name: local_or_hub(path, f"model.adapters.{name}") for name, path in model.adapters.items()
    }


def lora_args(
    adapter: str | None,
    adapters: dict[str, str],
    kwargs: dict[str, Any],
    *,
    spare_slot: bool = False,
) -> dict[str, Any]:
    """The AsyncEngineArgs that let vLLM run `adapter` (model.adapter_model, on every request)
    or `adapters` (chosen per request): none without either. `kwargs` (model.model_kwargs)
    may set max_loras and max_lora_rank by hand; `spare_slot` (vLLM on a CPU) adds the empty
    slot base rows need there (module docstring)."""
    if not adapter and not adapters:
        return {}
    args: dict[str, Any] = {"enable_lora": True}
    keyed = {f"model.adapters.{name}": path for name, path in adapters.items()}
    if adapter:
        keyed["model.adapter_model"] = adapter
    args["max_lora_rank"] = kwargs.get("max_lora_rank") or max(
        lora_rank(path, key) for key, path in keyed.items()
    )
    if adapters or "max_loras" in kwargs:
        # adapter_model alone runs on every request: vLLM's one slot holds it, no row is base.
        loras = kwargs.get("max_loras") or len(adapters)
        args["max_loras"] = loras + int(spare_slot and bool(adapters))
    return args


def lora_rank(adapter: str, key: str = "model.adapter_model") -> int:
    """The LoRA rank vLLM must reserve for an adapter (its `r`, rounded up to a rank vLLM
    accepts), read from the adapter's adapter_config.json; `key` names it in errors."""
    path = Path(adapter)
    config_file = path / "adapter_config.json"
    if not path.exists():
        try:
            from huggingface_hub import hf_hub_download

            config_file = Path(hf_hub_download(adapter, "adapter_config.json"))
        except Exception as exc:
            raise ModelLoadError(
                f"{key}: cannot read the adapter's rank from '{adapter}' ({first_line(exc)}); "
                f"give a local adapter directory or set model.model_kwargs.max_lora_rank"
            ) from exc
    try:
        peft = json.loads(config_file.read_text(encoding="utf-8"))
        ranks = [int(peft["r"]), *(int(r) for r in (peft.get("rank_pattern") or {}).values())]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ModelLoadError(
            f"{key}: {config_file} is not a PEFT LoRA config with a rank 'r' ({first_line(exc)})"
        ) from exc
    rank = max(ranks)
    for allowed in LORA_RANKS:
        if rank <= allowed:
            return allowed
    raise ModelLoadError(f"{key}: LoRA rank {rank} is above the {LORA_RANKS[-1]} vLLM supports")


class LoraRequests:
    """The LoRARequest of each adapter, by name, and the one a request generates with.

    Ids count from 1 (vLLM's 0 is no adapter) and are never reused, so an adapter loaded at
    run time under a name once unloaded is not mistaken for the old one in vLLM's cache.
    """

    def __init__(self, make: Any, adapter: str | None, adapters: dict[str, str]):
        self._make = make  # vLLM's LoRARequest class
        self._ids = itertools.count(1)
        # model.adapter_model, on every request that names no adapter.
        self.default = None if not adapter else self.new(Path(adapter).name or "adapter", adapter)
        self.by_name = {name: self.new(name, path) for name, path in adapters.items()}

    def new(self, name: str, path: str) -> Any:
        return self._make(lora_name=name, lora_int_id=next(self._ids), lora_path=path)

    def for_request(self, request: Request) -> Any:
        """The request's LoRARequest (its adapter checked held by `check_adapter`)."""
        return self.default if request.adapter is None else self.by_name[request.adapter]


def loadable_path(
    args: dict[str, Any], held: set[str], name: str, path: str, *, spare: bool
) -> str:
    """The adapter at `path` checked for loading under `name` at run time, into an engine
    started with `args` that holds the adapters `held`: RequestError (400) where vLLM cannot
    take it, before vLLM is asked. `spare`: a CPU's empty last slot (module docstring)."""
    if name in held:
        raise RequestError(
            f"adapter '{name}' is loaded already; unload it first",
            ErrorKind.INVALID_REQUEST,
            status=400,
        )
    if not args.get("enable_lora"):
        raise UnsupportedParamError(
            "engine VLLM was started without LoRA, so it cannot load adapters at run time: "
            "start it with model.adapters (or model.model_kwargs.enable_lora: true and "
            "max_lora_rank)"
        )
    key = f"adapter '{name}'"
    try:
        path = local_or_hub(path, key)
        rank = lora_rank(path, key)
    except ModelLoadError as exc:
        raise RequestError(str(exc), ErrorKind.INVALID_REQUEST, status=400) from exc
    if rank > args["max_lora_rank"]:
        raise RequestError(
            f"{key}: LoRA rank {rank} is above the {args['max_lora_rank']} the engine started "
            f"with (model.model_kwargs.max_lora_rank)",
            ErrorKind.INVALID_REQUEST,
            status=400,
        )
    slots = args.get("max_loras", 1) - int(spare)
    if spare and len(held) >= slots:
        raise RequestError(
            f"{key}: engine VLLM on a CPU holds at most {slots} adapters, as many as it was "
            f"started for; unload one, or start it with a larger model.model_kwargs.max_loras",
            ErrorKind.INVALID_REQUEST,
            status=400,
        )
    return path
