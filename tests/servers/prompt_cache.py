"""The providers' prompt caches, as the loopback server plays them (a token is a word here, as
everywhere in this server).

Anthropic (Messages, live and in Message Batches) caches what a request marks: each
`cache_control` on a tool or a system block ends a prefix (everything before it, in the order
tools, system). A marked prefix shorter than `min_tokens` is not cached, as Anthropic does
with one under its model's minimum. The longest marked prefix already written is read
(`cache_read_input_tokens`); the rest up to the last mark is written
(`cache_creation_input_tokens`), and `input_tokens` is what remains. OpenAI (chat completions)
caches by itself: a prompt whose leading system messages and tools come to `min_tokens` or
more, and came before, has them read from the cache (`prompt_tokens_details.cached_tokens`).
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from typing import Any


@dataclass
class CacheUse:
    read: int = 0
    written: int = 0


@dataclass
class PromptCache:
    min_tokens: int = 1024
    written: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def anthropic(self, body: dict[str, Any]) -> CacheUse:
        """What a Messages request reads from and writes to the cache, by its marks."""
        marks = []  # (key, tokens) of each marked prefix, shortest first
        content: list[Any] = []
        tokens = 0
        for kind, blocks in (("tools", body.get("tools") or []), ("system", _system(body))):
            for block in blocks:
                plain = {k: v for k, v in block.items() if k != "cache_control"}
                content.append([kind, plain])
                tokens += _words(plain["text"] if kind == "system" else json.dumps(plain))
                if "cache_control" in block:
                    marks.append((_key(content), tokens))
        marks = [(key, n) for key, n in marks if n >= self.min_tokens]
        if not marks:
            return CacheUse()
        with self.lock:
            read = max((n for key, n in marks if key in self.written), default=0)
            self.written.update(key for key, _ in marks)
        return CacheUse(read, marks[-1][1] - read)

    def openai(self, body: dict[str, Any]) -> CacheUse:
        """What a chat completions request reads from the cache: its leading system messages
        and tools, where they are long enough and came before."""
        lead = []
        for message in body.get("messages") or []:
            if message.get("role") not in ("system", "developer"):
                break
            lead.append(message)
        tools = body.get("tools") or []
        tokens = sum(_words(_text(m.get("content"))) for m in lead)
        tokens += sum(_words(json.dumps(tool)) for tool in tools)
        if tokens < self.min_tokens:
            return CacheUse()
        key = _key([lead, tools])
        with self.lock:
            seen = key in self.written
            self.written.add(key)
        return CacheUse(tokens if seen else 0)


def _system(body: dict[str, Any]) -> list[dict[str, Any]]:
    system = body.get("system") or []
    return [{"type": "text", "text": system}] if isinstance(system, str) else system


def _key(content: Any) -> str:
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()


def _words(text: str) -> int:
    return len(text.split())


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""
