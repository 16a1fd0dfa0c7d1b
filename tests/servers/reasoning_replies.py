"""The loopback server's thinking: what its reasoning model thinks before it answers, written the
way each provider writes it, and the provider's rules on the bounds a request sets.

The thinking is `thinking_text(last user message)`, so a test can assert it exactly. One word is
one token, as in the answers (`replies`), and a budget cuts the thinking at that many words.

On chat completions `Faults.reasoning` says which provider the server plays (None: a model that
does not think):
- "reasoning_content": vLLM, SGLang, DeepSeek: the message's (and each delta's)
  `reasoning_content`, streamed before the content;
- "reasoning": the name newer vLLM and OpenRouter write;
- "hidden": OpenAI's o-series: no text, only `completion_tokens_details.reasoning_tokens`;
- "gemini": Gemini's compatibility layer: thought summaries at the head of the content in
  `<thought>` tags, only when `extra_body.google.thinking_config.include_thoughts` asks; a
  `thinking_budget` cuts them, 0 turns thinking off, and `reasoning_effort` beside a
  thinking_config is a 400, as Gemini answers.
Every style counts the thinking in `completion_tokens` and in its `reasoning_tokens`, and
`reasoning_effort: none` turns thinking off. None of them takes `reasoning_content` back in an
input message (the SDK's request type refuses it, as DeepSeek does).

On the Messages API the model thinks when `thinking` asks (enabled with a budget, or adaptive):
a `thinking` block with a signature the server can check when a later request sends the block
back (a wrong one is a 400), then, when the conversation asks for "redacted" thinking, a
`redacted_thinking` block. Its rules are the API's: budget_tokens of at least 1024 and below
max_tokens, no forced tool_choice with thinking on.
"""

from __future__ import annotations

import hashlib
from typing import Any

STYLES = ("reasoning_content", "reasoning", "hidden", "gemini")
MIN_BUDGET = 1024  # Anthropic's smallest budget_tokens
REDACTED_MARKER = "redacted"  # in the last user message: the reply adds a redacted_thinking block


def thinking_text(last_user: str) -> str:
    """What the server thinks before answering a conversation whose last user message is this."""
    digest = hashlib.sha256(last_user.encode("utf-8")).hexdigest()[:8]
    return " ".join([f"Thinking-{digest}", "about:", *last_user.split()[:6], "so", "answer."])


def signature(thinking: str) -> str:
    """The signature the server gives a thinking block, and checks when it comes back."""
    return "sig-" + hashlib.sha256(thinking.encode("utf-8")).hexdigest()[:24]


def redacted_data(thinking: str) -> str:
    return "enc-" + hashlib.sha256(("redacted " + thinking).encode("utf-8")).hexdigest()[:24]


def _cut(text: str, budget: int | None) -> str | None:
    if budget is not None and budget <= 0:
        return None
    words = text.split(" ")
    return " ".join(words[:budget]) if budget is not None else text


def _google_config(body: dict[str, Any]) -> dict[str, Any] | None:
    google = (body.get("extra_body") or {}).get("google") or {}
    return google.get("thinking_config")


def openai_thinking(body: dict[str, Any], style: str | None, last_user: str) -> str | None:
    """What the model thinks for a chat body, in `style`; None when it does not think."""
    if style is None or "messages" not in body or body.get("reasoning_effort") == "none":
        return None
    budget = None
    if style == "gemini":
        budget = (_google_config(body) or {}).get("thinking_budget")
    return _cut(thinking_text(last_user), budget)


def shows_thoughts(body: dict[str, Any], style: str | None) -> bool:
    """Whether the thinking's text goes out (OpenAI's never does; Gemini's when asked)."""
    if style == "gemini":
        return bool((_google_config(body) or {}).get("include_thoughts"))
    return style in ("reasoning_content", "reasoning")


def openai_problem(body: dict[str, Any], style: str | None) -> str | None:
    """The 400 a provider answers to its reasoning fields, or None."""
    if style == "gemini" and body.get("reasoning_effort") is not None and _google_config(body):
        return "reasoning_effort and thinking_config cannot be used together; found both"
    return None


def anthropic_thinking(body: dict[str, Any], last_user: str) -> str | None:
    """What the model thinks for a Messages body; None when `thinking` does not ask."""
    config = body.get("thinking") or {"type": "disabled"}
    if config["type"] not in ("enabled", "adaptive"):
        return None
    return _cut(thinking_text(last_user), config.get("budget_tokens"))


def anthropic_blocks(thinking: str, last_user: str) -> list[dict[str, Any]]:
    """The thinking blocks that open a reply: the thinking, then one redacted when asked."""
    blocks = [{"type": "thinking", "thinking": thinking, "signature": signature(thinking)}]
    if REDACTED_MARKER in last_user:
        blocks.append({"type": "redacted_thinking", "data": redacted_data(thinking)})
    return blocks


def anthropic_problem(body: dict[str, Any]) -> str | None:
    """What the Messages API answers 400 to about thinking, or None."""
    config = body.get("thinking") or {"type": "disabled"}
    if config["type"] == "enabled":
        budget = config.get("budget_tokens")
        if budget < MIN_BUDGET:
            return f"thinking.enabled.budget_tokens: must be greater than or equal to {MIN_BUDGET}"
        if budget >= body["max_tokens"]:
            return "`max_tokens` must be greater than `thinking.budget_tokens`"
    forced = (body.get("tool_choice") or {}).get("type") in ("any", "tool")
    if config["type"] in ("enabled", "adaptive") and forced:
        return "Thinking may not be enabled when tool_choice forces tool use."
    for message in body.get("messages") or ():
        content = message.get("content")
        for block in content if isinstance(content, list) else ():
            if block.get("type") == "thinking" and block["signature"] != signature(
                block["thinking"]
            ):
                return "messages: Invalid `signature` in `thinking` block"
    return None


def anthropic_thinking_events(blocks: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """The thinking blocks as the Messages API streams them, from index 0: a thinking block
    opened empty, its text in thinking_delta pieces and its signature in a signature_delta
    just before it closes; a redacted block whole in its start event."""
    events: list[tuple[str, dict[str, Any]]] = []
    for index, block in enumerate(blocks):

        def event(name: str, data: dict[str, Any], index: int = index) -> None:
            events.append((name, {"type": name, "index": index, **data}))

        if block["type"] == "redacted_thinking":
            event("content_block_start", {"content_block": block})
        else:
            event("content_block_start",
                  {"content_block": {"type": "thinking", "thinking": "", "signature": ""}})  # fmt: skip
            for j, word in enumerate(block["thinking"].split(" ")):
                piece = word if j == 0 else " " + word
                event(
                    "content_block_delta", {"delta": {"type": "thinking_delta", "thinking": piece}}
                )
            event("content_block_delta",
                  {"delta": {"type": "signature_delta", "signature": block["signature"]}})  # fmt: skip
        event("content_block_stop", {})
    return events
