"""NATIVE's LoRA adapters (`model.adapters`), chosen row by row inside one batch.

PEFT loads every adapter into the model's own layers (one LoRA layer wrapping each target
linear, holding each adapter's A and B); lmpress leaves none of them active, so PEFT's own path
returns the base layer's output, and adds each row's own adapter itself: `StackedLora` keeps a
layer's adapters side by side and a forward hook adds their product, masked row by row. The
scheduler's calls keep the engine's layout: a decoding step is [rows, 1 token] and a prefill
one prompt, so a step's rows map one to one on the adapters `RowAdapters.rows` names for that
call. PEFT's own mixed-adapter batches (`adapter_names`) give the same tokens, but pick each
adapter's rows out and put them back in every layer, a gather and a scatter per adapter where
this takes two small matmuls a layer whatever the adapters in the batch.

What cannot combine is refused before any weight loads (`check_settings`): a ragged step
(speculative decoding packs its rows into one sequence, so one row of the batch is no longer
one row of the input), `model.compile` (its graph would bake in one set of hooks), a pooling
task, and `model.adapter_model` (an adapter merged over the base: name it under
`model.adapters` instead).

Adapters load and unload while the engine runs (`load`, `unload`), on a thread of their own
under the scheduler's step lock, so the model's layers never change inside a batch step.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lmpress.configs.schema import RunConfig, speculative_method
from lmpress.engines.local.native.batch_cache import PrefixStore
from lmpress.vocabulary.errors import ErrorKind, ModelLoadError, UnsupportedParamError, first_line
from lmpress.vocabulary.types import ErrorInfo, Request


def check_settings(config: RunConfig) -> None:
    """Refuse, before the weights load, what cannot run with per-row adapters, and an
    adapter that is not a PEFT directory."""
    model = config.model
    if not model.adapters:
        return
    if model.adapter_model:
        refused = "model.adapter_model (name that adapter under model.adapters too)"
    elif speculative_method(model) != "off":
        refused = "model.speculative_method (set it to off)"
    elif model.compile:
        refused = "model.compile (set it to false)"
    elif config.task != "generate":
        refused = f"task {config.task} (adapters change generation only)"
    else:
        refused = ""
    if refused:
        raise UnsupportedParamError(
            f"model.adapters: engine NATIVE cannot combine them with {refused}"
        )
    for name, path in model.adapters.items():
        if not (Path(path) / "adapter_config.json").is_file():
            raise ModelLoadError(
                f"model.adapters.{name}: '{path}' is not a PEFT LoRA directory (no "
                f"adapter_config.json); give the folder PEFT's save_pretrained wrote"
            )


class StepLock:
    """Batch steps (`with lock:`) and adapter changes (`with lock.change():`) exclude each
    other, and a change waiting for the step in progress goes before the next one: a busy
    worker would otherwise take the lock back at once, step after step."""

    def __init__(self) -> None:
        self._turn = threading.Lock()  # held by a change from the moment it waits
        self._held = threading.Lock()

    def __enter__(self) -> None:
        with self._turn:
            self._held.acquire()

    def __exit__(self, *exc: object) -> None:
        self._held.release()

    @contextlib.contextmanager
    def change(self) -> Iterator[None]:
        with self._turn, self._held:
            yield


class RowAdapters:
    """The LoRA adapters loaded into one model, and the names its next forward call runs its
    rows with (see the module docstring)."""

    def __init__(self, model: Any):
        self.model = model  # the transformers model PEFT injects its layers into
        self.peft: Any = None  # the PeftModel around it, once an adapter is loaded
        self._names: list[str] | None = None  # for the forward call in progress
        self._hooked: set[int] = set()  # ids of the LoRA layers that hand the names over
        # Held by the scheduler through each batch step, and by a load or unload.
        self.lock = StepLock()
        self._prefixes: dict[str, PrefixStore] = {}  # each adapter's recent prompts' caches

    @property
    def loaded(self) -> list[str]:
        return [] if self.peft is None else list(self.peft.peft_config)

    def add(self, name: str, path: str, where: str) -> None:
        """Load the PEFT LoRA directory `path` as adapter `name`; `where` names the setting
        for the error line (model.adapters.NAME)."""
        try:
            from peft import PeftModel
        except ImportError as exc:
            raise ModelLoadError(f"{where} needs peft: pip install 'lmpress[native]'") from exc
        try:
            # PEFT 0.21 reads transformers' deprecated `is_gradient_checkpointing`.
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                if self.peft is None:
                    self.peft = PeftModel.from_pretrained(
                        self.model, path, adapter_name=name, is_trainable=False
                    )
                else:
                    self.peft.load_adapter(path, adapter_name=name, is_trainable=False)
        except Exception as exc:
            raise ModelLoadError(
                f"{where}: cannot load the LoRA adapter at '{path}': {first_line(exc)}"
            ) from exc
        self._settle()

    async def load(self, name: str, path: str) -> None:
        """`add`, while the engine runs: off the event loop, between two batch steps."""
        await asyncio.to_thread(self._locked, self.add, name, path, f"adapter '{name}'")

    async def unload(self, name: str) -> None:
        await asyncio.to_thread(self._locked, self.remove, name)

    def _locked(self, change: Any, *args: Any) -> None:
        with self.lock.change():
            change(*args)

    def remove(self, name: str) -> None:
        self.peft.delete_adapter(name)
        self._prefixes.pop(name, None)
        self._settle()

    def prefixes(self, base: PrefixStore | None, adapter: str | None) -> PrefixStore | None:
        """Where a prompt of `adapter` finds and leaves its prefix's cache: a store of its own,
        since an adapter's keys and values differ from the base model's (None: no reuse)."""
        if base is None or adapter is None:
            return base
        return self._prefixes.setdefault(adapter, PrefixStore())

    def missing(self, request: Request) -> ErrorInfo | None:
        """The error of a request whose adapter was unloaded after the engine took it."""
        if request.adapter is None or request.adapter in self.loaded:
            return None
        line = f"The model '{request.adapter}' does not exist: its adapter was unloaded"
        return ErrorInfo(ErrorKind.NOT_FOUND, line, 404)

    def _settle(self) -> None:
        """After a load or unload: no adapter active in PEFT's own path (a LoRA layer then
        returns its base layer's output), each LoRA layer's adapters stacked anew, and every
        LoRA layer hooked to add its rows' products (an adapter may target layers the others
        do not)."""
        from peft.tuners.lora import LoraLayer

        for module in self.model.modules():
            if not isinstance(module, LoraLayer):
                continue
            module.set_adapter([], inference_mode=True)
            module.lmpress_stack = StackedLora.of(module)
            if id(module) not in self._hooked:
                module.register_forward_hook(self._add_rows)
                self._hooked.add(id(module))
        self._masks = {}

    def _add_rows(self, module: Any, args: tuple, output: Any) -> Any:
        names = self._names
        stack = module.lmpress_stack
        if names is None or stack is None:
            return output
        x = args[0]
        key = (stack.layout, len(x))
        mask = self._masks.get(key)
        if mask is None:
            # A prompt's images pass through the vision tower image by image.
            rows = names if len(names) == len(x) else [names[0]] * len(x)
            mask = self._masks[key] = stack.mask(rows, x.dim())
        delta = ((x.to(stack.a.dtype) @ stack.a.T) * mask) @ stack.b.T
        return output + delta.to(output.dtype)

    @contextlib.contextmanager
    def rows(self, adapters: list[str | None]) -> Iterator[None]:
        """The forward call inside runs row i with adapters[i] (None: the base model)."""
        if self.peft is None or all(a is None for a in adapters):
            yield
            return
        self._names, self._masks = list(adapters), {}
        try:
            yield
        finally:
            self._names = None


class StackedLora:
    """One LoRA layer's adapters side by side: their A matrices stacked into one, their B
    matrices joined, so that a batch's rows, each with its own adapter or none, take one
    product: x @ A.T, times a mask that keeps each row's own adapter's part (scaled by its
    scaling, zero elsewhere), @ B.T. Two small matmuls a layer whatever the adapters in the
    batch, where picking each adapter's rows out and back (PEFT's mixed batch) costs a
    gather and a scatter per adapter."""

    def __init__(self, a: Any, b: Any, spans: dict[str, tuple[int, int, float]]):
        self.a, self.b, self.spans = a, b, spans  # spans: name -> (first, end, scaling)
        self.layout = tuple(sorted(spans.items()))

    @classmethod
    def of(cls, module: Any) -> StackedLora | None:
        import torch

        names = [n for n in module.lora_A if n in module.scaling]
        if getattr(module, "lora_embedding_A", None) and any(module.lora_embedding_A):
            raise ModelLoadError("a LoRA adapter on embeddings is not supported by NATIVE")
        for name in names:
            if name in getattr(module, "lora_variant", {}) or module.lora_B[name].bias is not None:
                raise ModelLoadError(
                    f"adapter '{name}': NATIVE runs plain LoRA adapters (no DoRA, no bias)"
                )
        if not names:
            return None
        spans, first = {}, 0
        for name in names:
            rank = module.lora_A[name].weight.shape[0]
            spans[name] = (first, first + rank, float(module.scaling[name]))
            first += rank
        a = torch.cat([module.lora_A[n].weight for n in names]).detach()
        b = torch.cat([module.lora_B[n].weight for n in names], dim=1).detach()
        return cls(a, b, spans)

    def mask(self, rows: list[str | None], dims: int) -> Any:
        """[rows, 1.., stacked rank]: each row's adapter's scaling over its own span."""
        import torch

        mask = torch.zeros(len(rows), self.a.shape[0], dtype=self.a.dtype)
        for i, name in enumerate(rows):
            span = self.spans.get(name) if name else None
            if span is not None:
                mask[i, span[0] : span[1]] = span[2]
        return mask.view(len(rows), *[1] * (dims - 2), -1).to(self.a.device)
