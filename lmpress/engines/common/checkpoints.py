"""A Hugging Face checkpoint without its weights: where transformers loads it from (a directory,
a hub id, or a GGUF file it dequantizes, with lmpress's packaged models read from their
dequantized copy), its tokenizer with the recipe's chat template, its config and its context.

NATIVE loads the weights after these; VLLM's and the remote engines' prompt counting use them
alone (a tokenizer and a config, never weights), which is why they live here and not in NATIVE.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lmpress.builtin_models.packaged import NAMES as PACKAGED_NAMES
from lmpress.configs.schema import ModelParams
from lmpress.engines.common.dequantized import dequantized_copy, existing_copy
from lmpress.engines.common.models import local_or_hub
from lmpress.engines.common.prompts import resolve_chat_template
from lmpress.vocabulary.errors import ModelLoadError, first_line


def model_source(model: ModelParams, *, make_copy: bool = False) -> tuple[str, str | None]:
    """Where transformers loads the model from: a directory or hub id, and the GGUF file in it
    when the model is one. A `.gguf` path (or a packaged or tiny GGUF name) names the file
    itself; Oumi's form names a hub repo or directory in `model_name` and the file in
    `model_kwargs.filename`. transformers dequantizes GGUF weights as it loads them.

    A packaged model loads from its dequantized copy (dequantized.py) once there is one;
    `make_copy` (the weights are wanted) makes it first."""
    name = local_or_hub(model.model_name, "model.model_name")
    if model.model_name in PACKAGED_NAMES and "filename" not in model.model_kwargs:
        gguf = Path(name)
        try:
            copy = dequantized_copy(gguf) if make_copy else existing_copy(gguf)
        except Exception as exc:
            raise ModelLoadError(
                f"cannot write the dequantized copy of '{model.model_name}' ({gguf}) into "
                f"lmpress's cache: {first_line(exc)}"
            ) from exc
        if copy:
            return str(copy), None
    filename = model.model_kwargs.get("filename")
    if filename is not None:
        if not isinstance(filename, str) or not filename.endswith(".gguf"):
            raise ModelLoadError(
                f"model.model_kwargs.filename: '{filename}' is not a .gguf file name; the NATIVE "
                f"engine reads it as the GGUF file inside model.model_name"
            )
        return name, filename
    path = Path(name)
    if path.suffix == ".gguf" and path.is_file():
        return str(path.parent), path.name
    return name, None


def load_tokenizer(model: ModelParams, *, local_only: bool = False) -> Any:
    """The model's tokenizer (or model.tokenizer_name's), with the recipe's chat template and
    pad token. `local_only`: from local files or the Hugging Face cache, never downloading."""
    from transformers import AutoTokenizer

    kwargs = dict(model.tokenizer_kwargs)
    if local_only:
        kwargs["local_files_only"] = True
    if model.tokenizer_name:
        name = local_or_hub(model.tokenizer_name, "model.tokenizer_name")
    else:
        name, gguf_file = model_source(model)
        if gguf_file:
            kwargs["gguf_file"] = gguf_file
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            name,
            trust_remote_code=model.trust_remote_code,
            revision=model.model_revision,
            **kwargs,
        )
    except Exception as exc:
        raise ModelLoadError(f"cannot load the tokenizer of '{name}': {first_line(exc)}") from exc
    if model.tokenizer_pad_token:
        tokenizer.pad_token = model.tokenizer_pad_token
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
    if model.chat_template:
        tokenizer.chat_template = resolve_chat_template(model.chat_template)
    tokenizer.padding_side = "left"
    return tokenizer


def load_model_config(model: ModelParams, *, local_only: bool = False) -> Any:
    """The model's config alone (no weights), as transformers reads it from the checkpoint."""
    from transformers import AutoConfig

    name, gguf_file = model_source(model)
    kwargs: dict[str, Any] = {"gguf_file": gguf_file} if gguf_file else {}
    if local_only:
        kwargs["local_files_only"] = True
    try:
        return AutoConfig.from_pretrained(
            name, trust_remote_code=model.trust_remote_code, revision=model.model_revision, **kwargs
        )
    except Exception as exc:
        raise ModelLoadError(f"cannot load the config of '{name}': {first_line(exc)}") from exc


def context_length(model_config: Any, model_max_length: int | None = None) -> int | None:
    """The model's context, prompt included: its config's position limit, capped by
    `model.model_max_length` (Oumi's cap on the sequence length). None: neither says."""
    text_config = model_config.get_text_config()
    found = None
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        value = getattr(text_config, key, None)
        if isinstance(value, int) and value > 0:
            found = value
            break
    if model_max_length:
        found = min(found or model_max_length, model_max_length)
    return found
