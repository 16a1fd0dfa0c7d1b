"""The Anthropic Messages API wire format, as `lmpress serve` answers it (`/v1/messages`,
`/v1/messages/count_tokens`): request bodies the way in, message bodies, stream events and
errors the way out. The other direction, lmpress sending to Anthropic, is `client`'s.

A body is checked by strict pydantic models (an unknown argument or a wrong type is refused,
naming it, as the OpenAI bodies are), then turned into lmpress Messages and a `Sampling` (the
OpenAI bodies' record of overrides, which remembers the argument each came from), so the
server's checks of params and tools name what the client sent. Anthropic's shapes map onto
OpenAI's, which lmpress speaks inside: `system` is a system message, `tool_use` blocks an
assistant turn's tool calls, each `tool_result` block a tool message, an image block's source
a data: or http(s) URL, `tools[].input_schema` a function's parameters, tool_choice `any` is
`required`. Thinking: `{type: enabled, budget_tokens: N}` bounds the thinking at N tokens,
`{type: disabled}` is reasoning_effort none on a model that thinks; the reply's thinking is a
`thinking` block before the text, with an opaque signature (the SDK expects one; lmpress
checks none when the block comes back).

Nothing here imports the `anthropic` package: the server answers without it.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from lmpress.vocabulary.tools import ToolError, check_tool_choice, check_tools
from lmpress.vocabulary.types import ContentPart, FinishReason, Message, Result, ToolCall
from lmpress.wire.openai.errors import ApiError
from lmpress.wire.openai.requests import Sampling

MESSAGES_PATH = "/v1/messages"
COUNT_TOKENS_PATH = "/v1/messages/count_tokens"

# What a thinking block carries as its signature: Anthropic's SDK reads one, and a client sends
# it back with the block; lmpress signs nothing, so it is the same opaque text every time.
SIGNATURE = "lmpress-unsigned"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class ThinkingConfig(_Strict):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = None


class ToolChoice(_Strict):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class Tool(_Strict):
    """A client tool (the server tools, web search and the like, are Anthropic's own)."""

    name: str
    input_schema: dict[str, Any]
    description: str | None = None
    type: Literal["custom"] | None = None
    cache_control: dict[str, Any] | None = None  # accepted; nothing is cached
    strict: bool | None = None  # accepted; forced calls follow the schema anyway


class MessageParam(_Strict):
    role: Literal["user", "assistant"]
    content: str | list[dict[str, Any]]


class CountTokensBody(_Strict):
    """What `/v1/messages/count_tokens` takes: the prompt side of a Messages body."""

    model: str
    messages: list[MessageParam]
    system: str | list[dict[str, Any]] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None


class MessagesBody(CountTokensBody):
    max_tokens: int
    stop_sequences: list[str] | None = None
    stream: bool | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    metadata: dict[str, Any] | None = None  # accepted; it changes nothing here
    service_tier: str | None = None  # accepted; it changes nothing here


# --- the way in ------------------------------------------------------------------------------


def _refuse(where: str, why: str) -> ApiError:
    return ApiError(400, f"{where}: {why}", param=where.split(".")[0].split("[")[0])


def request_messages(body: CountTokensBody) -> list[Message]:
    """The conversation as lmpress Messages: the system prompt first, each tool_result block
    a tool message, in the order the blocks come."""
    out: list[Message] = []
    system = _system_text(body.system)
    if system:
        out.append(Message("system", system))
    if not body.messages:
        raise _refuse("messages", "must hold at least one message")
    for i, turn in enumerate(body.messages):
        where = f"messages[{i}]"
        if turn.role == "assistant":
            out.append(_assistant(turn.content, where))
        else:
            out.extend(_user(turn.content, where))
    if body.messages[-1].role == "assistant":
        raise _refuse(
            f"messages[{len(body.messages) - 1}]",
            "a final assistant turn (a prefill to continue) is not supported; end with a user turn",
        )
    return out


def _system_text(system: str | list[dict[str, Any]] | None) -> str:
    if system is None or isinstance(system, str):
        return system or ""
    texts = []
    for i, block in enumerate(system):
        if block.get("type") != "text" or not isinstance(block.get("text"), str):
            raise _refuse(f"system[{i}]", "a system block must be a text block")
        texts.append(block["text"])
    return "\n\n".join(texts)


def _user(content: str | list[dict[str, Any]], where: str) -> list[Message]:
    if isinstance(content, str):
        return [Message("user", content)]
    out: list[Message] = []
    parts: list[ContentPart] = []
    for j, block in enumerate(content):
        at = f"{where}.content[{j}]"
        if block.get("type") == "tool_result":
            if parts:  # text before a result: its own user turn, in order
                out.append(Message("user", parts))
                parts = []
            out.append(_tool_result(block, at))
        else:
            parts.append(_part(block, at))
    if parts:
        out.append(Message("user", parts))
    return out


def _tool_result(block: dict[str, Any], where: str) -> Message:
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str) or not call_id:
        raise _refuse(f"{where}.tool_use_id", "a tool_result block must name its tool_use_id")
    content = block.get("content", "")
    if isinstance(content, list):
        content = [_part(b, f"{where}.content[{k}]") for k, b in enumerate(content)]
    elif not isinstance(content, str):
        raise _refuse(f"{where}.content", "must be a string or a list of content blocks")
    return Message("tool", content, tool_call_id=call_id)


def _part(block: dict[str, Any], where: str) -> ContentPart:
    kind = block.get("type")
    if kind == "text":
        if not isinstance(block.get("text"), str):
            raise _refuse(f"{where}.text", "a text block's text must be a string")
        return ContentPart("text", text=block["text"])
    if kind == "image":
        return ContentPart("image_url", image_url=_image_url(block.get("source"), where))
    raise _refuse(
        f"{where}.type", f"{json.dumps(kind)} blocks are not supported here (text, image)"
    )


def _image_url(source: Any, where: str) -> str:
    """An image block's source as the URL lmpress reads: a data: URL, or http(s) (never a
    file of the server's own machine)."""
    kind = source.get("type") if isinstance(source, dict) else None
    if kind == "base64":
        media, data = source.get("media_type"), source.get("data")
        if not isinstance(media, str) or not isinstance(data, str):
            raise _refuse(f"{where}.source", "a base64 source needs media_type and data")
        return f"data:{media};base64,{data}"
    if kind == "url":
        url = source.get("url")
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise _refuse(f"{where}.source.url", "must be an http(s) URL")
        return url
    raise _refuse(f"{where}.source.type", "must be base64 or url")


def _assistant(content: str | list[dict[str, Any]], where: str) -> Message:
    if isinstance(content, str):
        return Message("assistant", content)
    texts, calls, thinking = [], [], []
    for j, block in enumerate(content):
        at = f"{where}.content[{j}]"
        kind = block.get("type")
        if kind == "text":
            texts.append(_part(block, at).text or "")
        elif kind == "tool_use":
            if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
                raise _refuse(at, "a tool_use block needs an id and a name")
            arguments = json.dumps(block.get("input") or {}, ensure_ascii=False)
            calls.append(ToolCall(block["id"], block["name"], arguments))
        elif kind in ("thinking", "redacted_thinking"):
            thinking.append(block)
        else:
            raise _refuse(f"{at}.type", f"{json.dumps(kind)} is not an assistant block here")
    message = Message("assistant", "".join(texts), tool_calls=calls or None)
    if thinking:
        message.reasoning = "\n\n".join(str(b.get("thinking", "")) for b in thinking)
        # Blocks lmpress signed itself carry nothing a provider could check: only a provider's
        # own blocks (its signatures, its redacted thinking) go back to it whole.
        signed = [b for b in thinking if b.get("signature") != SIGNATURE]
        message.reasoning_details = signed or None
    return message


def request_tools(body: CountTokensBody, sampling: Sampling) -> None:
    """The body's tools in OpenAI's form (checked as chat completions checks them) and its
    tool_choice, onto `sampling`."""
    offered = [
        {"type": "function", "function": {"name": t.name, "parameters": t.input_schema,
                                          **({"description": t.description}
                                             if t.description else {})}}
        for t in body.tools or ()
    ]  # fmt: skip
    try:
        sampling.tools = check_tools(offered, "tools")
    except ToolError as exc:
        raise ApiError(400, str(exc).replace(".function.parameters", ".input_schema")
                       .replace(".function.", "."), param="tools") from None  # fmt: skip
    choice = body.tool_choice
    if choice is None:
        return
    if choice.type == "tool" and not choice.name:
        raise _refuse("tool_choice.name", "a tool_choice of type tool must name the tool")
    wanted: Any = {
        "auto": "auto", "any": "required", "none": "none",
        "tool": {"type": "function", "function": {"name": choice.name}},
    }[choice.type]  # fmt: skip
    try:
        if choice.type != "none" and not sampling.tools:
            raise ToolError("'tool_choice' needs 'tools' to choose from")
        checked = check_tool_choice(wanted, sampling.tools, "tool_choice")
    except ToolError as exc:
        raise ApiError(400, str(exc).replace("function '", "tool '"), param="tool_choice") from None
    if checked is not None:
        sampling.set("tool_choice", checked, "tool_choice")
    if choice.disable_parallel_tool_use:
        sampling.set("parallel_tool_calls", False, "tool_choice.disable_parallel_tool_use")


def request_sampling(body: CountTokensBody, thinks: bool) -> Sampling:
    """The body's generation settings and tools. `thinks`: the served model reasons, so
    thinking disabled turns its thinking off (elsewhere it asks for what already is)."""
    sampling = Sampling()
    if isinstance(body, MessagesBody):
        if body.max_tokens < 1:  # Anthropic's API has no reply of nothing (scoring is OpenAI's)
            raise _refuse("max_tokens", "must be at least 1")
        sampling.set("max_new_tokens", body.max_tokens, "max_tokens")
        for name in ("temperature", "top_p", "top_k"):
            value = getattr(body, name)
            if value is not None:
                sampling.set(name, value, name)
        if body.stop_sequences:
            if not all(body.stop_sequences):
                raise _refuse("stop_sequences", "an empty stop sequence would stop at once")
            sampling.set("stop_strings", list(body.stop_sequences), "stop_sequences")
    thinking = body.thinking
    if thinking is not None and thinking.type == "enabled":
        if thinking.budget_tokens is None:
            raise _refuse("thinking.budget_tokens", "thinking of type enabled needs a budget")
        sampling.set("max_reasoning_tokens", thinking.budget_tokens, "thinking.budget_tokens")
    elif thinking is not None and thinking.type == "disabled" and thinks:
        sampling.set("reasoning_effort", "none", "thinking")
    request_tools(body, sampling)
    return sampling


# --- the way out -----------------------------------------------------------------------------

StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use", "refusal"]

# lmpress's finish reasons as Anthropic's stop reasons; a "stop" that a stop string caused
# (Sample.stop_sequence) is `stop_sequence` instead (see `stop_reason`). A request cancelled
# or failed midway is never answered with a body, so those two only need a value.
STOP_REASONS: dict[FinishReason, StopReason] = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "content_filter": "refusal",
    "cancelled": "end_turn",
    "error": "end_turn",
}


def stop_reason(result: Result) -> StopReason:
    if stop_sequence(result) is not None:
        return "stop_sequence"
    finish = result.finish_reason
    return STOP_REASONS.get(finish, "end_turn") if finish else "end_turn"


def stop_sequence(result: Result) -> str | None:
    """The stop string that ended the reply, as the Messages API's `stop_sequence`."""
    if result.finish_reason != "stop" or not result.samples:
        return None
    return result.samples[0].stop_sequence


def usage(result: Result) -> dict[str, int]:
    return {
        "input_tokens": result.usage.prompt_tokens,
        "output_tokens": result.usage.completion_tokens,
    }


def thinking_block(text: str) -> dict[str, Any]:
    return {"type": "thinking", "thinking": text, "signature": SIGNATURE}


def tool_use_block(call: ToolCall) -> dict[str, Any]:
    try:
        arguments = json.loads(call.arguments or "{}")
    except ValueError:
        arguments = {}
    return {"type": "tool_use", "id": call.id, "name": call.name, "input": arguments}


def message_body(id: str, model: str, result: Result) -> dict[str, Any]:
    """A Messages API message for a Result: its thinking, its text, its tool calls."""
    sample = result.samples[0]
    content: list[dict[str, Any]] = []
    if sample.reasoning_details:  # a provider's own blocks (ANTHROPIC behind serve), whole
        content.extend(sample.reasoning_details)
    elif sample.reasoning:  # as a stream has it: no thinking streamed, no block
        content.append(thinking_block(sample.reasoning))
    if sample.text or not sample.tool_calls:
        content.append({"type": "text", "text": sample.text})
    content.extend(tool_use_block(call) for call in sample.tool_calls or ())
    return {
        "id": id, "type": "message", "role": "assistant", "model": model, "content": content,
        "stop_reason": stop_reason(result), "stop_sequence": stop_sequence(result),
        "usage": usage(result),
    }  # fmt: skip


def event(data: dict[str, Any]) -> bytes:
    """One server-sent event, named by its type as the Messages API names them."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"event: {data['type']}\ndata: {text}\n\n".encode()


# Anthropic's error types by HTTP status.
ERROR_TYPES = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
    404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
    503: "overloaded_error", 529: "overloaded_error",
}  # fmt: skip


class AnthropicError(ApiError):
    """An ApiError answered in Anthropic's shape: {"type": "error", "error": {type, message}}."""

    def body(self) -> dict[str, Any]:
        kind = ERROR_TYPES.get(self.status, "api_error" if self.status >= 500 else
                               "invalid_request_error")  # fmt: skip
        return {"type": "error", "error": {"type": kind, "message": self.message}}


def anthropic_error(error: ApiError) -> AnthropicError:
    if isinstance(error, AnthropicError):
        return error
    return AnthropicError(error.status, error.message, headers=error.headers)
