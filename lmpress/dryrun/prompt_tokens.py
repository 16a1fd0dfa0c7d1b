"""A request's prompt tokens, counted without generating: what the engine will report as
`usage.prompt_tokens` for it, for the dry run and the budget guardrails.

The engine answers: each engine class has a `prompt_counter` (engines/base.py), which loads a
tokenizer and never weights. A remote API's is the default (engines/prompt_count.py);
NATIVE, LLAMACPP and VLLM count with their own prompt code, in their folder's `prompt_count.py`.
The engine's backend need not be installed here (VLLM's count needs only transformers).
"""

from __future__ import annotations

from lmpress.configs.schema import RunConfig
from lmpress.engines.prompt_count import PromptCacheTally, PromptCounter
from lmpress.engines.registry import engine_class


def prompt_counter(config: RunConfig) -> PromptCounter:
    """The counter for the config's engine and model. Loads a tokenizer, never weights."""
    return engine_class(config.engine).prompt_counter(config)


def prompt_cache_tally(config: RunConfig) -> PromptCacheTally:
    """What the config's engine's provider is expected to bill as cached prompt tokens."""
    return engine_class(config.engine).prompt_cache_tally(config)
