"""Constrained decoding on the local engines, through llguidance.

A guided-decoding value (a JSON Schema, any JSON object, a regex, a choice of strings, a
GBNF/EBNF or Lark grammar) becomes an llguidance grammar. `Grammars` holds one tokenizer's
grammar engine and compiles each distinct value once: a new sequence gets a copy of the
compiled matcher. Each step, a sequence's `Matcher` says which tokens may come next (a bitmask
over the vocabulary, applied to the logits before sampling) and follows the token sampled.
When the grammar is complete only the end-of-sequence token is allowed, so the row ends there.

Why llguidance: it has no dependencies (a wheel of its own, no torch), so NATIVE and LLAMACPP
share one grammar engine, and it reads both a Hugging Face fast tokenizer and llama.cpp's vocab.
vLLM and llama.cpp use it too. xgrammar, the other engine vLLM uses, needs torch and triton, which
the llama.cpp extra does not install. A mask costs about 10 microseconds a token on SmolLM2's
49,152-token vocabulary.
"""

from __future__ import annotations

import json
import threading
import warnings
from collections import OrderedDict
from typing import Any

import numpy as np

GRAMMAR_KINDS = ("json", "json_object", "regex", "choice", "grammar")

# Compact JSON, as vLLM's guided decoding writes it by default: a small greedy model given free
# whitespace can write newlines until its token limit. `whitespace_pattern` loosens it.
COMPACT_JSON = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class GrammarError(ValueError):
    """A guided-decoding value that llguidance cannot compile; the message says why."""


def grammar_source(kind: str, value: Any, whitespace_pattern: str | None = None) -> str:
    """The llguidance grammar for one guided-decoding value."""
    from llguidance import LLMatcher, grammar_from

    if kind in ("json", "json_object"):
        schema = value if kind == "json" else {"type": "object"}
        if isinstance(schema, str):
            schema = json.loads(schema)
        options: dict[str, Any] = dict(COMPACT_JSON)
        if whitespace_pattern is not None:
            options = {"whitespace_flexible": True, "whitespace_pattern": whitespace_pattern}
        return LLMatcher.grammar_from_json_schema(schema, overrides=options)
    if kind == "regex":
        return LLMatcher.grammar_from_regex(value)
    if kind == "choice":
        return grammar_from("choice", list(value))
    if kind == "lark":  # lmpress's own grammars, such as a tool call's (see tool_calls.py)
        return LLMatcher.grammar_from_lark(value)
    if kind == "grammar":
        try:
            return grammar_from("grammar", value)  # GBNF or EBNF, else Lark as it is
        except Exception as exc:
            raise GrammarError(f"cannot read the grammar: {exc}") from exc
    raise GrammarError(f"guided decoding '{kind}' is not supported on this engine")


class Grammars:
    """One tokenizer's grammar engine: compiled matchers by grammar, least recently used out."""

    def __init__(self, tokenizer: Any, n_vocab: int, cache_size: int = 256):
        self.tokenizer = tokenizer
        self.n_vocab = n_vocab
        self._compiled: OrderedDict[str, Any] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()

    @classmethod
    def for_hf_tokenizer(cls, tokenizer: Any) -> Grammars:
        """For a Hugging Face fast tokenizer (NATIVE); about a second, once per engine."""
        import llguidance.hf

        try:
            ll = llguidance.hf.from_tokenizer(tokenizer)
        except ValueError as exc:  # a slow (Python) tokenizer
            raise GrammarError(
                f"guided decoding needs a fast tokenizer; this model's is {type(tokenizer).__name__}"
            ) from exc
        return cls(ll, ll.vocab_size)

    @classmethod
    def for_llama_vocab(cls, vocab: Any, n_vocab: int) -> Grammars:
        """For a llama.cpp vocabulary (LLAMACPP); about a second, once per engine."""
        import llguidance.llamacpp

        with warnings.catch_warnings():  # it reads each token through a deprecated alias
            warnings.simplefilter("ignore", DeprecationWarning)
            return cls(llguidance.llamacpp.lltokenizer_from_vocab(vocab), n_vocab)

    def matcher(self, kind: str, value: Any, whitespace_pattern: str | None = None) -> Matcher:
        """A fresh matcher for one sequence; the grammar compiles on its first use only."""
        from llguidance import LLMatcher

        key = json.dumps([kind, value, whitespace_pattern], sort_keys=True)
        with self._lock:
            compiled = self._compiled.get(key)
            if compiled is not None:
                self._compiled.move_to_end(key)
        if compiled is None:
            source = grammar_source(kind, value, whitespace_pattern)
            compiled = LLMatcher(self.tokenizer, source, log_level=0)
            if compiled.is_error():
                raise GrammarError(_first_error(compiled.get_error()))
            with self._lock:
                self._compiled[key] = compiled
                while len(self._compiled) > self._cache_size:
                    self._compiled.popitem(last=False)
        return Matcher(compiled.deep_copy(), self.n_vocab)

    def compiled_count(self) -> int:
        return len(self._compiled)


class Matcher:
    """One sequence's place in its grammar."""

    def __init__(self, matcher: Any, n_vocab: int):
        self._matcher = matcher
        self._n_vocab = n_vocab
        self._bits = np.full((n_vocab + 31) // 32, -1, dtype=np.int32)

    def allowed(self) -> np.ndarray:
        """A boolean per token of the vocabulary: may it come next?"""
        self._matcher.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        return np.unpackbits(self._bits.view(np.uint8), bitorder="little", count=self._n_vocab)

    def mask_logits(self, logits: np.ndarray) -> None:
        """Set the logits of every token the grammar forbids here to -inf, in place."""
        allowed = self.allowed()
        logits[: self._n_vocab][allowed == 0] = -np.inf
        logits[self._n_vocab :] = -np.inf  # a model's padded rows past the tokenizer's tokens

    def accept(self, token: int) -> None:
        """Follow the token sampled. It was allowed, so this cannot fail short of a bug."""
        if not self._matcher.consume_token(token):
            raise GrammarError(_first_error(self._matcher.get_error()))

    @property
    def complete(self) -> bool:
        """The text so far is a whole match and the grammar admits nothing more."""
        return self._matcher.is_stopped() and not self._matcher.is_error()

    @property
    def accepting(self) -> bool:
        """The text so far is a whole match (more may still follow)."""
        return self._matcher.is_accepting()


def _first_error(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0] if lines else "the grammar engine refused it"
