"""What the dry run and the budget guardrails ask of an engine: a request's prompt tokens,
counted without generating, as the engine will report them in `usage.prompt_tokens`; and which
of them the provider's prompt cache is expected to bill apart (`PromptCacheTally`).

Every engine answers through its `prompt_counter` classmethod (engines/base.py), which loads a
tokenizer and never weights. The default is a remote API's (`tokenizer_counter`):
`model.tokenizer_name`, else the tokenizer the provider publishes (its row in presets.py),
loaded from local files only; a provider that publishes none gets an estimate (~4 characters a
token, as the remote pacer budgets with), marked `exact=False`. Each local engine counts with
its own prompt code, in its folder's `prompt_count.py`. This module holds what they all return
and the default, so that engines import it without importing the dry run, and the contract
without importing an engine family.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Protocol

from lmpress.configs.schema import RunConfig
from lmpress.vocabulary.errors import ModelLoadError
from lmpress.vocabulary.types import Request


class Counts(Protocol):
    def count(self, request: Request) -> int: ...


@dataclass
class PromptCounter:
    """Counts prompts as one engine tokenizes them. `exact`: the count is the engine's own
    (False: an estimate); `context`: the tokens a prompt must stay under, where known;
    `tokenizer_label`: what counted, for the dry run to say.

    `count` raises RequestError for a row the engine would refuse before generating (image
    parts on a text-only engine, a chat template that fails); the dry run counts it as a bad
    row."""

    prompts: Counts
    exact: bool
    context: int | None
    tokenizer_label: str

    def count(self, request: Request) -> int:
        """The request's prompt tokens, as the engine will report them."""
        return self.prompts.count(request)


class Estimate:
    """~4 characters a token plus a few per message: the remote pacer's estimate."""

    def count(self, request: Request) -> int:
        return estimate_request_tokens(request)


class PromptCacheTally(Protocol):
    """A job's prompt tokens a provider is expected to read from its prompt cache and write to
    it, tallied row by row as the dry run reads them (`Engine.prompt_cache_tally`)."""

    cached_tokens: int
    cache_creation_tokens: int

    def add(self, request: Request, prompt_tokens: int) -> None: ...


class NoPromptCache:
    """An engine whose provider bills no prompt cache apart (every local engine)."""

    cached_tokens = 0
    cache_creation_tokens = 0

    def add(self, request: Request, prompt_tokens: int) -> None:
        pass


def estimate_counter(why: str) -> PromptCounter:
    """An inexact counter, for an engine whose tokenizer is not to be had; `why` says so."""
    return PromptCounter(Estimate(), False, None, f"estimate, ~4 characters a token ({why})")


def tokenizer_counter(config: RunConfig, published: str | None) -> PromptCounter:
    """A tokenizer the config names (it must load), else `published`, the one the engine's
    provider publishes (an estimate if it is not on this machine), else an estimate."""
    from lmpress.engines.common.prompts import HfPrompts

    model = config.model
    name = model.tokenizer_name or published
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
    from lmpress.engines.common.checkpoints import load_tokenizer

    return load_tokenizer(dataclasses.replace(config.model, tokenizer_name=name), local_only=True)


def estimate_tokens(text_chars: int, messages: int = 0, images: int = 0) -> int:
    """A rough prompt size for budgeting before the provider counts: ~4 characters a token, a
    few tokens of framing per message, a flat allowance per image."""
    return text_chars // 4 + 4 * messages + 256 * images + 1


def estimate_request_tokens(request: Request) -> int:
    """A request's input tokens, roughly, before the provider counts them: its text, and the
    tools it offers (their JSON Schemas are input too)."""
    if request.prompt_ids is not None:
        return len(request.prompt_ids)
    if request.prompt is not None:
        return estimate_tokens(len(request.prompt))
    chars = sum(len(m.text()) for m in request.messages)
    if request.tools:
        chars += len(json.dumps(request.tools))
    images = sum(
        1
        for m in request.messages
        if not isinstance(m.content, str)
        for part in m.content
        if part.type == "image_url"
    )
    return estimate_tokens(chars, len(request.messages), images)
