"""`model.adapters` on LLAMACPP: each LoRA adapter loaded once onto the model, and applied to
the context for the rows that choose it.

llama.cpp applies adapters to a whole context, never per sequence: every row decoded in a step
runs with the adapter the context has then. So the engine schedules by adapter (turns.py) and
sets the context's adapter only between groups, when no row is in flight; setting the one it
has already costs nothing (llama.cpp keeps it). The files are GGUF LoRA adapters, converted from
PEFT directories where need be (lora_gguf.py), before the model's weights load.
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

from lmpress.configs.schema import RunConfig
from lmpress.engines.local.llamacpp.loading import load_vocab
from lmpress.engines.local.llamacpp.lora_gguf import BaseFacts, lora_file
from lmpress.vocabulary.errors import ConfigError, ErrorKind, ModelLoadError, RequestError


def adapter_files(config: RunConfig, path: str) -> dict[str, Path]:
    """Each of `model.adapters` as a GGUF LoRA file for the model at `path`, by name: checked
    and converted (cached) before the model's weights load, from its metadata alone."""
    if not config.model.adapters:
        return {}
    if config.task != "generate":
        raise ConfigError(
            f"model.adapters: LLAMACPP applies LoRA adapters when it generates; task "
            f"{config.task} runs the base model alone"
        )
    base = BaseFacts.of(load_vocab(path).metadata())
    return {name: lora_file(name, path, base) for name, path in config.model.adapters.items()}


class Loras:
    """The adapters loaded onto one llama.cpp model, by name. Those of `model.adapters` load
    with the model; serve may load more and unload any while the engine runs
    (`LlamaCppEngine.load_adapter`): an unloaded one takes no new request, and is freed on the
    worker thread once no request of it waits or runs (turns.py)."""

    def __init__(self, model: Any, files: dict[str, Path]):
        import llama_cpp

        self._lc = llama_cpp
        self._model = model
        self._loaded: dict[str, Any] = {}
        self._retired: dict[str, Any] = {}  # unloaded, still held by requests in flight
        self._keys: dict[str, str] = {}  # what KV cells made with each are tagged with
        self._loads = 0
        try:
            for name, path in files.items():
                self.add(name, path)
        except ModelLoadError:
            self.close()
            raise

    def __bool__(self) -> bool:
        return bool(self._loaded or self._retired)

    @property
    def names(self) -> frozenset[str]:
        """The adapters a request may choose now."""
        return frozenset(self._loaded)

    def add(self, name: str, path: Path) -> None:
        """Load the GGUF LoRA file `path` onto the model as `name`."""
        adapter = self._lc.llama_adapter_lora_init(self._model, str(path).encode("utf-8"))
        if not adapter:
            raise ModelLoadError(
                f"model.adapters.{name}: llama.cpp cannot apply '{path}' to this model: a "
                f"weight it changes is missing from the model or of another shape (is it an "
                f"adapter of this model?)"
            )
        self._loaded[name] = adapter
        self._loads += 1
        self._keys[name] = f"{name}#{self._loads}"

    def key(self, name: str | None) -> str | None:
        """What tells the KV cells made with the adapter `name` apart (sequences.py): its
        name, and which load of that name it is (one unloaded and loaded again differs)."""
        return None if name is None else self._keys[name]

    def retire(self, name: str) -> None:
        """No new request may choose `name`; `free_idle` frees it once none holds it."""
        if name not in self._loaded:
            raise RequestError(
                f"the adapter '{name}' is not loaded", ErrorKind.NOT_FOUND, status=404
            )
        self._retired[name] = self._loaded[name]  # never in neither, for the worker's sake
        del self._loaded[name]

    def free_idle(self, held: set[str | None]) -> None:
        """Free the unloaded adapters no request in `held` chooses (on the worker thread)."""
        for name in [n for n in self._retired if n not in held]:
            self._lc.llama_adapter_lora_free(self._retired.pop(name))

    def apply(self, ctx: Any, name: str | None) -> None:
        """Give the context the adapter `name` (None: the base model alone)."""
        lc = self._lc
        if name is None:
            code = lc.llama_set_adapters_lora(ctx, None, 0, None)
        else:
            chosen = self._loaded.get(name) or self._retired[name]
            adapters = (lc.llama_adapter_lora_p_ctypes * 1)(chosen)
            code = lc.llama_set_adapters_lora(ctx, adapters, 1, (ctypes.c_float * 1)(1.0))
        if code != 0:
            raise RuntimeError(f"llama.cpp could not set the adapter {name!r} ({code})")

    def close(self) -> None:
        """Free the adapters (before the model, which would free them too)."""
        for adapter in [*self._loaded.values(), *self._retired.values()]:
            self._lc.llama_adapter_lora_free(adapter)
        self._loaded.clear()
        self._retired.clear()
