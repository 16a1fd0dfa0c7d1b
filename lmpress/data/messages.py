"""OpenAI chat messages (and Oumi's) to lmpress Messages: what every front that reads a
conversation shares (batch rows, OpenAI Batch lines, serve's bodies, infer, chat's /load).
`RowError` is what they raise: one line saying what is wrong with the row or body.

An earlier assistant turn's thinking comes as `reasoning_content` (DeepSeek's and vLLM's name,
and the field of Oumi's `Message`) or `reasoning` (vLLM's current name) and goes to
`Message.reasoning`; each engine sends it back as its provider or template wants. Anthropic's
signed thinking blocks come as the turn's `reasoning_details` (what lmpress writes in a row's
`response`) or as `thinking` / `redacted_thinking` parts of its content, and go whole to
`Message.reasoning_details`, their text to `Message.reasoning`."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

from lmpress.vocabulary.images import sniff_media_type
from lmpress.vocabulary.tools import ToolError, parse_tool_calls
from lmpress.vocabulary.types import ROLES, ContentPart, Message


class RowError(ValueError):
    """A row that cannot be turned into a request; the message says what is wrong."""


def parse_messages(items: Any) -> list[Message]:
    """OpenAI chat messages (or Oumi's, whose content items say `content` for `text`)."""
    if not isinstance(items, list):
        raise RowError(f"'messages' must be a list, got {json_type(items)}")
    if not items:
        raise RowError("'messages' is empty")
    messages = []
    for i, item in enumerate(items, start=1):
        if not isinstance(item, dict):
            raise RowError(f"message {i} must be an object, got {json_type(item)}")
        role = item.get("role")
        if role not in ROLES:
            raise RowError(
                f"message {i} has unknown role {json.dumps(role)} "
                f"(expected one of {', '.join(ROLES)})"
            )
        content, blocks = _thinking_parts(item.get("content"), role)
        message = Message(role, _parse_content(content, i))
        message.reasoning = _reasoning(item, role, i)
        message.reasoning_details = _reasoning_details(item, role, i, blocks)
        if message.reasoning is None and message.reasoning_details:
            texts = [b["thinking"] for b in message.reasoning_details if "thinking" in b]
            message.reasoning = "\n\n".join(t for t in texts if isinstance(t, str))
        messages.append(_tool_fields(message, item, i))
    return messages


THINKING_PARTS = ("thinking", "redacted_thinking")  # Anthropic's content blocks of thinking


def _thinking_parts(content: Any, role: str) -> tuple[Any, list[dict[str, Any]]]:
    """An assistant turn's content without its Anthropic thinking blocks, and those blocks."""
    if role != "assistant" or not isinstance(content, list):
        return content, []
    blocks = [p for p in content if isinstance(p, dict) and p.get("type") in THINKING_PARTS]
    if not blocks:
        return content, []
    rest = [p for p in content if not (isinstance(p, dict) and p.get("type") in THINKING_PARTS)]
    return rest, blocks


def _reasoning_details(
    item: dict[str, Any], role: str, index: int, blocks: list[dict[str, Any]]
) -> list[dict[str, Any]] | None:
    details = item.get("reasoning_details")
    if details is None:
        return blocks or None
    if role != "assistant":
        raise RowError(
            f"message {index} has reasoning_details, which only an assistant message may have"
        )
    if not isinstance(details, list) or not all(isinstance(d, dict) for d in details):
        raise RowError(f"message {index} reasoning_details must be a list of objects")
    return [*details, *blocks] or None


REASONING_KEYS = ("reasoning_content", "reasoning")


def _reasoning(item: dict[str, Any], role: str, index: int) -> str | None:
    """An assistant turn's thinking, under either name (both: the same text)."""
    given = {key: item[key] for key in REASONING_KEYS if item.get(key) is not None}
    for key, value in given.items():
        if not isinstance(value, str):
            raise RowError(f"message {index} {key} must be a string, got {json_type(value)}")
        if role != "assistant":
            raise RowError(f"message {index} has {key}, which only an assistant message may have")
    if len(set(given.values())) > 1:
        raise RowError(f"message {index} has reasoning_content and reasoning that differ")
    return next(iter(given.values()), None)


def _tool_fields(message: Message, item: dict[str, Any], index: int) -> Message:
    """An assistant turn's earlier tool calls, and the call a tool turn answers."""
    try:
        message.tool_calls = parse_tool_calls(item.get("tool_calls"), "tool_calls")
    except ToolError as exc:
        raise RowError(f"message {index}: {exc}") from None
    if message.tool_calls and message.role != "assistant":
        raise RowError(f"message {index} has tool_calls, which only an assistant message may have")
    call_id = item.get("tool_call_id")
    if call_id is not None:
        if message.role != "tool" or not isinstance(call_id, str):
            raise RowError(f"message {index} tool_call_id must be a string on a tool message")
        message.tool_call_id = call_id
    return message


def regenerate_last_turn(messages: list[Message]) -> list[Message]:
    """The conversation to generate from: a trailing assistant turn is dropped so that its
    reply is generated anew (what replaying a saved chat on another model means), in batch,
    serve and infer alike."""
    if len(messages) > 1 and messages[-1].role == "assistant":
        return messages[:-1]
    if messages and messages[-1].role == "assistant":
        raise RowError("the only message is the assistant's: there is nothing to reply to")
    return messages


def _parse_content(content: Any, index: int) -> str | list[ContentPart]:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise RowError(f"message {index} content must be a string or a list of parts")
    parts = []
    for part in content:
        if not isinstance(part, dict):
            raise RowError(f"message {index} has a content part that is not an object")
        kind = part.get("type")
        if kind == "text":
            text = part.get("text", part.get("content"))
            if not isinstance(text, str):
                raise RowError(f"message {index} has a text part without text")
            parts.append(ContentPart("text", text=text))
        elif kind in ("image_url", "image_path") and part.get("binary"):
            # Oumi may carry the loaded bytes beside the path or URL: they travel as they are.
            parts.append(ContentPart("image_url", image_url=_binary_image_url(part, index)))
        elif kind in ("image_url", "image_path"):
            url = part.get("image_url", part.get("content"))
            if isinstance(url, dict):
                url = url.get("url")
            if not isinstance(url, str) or not url:
                raise RowError(f"message {index} has an image part without a URL")
            if kind == "image_path" and not url.startswith(("file:", "data:", "http")):
                url = Path(url).expanduser().absolute().as_uri()
            parts.append(ContentPart("image_url", image_url=url))
        elif kind == "image_binary":
            parts.append(ContentPart("image_url", image_url=_binary_image_url(part, index)))
        else:
            raise RowError(
                f"message {index} has a content part of unknown type {json.dumps(kind)} "
                f"(expected text, image_url, image_path or image_binary)"
            )
    return parts


def _binary_image_url(part: dict[str, Any], index: int) -> str:
    """Oumi's image_binary item: the image's bytes, base64 in `binary`, as a data: URL."""
    data = part.get("binary")
    try:
        raw = base64.b64decode(data, validate=True) if isinstance(data, str) else b""
    except ValueError:
        raw = b""
    if not raw:
        raise RowError(f"message {index} has an image_binary part without base64 'binary'")
    return f"data:{sniff_media_type(raw) or 'image/png'};base64,{data}"


def json_type(value: Any) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
             int: "a number", float: "a number", type(None): "null"}  # fmt: skip
    return names.get(type(value), type(value).__name__)


def row_shape(raw: dict[str, Any], shapes: tuple[tuple[str, str], ...]) -> str:
    """What a row looks like, for an error saying it does not fit the run's task: the first
    of `shapes` ((key, name) pairs) whose key it has ("a chat row"), else its keys."""
    for key, name in shapes:
        if key in raw:
            return f"a {name} row"
    keys = ", ".join(sorted(raw)[:12]) or "none"
    return f"a row with keys {keys}"
