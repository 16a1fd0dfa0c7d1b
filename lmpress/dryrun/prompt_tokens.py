"""A request's prompt tokens, counted without generating: what the engine will report as
`usage.prompt_tokens` for it, for the dry run and the budget guardrails.

Each local engine's count goes through the engine's own prompt code, without the weights:
- NATIVE: its tokenizer (`load_tokenizer`) and `HfPrompts`, as the engine builds them (with a
  vision-language model's processor, which expands each image into its tokens: the images are
  read to count them); the context from the model's config (`model.model_max_length` caps it).
- LLAMACPP: the GGUF file opened with `vocab_only` and `GgufPrompts`; the context is a
  sequence's part of the KV cache the engine will make (`model_kwargs.n_ctx` shared by
  `generation.batch_size`).
- VLLM: the model's tokenizer through transformers, from local files or the Hugging Face cache
  (vLLM cannot run here to ask); the context is vLLM's max_model_len where it is known.
- Remote engines: `model.tokenizer_name`, else the provider's tokenizer in presets.py, loaded
  from local files only; a provider that publishes none gets an estimate (~4 characters a
  token, as the pacer budgets with), marked `exact=False`.

`count` raises RequestError for a row the engine would refuse before generating (image parts
on a text-only engine, a chat template that fails); the dry run counts it as a bad row.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Protocol

from lmpress.configs.schema import RunConfig
from lmpress.engines.common.prompts import HfPrompts
from lmpress.engines.common.tool_parsers import check_parser
from lmpress.engines.local.llamacpp.loading import (
    Vocab,
    chat_template,
    gguf_path,
    load_vocab,
    oumi_gguf_file,
    parallel_sequences,
    planned_sequence_context,
    trained_context,
)
from lmpress.engines.local.llamacpp.prompts import GgufPrompts
from lmpress.engines.local.native.loading import (
    context_length,
    load_model_config,
    load_processor,
    load_tokenizer,
    native_prompts,
)
from lmpress.engines.remote.pacing import estimate_request_tokens
from lmpress.engines.remote.presets import BY_NAME
from lmpress.vocabulary.errors import ModelLoadError
from lmpress.vocabulary.types import Request


class Counts(Protocol):
    def count(self, request: Request) -> int: ...


@dataclass
class PromptCounter:
    """Counts prompts as one engine tokenizes them. `exact`: the count is the engine's own
    (False: an estimate); `context`: the tokens a prompt must stay under, where known;
    `tokenizer_label`: what counted, for the dry run to say."""

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


def prompt_counter(config: RunConfig) -> PromptCounter:
    """The counter for the config's engine and model. Loads a tokenizer, never weights."""
    build = LOCAL_COUNTERS.get(config.engine, _remote_counter)
    return build(config)


def estimate_counter(why: str) -> PromptCounter:
    return PromptCounter(Estimate(), False, None, f"estimate, ~4 characters a token ({why})")


def _native_counter(config: RunConfig) -> PromptCounter:
    model = config.model
    tokenizer = load_tokenizer(model)
    model_config = load_model_config(model)
    processor = load_processor(model, model_config, tokenizer)  # a vision-language model's
    prompts = native_prompts(config, tokenizer, check_parser(model.tool_call_parser), processor)
    context = context_length(model_config, model.model_max_length)
    label = f"{model.tokenizer_name or model.model_name} (transformers, as NATIVE)"
    return PromptCounter(prompts, True, context, label)


def _llamacpp_counter(config: RunConfig) -> PromptCounter:
    model = config.model
    path = gguf_path(oumi_gguf_file(model) or model.model_name)
    vocab_model = load_vocab(path)
    metadata = vocab_model.metadata()
    parser = check_parser(model.tool_call_parser)
    template = chat_template(config, metadata)
    prompts = GgufPrompts(vocab_model, Vocab(vocab_model), template, model.model_name, parser)
    context = planned_sequence_context(
        int(model.model_kwargs.get("n_ctx") or 0),
        trained_context(metadata),
        parallel_sequences(config.generation.batch_size),
    )
    label = f"{model.model_name} (the GGUF file's vocabulary, as LLAMACPP)"
    return PromptCounter(prompts, True, context, label)


def _vllm_counter(config: RunConfig) -> PromptCounter:
    model = config.model
    try:
        tokenizer = load_tokenizer(model, local_only=True)
    except ModelLoadError as exc:
        return estimate_counter(f"the tokenizer is not on this machine: {exc}")
    # vLLM takes no tools (its engine refuses them) and tokenizes as transformers does,
    # unless told to use another tokenizer mode (mistral's own, say).
    prompts = HfPrompts(
        tokenizer,
        "VLLM",
        model.model_name,
        template_kwargs=model.chat_template_kwargs,
        takes_tools=False,
    )
    exact = model.model_kwargs.get("tokenizer_mode", "auto") in ("auto", "hf")
    label = f"{model.tokenizer_name or model.model_name} (transformers, as VLLM)"
    return PromptCounter(prompts, exact, _vllm_context(config), label)


def _vllm_context(config: RunConfig) -> int | None:
    model = config.model
    given = model.model_kwargs.get("max_model_len") or model.model_max_length
    if given:
        return int(given)
    try:
        return context_length(load_model_config(model, local_only=True))
    except ModelLoadError:
        return None


def _remote_counter(config: RunConfig) -> PromptCounter:
    """A remote engine's counter: a tokenizer the config names (it must load), else the
    provider's (an estimate if it is not on this machine), else an estimate."""
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


LOCAL_COUNTERS = {
    "NATIVE": _native_counter,
    "LLAMACPP": _llamacpp_counter,
    "VLLM": _vllm_counter,
}
