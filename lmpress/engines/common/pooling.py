"""How an embedding model turns its hidden states into one vector: the pooling it declares.

A sentence-transformers directory says it in files beside the weights: `modules.json` lists
the modules in order (the Transformer, a Pooling module whose `config.json` names the mode,
and a `Normalize` module for an L2 norm), `sentence_bert_config.json` the length the model was
trained to read, and `config_sentence_transformers.json` a `truncate_dim` where it was trained
Matryoshka-style. A plain Hugging Face directory declares nothing: mean pooling, no norm, as
sentence-transformers itself assumes for one. Reading it needs no backend, so any engine that
pools from hidden states can use it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from lmpress.vocabulary.errors import ModelLoadError

PoolingMode = Literal["mean", "cls", "last", "max", "mean_sqrt_len"]

# Pooling's config.json flags, as sentence-transformers writes them, and the mode each means.
_FLAGS: dict[str, PoolingMode] = {
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
    "pooling_mode_lasttoken": "last",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len",
}
# The modules lmpress applies itself; a model with any other (Dense, a custom module) would
# give other vectors than it was trained to, so it is refused.
_KNOWN_MODULES = ("Transformer", "Pooling", "Normalize")


@dataclass(frozen=True)
class Pooling:
    mode: PoolingMode = "mean"
    normalize: bool = False  # the model ends in a Normalize module
    max_length: int | None = None  # sentence_bert_config.json's max_seq_length
    lower_case: bool = False  # sentence_bert_config.json's do_lower_case
    truncate_dim: int | None = None  # trained Matryoshka-style, saved with this width
    subfolder: str = ""  # where the Transformer module's weights are, inside the directory


def read_pooling(directory: str | Path) -> Pooling:
    """The pooling a model directory declares (mean and no norm where it declares none); a
    ModelLoadError that names the file where it declares one lmpress cannot apply."""
    root = Path(directory)
    modules = _read_json(root / "modules.json")
    if modules is None:
        return Pooling()
    mode: PoolingMode = "mean"
    normalize = False
    subfolder = ""
    for module in modules:
        kind = str(module.get("type", "")).rsplit(".", 1)[-1]
        if kind not in _KNOWN_MODULES:
            raise ModelLoadError(
                f"{root / 'modules.json'}: module '{module.get('type')}' is not one lmpress "
                f"applies ({', '.join(_KNOWN_MODULES)}); its vectors would differ from the model's"
            )
        if kind == "Transformer":
            subfolder = module.get("path", "")
        elif kind == "Pooling":
            mode = _pooling_mode(root / module.get("path", "") / "config.json")
        elif kind == "Normalize":
            normalize = True
    bert = _read_json(root / subfolder / "sentence_bert_config.json") or {}
    st_config = _read_json(root / "config_sentence_transformers.json") or {}
    return Pooling(
        mode=mode,
        normalize=normalize,
        max_length=bert.get("max_seq_length"),
        lower_case=bool(bert.get("do_lower_case", False)),
        truncate_dim=st_config.get("truncate_dim"),
        subfolder=subfolder,
    )


def _pooling_mode(path: Path) -> PoolingMode:
    config = _read_json(path) or {}
    asked = [key for key, value in config.items() if key.startswith("pooling_mode_") and value]
    if len(asked) != 1 or asked[0] not in _FLAGS:
        raise ModelLoadError(
            f"{path}: lmpress pools with exactly one of {', '.join(_FLAGS)}; this config "
            f"sets {', '.join(asked) or 'none'}"
        )
    return _FLAGS[asked[0]]


def _read_json(path: Path) -> Any:
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{path}: cannot read it as JSON ({exc})") from exc


def pool(hidden: Any, mask: Any, mode: PoolingMode) -> Any:
    """One vector per row from a right-padded batch's hidden states (B, T, H) and attention
    mask (B, T), as sentence-transformers' Pooling module computes it (torch tensors)."""
    import torch

    weights = mask.unsqueeze(-1).to(hidden.dtype)
    lengths = mask.sum(dim=1)
    if mode == "cls":
        return hidden[:, 0]
    if mode == "last":
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), lengths - 1]
    if mode == "max":
        return hidden.masked_fill(weights == 0, -1e9).max(dim=1).values
    summed = (hidden * weights).sum(dim=1)
    count = weights.sum(dim=1).clamp(min=1e-9)
    return summed / (count.sqrt() if mode == "mean_sqrt_len" else count)
