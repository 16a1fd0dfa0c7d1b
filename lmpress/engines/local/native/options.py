"""NATIVE's `model.model_kwargs`: the settings it reads itself, typed (engines/options.py), and
the check of the rest, which go to transformers' `from_pretrained`, against what it takes.

The check runs once transformers is imported and the model's config read, before any weights:
`from_pretrained` takes its own named arguments, those it pops from `**kwargs` (device_map,
quantization_config, ...), and any field of the model's config, which it overrides
(`rope_scaling`, `use_cache`); anything else would reach the model's constructor and fail there.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass
from functools import cache
from typing import Any

from lmpress.engines.options import EngineOptions, check_passed_through, setting
from lmpress.vocabulary.errors import ConfigError


@dataclass
class NativeOptions(EngineOptions):
    passes_to = "transformers' from_pretrained"
    known_as = "a NATIVE setting, a transformers from_pretrained argument or a model config field"

    filename: str | None = setting(
        None, "the .gguf file in model_name's directory or hub repo, dequantized as it loads"
    )
    kv_cache_gb: float | None = setting(
        None, "the KV cache's budget in GiB: rows join only while it has room (null: no cap)"
    )
    prefix_reuse: bool = setting(True, "prompts reuse the KV cache of a prefix already computed")
    pack_weights: bool = setting(True, "on a CPU, pack the linear layers' weights for speed")
    matryoshka_dims: bool | list[int] | None = setting(
        None, "the widths an embedding model's vectors may be cut to (true: any; null: as trained)"
    )
    kv_unified: bool = setting(
        False, "llama.cpp's shared KV cache, accepted so its recipes run (NATIVE's always is)"
    )

    def check(self) -> None:
        if self.kv_cache_gb is not None and not self.kv_cache_gb > 0:
            raise ConfigError(
                f"model.model_kwargs.kv_cache_gb: '{self.kv_cache_gb}' is not a size in GiB "
                "greater than 0"
            )
        widths = self.matryoshka_dims
        if isinstance(widths, list) and not (widths and all(w > 0 for w in widths)):
            raise ConfigError(
                f"model.model_kwargs.matryoshka_dims: '{widths}' is not true, false or a list "
                "of widths"
            )


def from_pretrained_kwargs(model_kwargs: dict[str, Any], model_config: Any) -> dict[str, Any]:
    """The keys of `model_kwargs` that go to `from_pretrained`, each checked to be one it takes
    (transformers imported here)."""
    passed = NativeOptions.passed_through(model_kwargs)
    fields = [key for key in passed if hasattr(model_config, key)]
    return check_passed_through(NativeOptions, passed, [*from_pretrained_arguments(), *fields])


@cache
def from_pretrained_arguments() -> frozenset[str]:
    """What `from_pretrained` takes by name: its signature's, and those it pops from `**kwargs`
    (read from its source, where transformers lists them)."""
    from transformers import PreTrainedModel
    from transformers.models.auto.auto_factory import _BaseAutoModelClass

    names: set[str] = set()
    for method in (PreTrainedModel.from_pretrained, _BaseAutoModelClass.from_pretrained):
        names |= {
            name
            for name, p in inspect.signature(method).parameters.items()
            if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
        }
        try:
            source = inspect.getsource(method)
        except (OSError, TypeError):  # no source installed: the signature's names only
            continue
        names |= set(re.findall(r"""kwargs\.pop\(\s*["'](\w+)["']""", source))
        # Names it still accepts and drops: `for name in ["low_cpu_mem_usage", ...]: kwargs.pop`
        for listed in re.findall(r"for \w+ in \[([^\]]*)\]:\s*\n\s*[\w ]*=?\s*kwargs\.pop", source):
            names |= set(re.findall(r"""["'](\w+)["']""", listed))
    names |= {"attn_implementation", "experts_implementation"}  # read as `name in kwargs`
    return frozenset(name for name in names if not name.startswith("_")) - {"cls", "config"}
