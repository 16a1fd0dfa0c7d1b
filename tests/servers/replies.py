"""The loopback server's replies, in either wire format: `Reply.of` reads a request body and
says what the server answers, whole (`openai`, `anthropic`) or as stream events."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.servers import reasoning_replies, tool_replies
from tests.servers.prompt_cache import CacheUse, PromptCache


def reply_text(last_user: str) -> str:
    """The reply the server gives to a conversation whose last user message is `last_user`."""
    digest = hashlib.sha256(last_user.encode("utf-8")).hexdigest()[:12]
    return " ".join([f"Reply-{digest}", "to:", *last_user.split()[:6]])


@dataclass
class Reply:
    """The server's answer to one request, in either wire format."""

    samples: list[tuple[str, str]]  # (text, finish reason as OpenAI spells it)
    prompt_tokens: int
    model: str
    logprobs: int | None = None  # top_logprobs asked for, when logprobs were
    calls: list[dict[str, Any]] | None = None  # tool calls, in the wire's own form
    # Per sample, the stop string that cut it (None: none did), as vLLM's `stop_reason` and
    # Anthropic's `stop_sequence` name it.
    stopped_by: list[str | None] = field(default_factory=list)
    thinking: str | None = None  # what the model thought first (`reasoning_replies`)
    style: str | None = None  # how chat completions writes it (`Faults.reasoning`)
    shown: bool = False  # whether its text goes out on chat completions
    thinking_blocks: list[dict[str, Any]] | None = None  # on the Messages API
    cache: CacheUse = field(default_factory=CacheUse)  # the prompt cache's part (`prompt_cache`)

    @classmethod
    def of(
        cls, body: dict[str, Any], anthropic: bool, model: str, reasoning: str | None = None,
        prompt_cache: PromptCache | None = None, answer: Callable[[str], str] = reply_text,
    ) -> Reply:  # fmt: skip
        messages = body.get("messages")
        if messages is None:
            last_user = str(body.get("prompt", ""))
            prompt_words = len(last_user.split())
        else:
            users = [m for m in messages if m.get("role") == "user"]
            last_user = _text(users[-1].get("content")) if users else ""
            last_user = tool_replies.tool_result_text(messages) or last_user
            prompt_words = sum(len(_text(m.get("content")).split()) for m in messages)
            prompt_words += len(_text(body.get("system") or "").split())
        limit = body.get("max_tokens") or body.get("max_completion_tokens") or 1000
        stops = body.get("stop_sequences" if anthropic else "stop") or []
        stops = [stops] if isinstance(stops, str) else stops
        samples, stopped_by = [], []
        for i in range(int(body.get("n") or 1)):
            text = answer(last_user) + (f" #{i}" if i else "")
            finish, stopped = "stop", None
            for stop in stops:  # the last to cut is the one that appears first
                if stop in text:
                    text, stopped = text[: text.index(stop)], stop
            words = text.split(" ")
            if len(words) > limit:
                text, finish, stopped = " ".join(words[:limit]), "length", None
            samples.append((text, finish))
            stopped_by.append(stopped)
        lp = body.get("logprobs")
        logprobs = (body.get("top_logprobs") or 0) if lp is True else None
        calls = (tool_replies.anthropic_calls if anthropic else tool_replies.openai_calls)(body)
        if calls:
            samples, stopped_by = [("", "tool_calls")] * len(samples), [None] * len(samples)
        reply = cls(samples, prompt_words + 1, body.get("model") or model, logprobs, calls)
        reply.stopped_by = stopped_by
        if prompt_cache is not None and (anthropic or messages is not None):
            use = prompt_cache.anthropic(body) if anthropic else prompt_cache.openai(body)
            reply.cache = use
            reply.prompt_tokens = max(reply.prompt_tokens, use.read + use.written + 1)
        if anthropic:
            reply.thinking = reasoning_replies.anthropic_thinking(body, last_user)
            if reply.thinking is not None:
                reply.thinking_blocks = reasoning_replies.anthropic_blocks(
                    reply.thinking, last_user
                )
        else:
            reply.thinking = reasoning_replies.openai_thinking(body, reasoning, last_user)
            reply.style, reply.shown = reasoning, reasoning_replies.shows_thoughts(body, reasoning)
        return reply

    @property
    def thinking_words(self) -> int:
        return len(self.thinking.split()) if self.thinking is not None else 0

    def _usage(self) -> dict[str, Any]:
        thought = self.thinking_words * len(self.samples)
        out = sum(len(text.split()) for text, _ in self.samples) + thought
        usage: dict[str, Any] = {"prompt_tokens": self.prompt_tokens, "completion_tokens": out,
                                 "total_tokens": self.prompt_tokens + out}  # fmt: skip
        if self.thinking is not None:
            usage["completion_tokens_details"] = {"reasoning_tokens": thought}
        if self.cache.read:
            usage["prompt_tokens_details"] = {"cached_tokens": self.cache.read}
        return usage

    def _message(self, text: str) -> dict[str, Any]:
        """A chat reply's message, its thinking written the way `style` writes it."""
        if self.calls:
            message = {"role": "assistant", "content": None, "tool_calls": self.calls}
        else:
            message = {"role": "assistant", "content": text}
        if self.thinking is not None and self.shown:
            if self.style == "gemini":
                message["content"] = f"<thought>{self.thinking}</thought>{text}"
            else:
                message[self.style] = self.thinking
        return message

    def _logprobs(self, text: str) -> dict[str, Any] | None:
        if self.logprobs is None:
            return None
        tokens = [w if i == 0 else " " + w for i, w in enumerate(text.split(" "))]
        return {"content": [
            {"token": t, "logprob": -0.25, "bytes": None,
             "top_logprobs": [{"token": t, "logprob": -0.25, "bytes": None}][: self.logprobs]}
            for t in tokens
        ]}  # fmt: skip

    def openai(self, path: str) -> dict[str, Any]:
        if path.endswith("/completions") and not path.endswith("chat/completions"):
            choices = [{"index": i, "text": text, "finish_reason": finish, "logprobs": None}
                       for i, (text, finish) in enumerate(self.samples)]  # fmt: skip
            kind = "text_completion"
        else:
            choices = [
                {"index": i, "message": self._message(text),
                 "finish_reason": finish, "logprobs": self._logprobs(text)}
                for i, (text, finish) in enumerate(self.samples)
            ]  # fmt: skip
            kind = "chat.completion"
        for choice, stopped in zip(choices, self.stopped_by, strict=True):
            if stopped is not None:  # vLLM's extension field, beside finish_reason
                choice["stop_reason"] = stopped
        return {"id": "cmpl-test", "object": kind, "created": int(time.time()),
                "model": self.model, "choices": choices, "usage": self._usage()}  # fmt: skip

    def openai_chunks(self, body: dict[str, Any]) -> list[bytes]:
        chat = "messages" in body
        base = {"id": "cmpl-test", "object": "chat.completion.chunk" if chat else "text_completion",
                "created": int(time.time()), "model": self.model}  # fmt: skip
        events = []

        def chunk(choices: list[dict[str, Any]], usage: dict[str, int] | None = None) -> None:
            events.append(b"data: " + json.dumps({**base, "choices": choices,
                                                  "usage": usage}).encode() + b"\n\n")  # fmt: skip

        for i, (text, finish) in enumerate(self.samples):
            if chat:
                chunk([{"index": i, "delta": {"role": "assistant", "content": ""},
                        "finish_reason": None}])  # fmt: skip
                for delta in self._thinking_deltas():  # the thinking streams first
                    chunk([{"index": i, "delta": delta, "finish_reason": None}])
            for j, call in enumerate(self.calls or ()):  # as OpenAI streams a call
                function = call["function"]
                head = {"index": j, "id": call["id"], "type": "function",
                        "function": {"name": function["name"], "arguments": ""}}  # fmt: skip
                chunk([{"index": i, "delta": {"tool_calls": [head]}, "finish_reason": None}])
                for k in range(0, len(function["arguments"]), 8):
                    part = {"index": j, "function": {"arguments": function["arguments"][k : k + 8]}}
                    chunk([{"index": i, "delta": {"tool_calls": [part]}, "finish_reason": None}])
            for j, word in enumerate(text.split(" ") if not self.calls else ()):
                piece = word if j == 0 else " " + word
                if chat:
                    lp = self._logprobs(word)
                    if lp is not None:
                        lp["content"][0]["token"] = piece
                    chunk([{"index": i, "delta": {"content": piece}, "finish_reason": None,
                            "logprobs": lp}])  # fmt: skip
                else:
                    chunk([{"index": i, "text": piece, "finish_reason": None}])
            end = {"index": i, "finish_reason": finish}
            if self.stopped_by[i] is not None:
                end["stop_reason"] = self.stopped_by[i]
            chunk([{**end, "delta": {}} if chat else {**end, "text": ""}])
        if (body.get("stream_options") or {}).get("include_usage"):
            chunk([], self._usage())
        events.append(b"data: [DONE]\n\n")
        return events

    def _thinking_deltas(self) -> list[dict[str, Any]]:
        """The thinking as stream deltas: word by word in its own field, or for Gemini the
        tagged thoughts as content in pieces of 5 characters, so that a tag arrives split."""
        if self.thinking is None or not self.shown:
            return []
        if self.style == "gemini":
            tagged = f"<thought>{self.thinking}</thought>"
            return [{"content": tagged[k : k + 5]} for k in range(0, len(tagged), 5)]
        words = self.thinking.split(" ")
        return [{self.style: w if j == 0 else " " + w} for j, w in enumerate(words)]

    def _anthropic_usage(self, text: str) -> dict[str, Any]:
        usage: dict[str, Any] = {"output_tokens": len(text.split()) + self.thinking_words}
        if self.thinking is not None:
            usage["output_tokens_details"] = {"thinking_tokens": self.thinking_words}
        return usage

    def _anthropic_stop(self) -> str:
        if self.stopped_by[0] is not None:
            return "stop_sequence"
        return _ANTHROPIC_STOP[self.samples[0][1]]

    def anthropic(self) -> dict[str, Any]:
        text, finish = self.samples[0]
        content = (self.thinking_blocks or []) + (self.calls or [{"type": "text", "text": text}])
        return {"id": "msg_test", "type": "message", "role": "assistant", "model": self.model,
                "content": content,
                "stop_reason": self._anthropic_stop(), "stop_sequence": self.stopped_by[0],
                "usage": {**self._anthropic_input(),
                          **self._anthropic_usage(text)}}  # fmt: skip

    def _anthropic_input(self) -> dict[str, int]:
        """The input's usage: apart from what was read from or written to the prompt cache."""
        read, written = self.cache.read, self.cache.written
        usage = {"input_tokens": self.prompt_tokens - read - written}
        if read or written:
            usage.update(cache_creation_input_tokens=written, cache_read_input_tokens=read)
        return usage

    def anthropic_events(self) -> list[bytes]:
        text, finish = self.samples[0]
        start = self.anthropic()
        start.update(content=[], stop_reason=None)
        start["usage"] = {**self._anthropic_input(), "output_tokens": 1}
        events = [("message_start", {"type": "message_start", "message": start})]
        blocks = self.thinking_blocks or []
        events += reasoning_replies.anthropic_thinking_events(blocks)  # the thinking first
        at = len(blocks)  # the answer's block index
        if self.calls:  # a tool_use block, its input streamed as JSON pieces
            events += tool_replies.anthropic_call_events(self.calls, at)
        else:
            events.append(("content_block_start", {"type": "content_block_start", "index": at,
                                                   "content_block": {"type": "text", "text": ""}}))  # fmt: skip
        events.append(("ping", {"type": "ping"}))
        for j, word in enumerate(text.split(" ") if not self.calls else ()):
            piece = word if j == 0 else " " + word
            events.append(("content_block_delta", {"type": "content_block_delta", "index": at,
                           "delta": {"type": "text_delta", "text": piece}}))  # fmt: skip
        events += [
            ("content_block_stop", {"type": "content_block_stop", "index": at}),
            ("message_delta", {"type": "message_delta",
                               "delta": {"stop_reason": self._anthropic_stop(),
                                         "stop_sequence": self.stopped_by[0]},
                               "usage": self._anthropic_usage(text)}),
            ("message_stop", {"type": "message_stop"}),
        ]  # fmt: skip
        return [f"event: {name}\ndata: {json.dumps(data)}\n\n".encode() for name, data in events]


_ANTHROPIC_STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""
