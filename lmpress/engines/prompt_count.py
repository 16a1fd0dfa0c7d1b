"""What the dry run and the budget guardrails ask of an engine: a request's prompt tokens,
counted without generating, as the engine will report them in `usage.prompt_tokens`; and which
of them the provider's prompt cache is expected to bill apart (`PromptCacheTally`).

Every engine answers through its `prompt_counter` classmethod (engines/base.py), which loads a
tokenizer and never weights. The default is a remote API's (engines/remote/prompt_count.py);
each local engine counts with its own prompt code, in its folder's `prompt_count.py`. This
module holds what they all return, so that engines import it without importing the dry run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from lmpress.engines.remote.pacing import estimate_request_tokens
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
