"""Provider prompt caching: which requests mark their shared prefix for the provider to cache
(`remote_params.prompt_cache`), and which of a job's prompt tokens the provider is expected to
read from its cache (the dry run's estimate).

Anthropic caches a prefix only where a request marks it (`cache_control`); the request that
writes it pays 1.25x the input price for those tokens and each later read 0.1x. A marker pays
only for a prefix that comes again, so `auto` marks a prefix (the tools; the tools with the
system prompt) from the second request that carries it on, and only where it is long enough
to be cached at all (Anthropic's minimum for the model; shorter marked prefixes are simply not
cached). A prefix that comes once costs nothing more than with `off`; one that comes twice,
0.25x of it more; three times or more, less. While the request that writes a prefix is in
flight, the others carrying it wait for it (`PrefixMarks.writing`), so that they read it rather
than each writing it again. Prefixes are told apart by a hash, at most `REMEMBERED` of them.

OpenAI caches any prompt of 1024 tokens or more by itself, at no write price, and so does
Gemini's API: no marker, only the cheaper reads. Token counts here are the pacer's estimate
(~4 characters a token): no provider publishes its tokenizer.

Nothing here imports an SDK.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections import OrderedDict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from lmpress.engines.prompt_count import estimate_tokens
from lmpress.vocabulary.types import Request

# The shortest prefix Anthropic caches, per model (by name prefix; others 1024), from its
# prompt caching guide as quoted in 2026: the Opus 4.5 and Haiku 4.5 generations need more.
ANTHROPIC_MIN_TOKENS: tuple[tuple[str, int], ...] = (
    ("claude-opus-4-5", 4096),
    ("claude-opus-4-6", 4096),
    ("claude-haiku-4-5", 4096),
    ("claude-sonnet-4-6", 2048),
    ("claude-3-5-haiku", 2048),
    ("claude-3-haiku", 2048),
)
ANTHROPIC_DEFAULT_MIN_TOKENS = 1024
OPENAI_MIN_TOKENS = 1024  # OpenAI's automatic caching starts at this prompt length
REMEMBERED = 65_536  # prefix hashes kept per engine (16 bytes and a dict slot each)


def anthropic_min_tokens(model: str) -> int:
    """The shortest prefix Anthropic caches for a model."""
    name = model.rsplit("/", 1)[-1]
    for prefix, tokens in ANTHROPIC_MIN_TOKENS:
        if name.startswith(prefix):
            return tokens
    return ANTHROPIC_DEFAULT_MIN_TOKENS


@dataclass(frozen=True)
class Prefix:
    """One cacheable prefix of a request: its key (a hash of its content) and its tokens."""

    key: str
    tokens: int


@dataclass(frozen=True)
class Prefixes:
    """A request's cacheable prefixes, as the Messages API orders a prompt (tools, then
    system, then messages): the tools alone, and the tools with the system prompt."""

    tools: Prefix | None
    system: Prefix | None

    @classmethod
    def of(cls, request: Request) -> Prefixes:
        tools_json = json.dumps(request.tools, sort_keys=True) if request.tools else ""
        system = [m.text() for m in request.messages if m.role in ("system", "developer")]
        tools = Prefix(_hash(tools_json), estimate_tokens(len(tools_json))) if tools_json else None
        if not any(system):
            return cls(tools, None)
        chars = len(tools_json) + sum(len(text) for text in system)
        both = Prefix(_hash(tools_json, *system), estimate_tokens(chars, len(system)))
        return cls(tools, both)

    @property
    def longest(self) -> Prefix | None:
        return self.system or self.tools


def _hash(*parts: str) -> str:
    digest = hashlib.blake2b(digest_size=16)
    for part in parts:
        digest.update(part.encode("utf-8"))
        digest.update(b"\0")
    return digest.hexdigest()


@dataclass(frozen=True)
class Marks:
    """Where a request's body gets `cache_control`: the last tool, the last system block;
    `key` is the longest prefix marked (None: none)."""

    tools: bool = False
    system: bool = False
    key: str | None = None


class PrefixMarks:
    """One engine's memory of the prefixes it has sent: which to mark, and the writer's gate."""

    def __init__(self, min_tokens: int):
        self.min_tokens = min_tokens
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._written: OrderedDict[str, None] = OrderedDict()
        self._writing: dict[str, asyncio.Event] = {}

    def sight(self, request: Request) -> Marks:
        """The marks for a request's body: a prefix long enough to cache that an earlier
        request carried too. The request counts as a sighting of its prefixes."""
        prefixes = Prefixes.of(request)
        marked = []
        for prefix in (prefixes.tools, prefixes.system):
            repeated = prefix is not None and _remember(self._seen, prefix.key)
            marked.append(repeated and prefix.tokens >= self.min_tokens)
        key = None
        if marked[1] and prefixes.system is not None:
            key = prefixes.system.key
        elif marked[0] and prefixes.tools is not None:
            key = prefixes.tools.key
        return Marks(marked[0], marked[1], key)

    @asynccontextmanager
    async def writing(self, key: str | None) -> AsyncIterator[None]:
        """Around one attempt of a request whose prefix `key` is marked: the first such request
        writes the cache, and the others wait until it is done, then read what it wrote (or,
        where it failed, the next one writes)."""
        while key is not None and key not in self._written and key in self._writing:
            await self._writing[key].wait()
        if key is None or key in self._written:
            yield
            return
        event = self._writing[key] = asyncio.Event()
        try:
            yield
            _remember(self._written, key)
        finally:
            del self._writing[key]
            event.set()


def _remember(seen: OrderedDict[str, None], key: str) -> bool:
    """Whether `key` was remembered already; it is from now on (the oldest forgotten)."""
    if key in seen:
        seen.move_to_end(key)
        return True
    seen[key] = None
    if len(seen) > REMEMBERED:
        seen.popitem(last=False)
    return False


class CacheEstimate:
    """The dry run's guess at the prompt tokens a job reads from (and writes to) the provider's
    cache (`Engine.prompt_cache_tally`), row by row as the engine would send them one at a
    time: a "marked" cache (Anthropic) with `prompt_cache: auto` as `PrefixMarks` marks (the
    second row with a prefix writes it, later ones read it), an "automatic" one (OpenAI,
    Gemini) reading a shared prefix of 1024 tokens or more from the second row on."""

    def __init__(self, caching: str, model: str, mode: str):
        self.marked = caching == "marked"
        self.active = mode == "auto" or not self.marked
        self.marks = PrefixMarks(anthropic_min_tokens(model) if self.marked else OPENAI_MIN_TOKENS)
        self._written: OrderedDict[str, None] = OrderedDict()
        self.cached_tokens = 0
        self.cache_creation_tokens = 0

    def add(self, request: Request, prompt_tokens: int) -> None:
        if not self.active:
            return
        marks = self.marks.sight(request)
        if marks.key is None:
            return
        prefixes = Prefixes.of(request)
        longest = prefixes.system if marks.system else prefixes.tools
        assert longest is not None
        tokens = min(longest.tokens, prompt_tokens)
        if not self.marked or _remember(self._written, longest.key):
            self.cached_tokens += tokens
        else:
            self.cache_creation_tokens += tokens
