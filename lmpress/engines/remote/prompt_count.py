"""How a remote engine's prompts are counted, and the default for any engine that does not say:
`model.tokenizer_name`, else the provider's tokenizer in presets.py, loaded from local files
only; a provider that publishes none gets an estimate (~4 characters a token, as the pacer
budgets with), marked `exact=False`."""

from __future__ import annotations

import dataclasses
from typing import Any

from lmpress.configs.schema import RunConfig
from lmpress.engines.common.checkpoints import load_tokenizer
from lmpress.engines.common.prompts import HfPrompts
from lmpress.engines.prompt_count import PromptCounter, estimate_counter
from lmpress.engines.remote.presets import BY_NAME
from lmpress.vocabulary.errors import ModelLoadError


def prompt_counter(config: RunConfig) -> PromptCounter:
    """A tokenizer the config names (it must load), else the provider's (an estimate if it is
    not on this machine), else an estimate."""
    model = config.model
    provider = BY_NAME.get(config.engine)
    name = model.tokenizer_name or (provider.tokenizer if provider else None)
    if not name:
        return estimate_counter(f"{config.engine} publishes no tokenizer; set model.tokenizer_name")
    try:
        tokenizer = _offline_tokenizer(config, name)
    except ModelLoadError:
        if model.tokenizer_name:
            raise
        return estimate_counter(f"the {config.engine} tokenizer {name} is not on this machine")
    prompts = HfPrompts(
        tokenizer, config.engine, model.model_name, template_kwargs=model.chat_template_kwargs
    )
    return PromptCounter(prompts, True, None, f"{name} (transformers)")


def _offline_tokenizer(config: RunConfig, name: str) -> Any:
    """A Hugging Face tokenizer from a local path or the cache; nothing is downloaded."""
    return load_tokenizer(dataclasses.replace(config.model, tokenizer_name=name), local_only=True)
