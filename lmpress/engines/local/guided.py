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
from collections.abc import Callable
from typing import Any

from lmpress.vocabulary.guided import GuidedForm

# The guided-decoding forms the local engines take (not vLLM's structural_tag).
LOCAL_FORMS: frozenset[GuidedForm] = frozenset(
    {"json", "json_object", "regex", "choice", "grammar"}
)

# JSON under `disable_any_whitespace`: one space after ',' and ':', none elsewhere.
COMPACT_JSON = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class GrammarError(ValueError):
    """A guided-decoding value that llguidance cannot compile; the message says why."""


def grammar_source(kind: str, value: Any, options: dict[str, Any] | None = None) -> str:
    """The llguidance grammar for one guided-decoding value; `options` are vLLM's JSON
    whitespace options (`GuidedDecoding.options()`), with vLLM's meaning: any whitespace
    between JSON tokens unless `disable_any_whitespace`."""
    from llguidance import LLMatcher, grammar_from

    options = options or {}
    if kind in ("json", "json_object"):
        schema = value if kind == "json" else {"type": "object"}
        if isinstance(schema, str):
            schema = json.loads(schema)
        if options.get("disable_additional_properties"):
            schema = _closed(schema)
        compile_options: dict[str, Any] = {"whitespace_flexible": True}
        if options.get("whitespace_pattern"):
            compile_options["whitespace_pattern"] = options["whitespace_pattern"]
        elif options.get("disable_any_whitespace"):
            compile_options = dict(COMPACT_JSON)
        return LLMatcher.grammar_from_json_schema(schema, overrides=compile_options)
    if kind == "regex":
        return LLMatcher.grammar_from_regex(value)
    if kind == "choice":
        return grammar_from("choice", list(value))
    if kind == "lark":  # lmpress's own grammars, such as a tool call's (see common/tool_parsers.py)
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
    def for_hf_tokenizer(cls, tokenizer: Any, end_ids: list[int] | None = None) -> Grammars:
        """For a Hugging Face fast tokenizer (NATIVE); about a second, once per engine."""
        import llguidance.hf

        try:
            ll = llguidance.hf.from_tokenizer(tokenizer, eos_token=end_ids)
        except ValueError:  # a decoder it cannot read (sentencepiece's), or a slow tokenizer
            ll = _from_token_pieces(tokenizer, end_ids)
        return cls(ll, ll.vocab_size)

    @classmethod
    def for_llama_vocab(
        cls, vocab: Any, n_vocab: int, end_ids: list[int] | None = None
    ) -> Grammars:
        """For a llama.cpp vocabulary (LLAMACPP); about a second, once per engine. `end_ids`:
        the tokens that end a reply (EOS, end of turn), which a complete grammar allows."""
        import llguidance.llamacpp

        with warnings.catch_warnings():  # it reads each token through a deprecated alias
            warnings.simplefilter("ignore", DeprecationWarning)
            tokenizer = llguidance.llamacpp.lltokenizer_from_vocab(vocab, eos_token=end_ids)
        return cls(tokenizer, n_vocab)

    def matcher(self, kind: str, value: Any, options: dict[str, Any] | None = None) -> Matcher:
        """A fresh matcher for one sequence; the grammar compiles on its first use only."""
        from llguidance import LLMatcher

        key = json.dumps([kind, value, options or {}], sort_keys=True)
        with self._lock:
            compiled = self._compiled.get(key)
            if compiled is not None:
                self._compiled.move_to_end(key)
        if compiled is None:
            source = grammar_source(kind, value, options)
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
        import numpy as np

        self._np = np
        self._matcher = matcher
        self._n_vocab = n_vocab
        self._bits = np.full((n_vocab + 31) // 32, -1, dtype=np.int32)

    def allowed(self) -> Any:
        """A 0/1 array with an entry per token of the vocabulary: may it come next?"""
        self._matcher.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        return self._np.unpackbits(
            self._bits.view(self._np.uint8), bitorder="little", count=self._n_vocab
        )

    def mask_logits(self, logits: Any) -> None:
        """Set the logits (a numpy array) of every token the grammar forbids here to -inf."""
        allowed = self.allowed()
        logits[: self._n_vocab][allowed == 0] = -self._np.inf
        logits[self._n_vocab :] = -self._np.inf  # a model's padded rows past the tokenizer's tokens

    def copy(self) -> Matcher:
        """The same place in the same grammar, for another sample of the same request."""
        return Matcher(self._matcher.deep_copy(), self._n_vocab)

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


def guided_matcher(grammars: Callable[[], Grammars], guided: Any, engine: str) -> Matcher | None:
    """The matcher for a request's `generation.guided_decoding` (a `GuidedDecoding`), or None
    when it has none; a form the local engines lack, a value that does not compile, or a
    tokenizer the grammar engine cannot read fails the request in one line. `grammars` gives
    the engine's grammar engine, built on first use."""
    from lmpress.vocabulary.errors import ErrorKind, RequestError

    if guided is None or guided.form is None:
        return None
    guided.refuse_unless(engine, LOCAL_FORMS, options=True)
    try:
        return grammars().matcher(guided.form, guided.value, guided.options())
    except (GrammarError, ValueError) as exc:
        raise RequestError(
            f"generation.guided_decoding.{guided.form}: {exc}", ErrorKind.INVALID_REQUEST
        ) from exc


def request_matcher(
    grammars: Callable[[], Grammars], guided: Any, plan: Any, engine: str
) -> Matcher | None:
    """The one grammar a request's replies follow: its guided decoding, or the call its
    tool_choice requires (`plan`, a ToolPlan or None); both at once is refused."""
    from lmpress.vocabulary.errors import ErrorKind, RequestError

    tool_grammar = plan.grammar if plan is not None else None
    if tool_grammar is None:
        return guided_matcher(grammars, guided, engine)
    if guided is not None and guided.form is not None:
        raise RequestError(
            "generation.guided_decoding and a required tool call (tool_choice) cannot both "
            "constrain one reply; drop one of them",
            ErrorKind.INVALID_REQUEST,
        )
    try:
        return grammars().matcher("lark", tool_grammar)
    except (GrammarError, ValueError) as exc:
        raise RequestError(f"tools: {exc}", ErrorKind.INVALID_REQUEST) from exc


def check_recipe_guided(grammars: Callable[[], Grammars], guided: Any, engine: str) -> None:
    """The recipe's own constraint, checked and compiled before any row is read."""
    from lmpress.vocabulary.errors import ConfigError, RequestError

    if guided is None or guided.form is None:
        return
    try:
        guided_matcher(grammars, guided, engine)
    except RequestError as exc:
        raise ConfigError(str(exc)) from exc


def _closed(schema: Any) -> Any:
    """The schema with `additionalProperties: false` on every object that does not say."""
    if isinstance(schema, list):
        return [_closed(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    closed = {key: _closed(value) for key, value in schema.items()}
    if closed.get("type") == "object" or "properties" in closed:
        closed.setdefault("additionalProperties", False)
    return closed


def _from_token_pieces(tokenizer: Any, end_ids: list[int] | None) -> Any:
    """An llguidance tokenizer from each token's bytes, for the sentencepiece-style tokenizers
    (Llama 2, Mistral) whose decoder llguidance does not read: '\u2581' is a space, '<0xNN>'
    one byte, and special tokens are marked as llama.cpp's vocab marks them."""
    import llguidance

    special = set(tokenizer.all_special_ids)
    pieces = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    tokens = []
    for token_id, piece in enumerate(pieces):
        piece = piece or ""
        if token_id in special:
            tokens.append(b"\xff" + piece.encode("utf-8"))
        elif len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            tokens.append(bytes([int(piece[3:5], 16)]))
        else:
            tokens.append(piece.replace("\u2581", " ").encode("utf-8"))

    class Pieces:
        eos_token_id = (end_ids or [tokenizer.eos_token_id])[0]
        bos_token_id = tokenizer.bos_token_id

        def __init__(self) -> None:
            self.tokens = tokens
            self.special_token_ids = sorted(special)

        def __call__(self, text: str) -> list[int]:
            """Tokens whose bytes are exactly `text`'s: the tokenizer's own where they are,
            else the longest pieces first (sentencepiece adds a space in front of the text)."""
            ids = tokenizer.encode(text, add_special_tokens=False)
            data = text.encode("utf-8")
            if b"".join(tokens[i] for i in ids) == data:
                return ids
            out, i = [], 0
            while i < len(data):
                for end in range(min(len(data), i + longest), i, -1):
                    if data[i:end] in by_bytes:
                        out.append(by_bytes[data[i:end]])
                        i = end
                        break
                else:
                    return ids  # a byte no piece covers: the tokenizer's own is the best left
            return out

    by_bytes: dict[bytes, int] = {}
    for token_id, data in enumerate(tokens):
        if token_id not in special and data:
            by_bytes.setdefault(data, token_id)
    longest = max(map(len, by_bytes), default=1)

    try:
        wrapper = llguidance.TokenizerWrapper(Pieces())
        return llguidance.LLTokenizer(wrapper, eos_token=end_ids)
    except Exception as exc:
        raise GrammarError(f"the grammar engine cannot read this model's tokenizer: {exc}") from exc


def _first_error(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0] if lines else "the grammar engine refused it"
