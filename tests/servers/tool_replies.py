"""Tool calling on the loopback server's two wires: checking what a client sends as the real APIs
do, and the call the server makes back.

A request that offers tools (and does not say `none`) is answered with one call of the chosen
tool, or of the first one, with arguments built from its schema's required properties
(`arguments_for`), so a test knows the call it should get. A conversation whose last turn is a
tool's result is answered in words, as a model answers once it has the result.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")


def arguments_for(schema: dict[str, Any] | None) -> dict[str, Any]:
    """The arguments the server calls a function with: each required property a value of its
    type (an enum's first value, an integer's minimum or 1, ...)."""
    schema = schema or {}
    properties = schema.get("properties") or {}
    return {name: _value(properties.get(name) or {}) for name in schema.get("required") or ()}


def _value(schema: dict[str, Any]) -> Any:
    if schema.get("enum"):
        return schema["enum"][0]
    kind = schema.get("type")
    if kind == "string":
        return "value"
    if kind == "integer":
        return schema.get("minimum", 1)
    if kind == "number":
        return schema.get("minimum", 1.5)
    if kind == "boolean":
        return True
    if kind == "array":
        return [_value(schema["items"])] if isinstance(schema.get("items"), dict) else []
    if kind == "object":
        return arguments_for(schema)
    return None


def call_id(prefix: str, conversation: str) -> str:
    """A call's id, the same for the same conversation."""
    return f"{prefix}_{hashlib.sha256(conversation.encode()).hexdigest()[:16]}"


# --- OpenAI chat completions -----------------------------------------------------------------


def openai_problem(body: dict[str, Any]) -> str | None:
    """What OpenAI would answer 400 to in a body's tools, tool_choice and tool messages."""
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list) or not tools:
            return "tools: must be a non-empty array"
        for i, tool in enumerate(tools):
            function = tool.get("function") if isinstance(tool, dict) else None
            if not isinstance(function, dict) or tool.get("type") != "function":
                return f"tools[{i}]: must be a function tool with a 'function' object"
            if not NAME.fullmatch(str(function.get("name", ""))):
                return f"tools[{i}].function.name: invalid function name"
            parameters = function.get("parameters")
            if parameters is not None and (
                not isinstance(parameters, dict) or parameters.get("type") != "object"
            ):
                return f"tools[{i}].function.parameters: must be a JSON Schema object"
    for key in ("tool_choice", "parallel_tool_calls"):
        if key in body and tools is None:
            return f"{key}: only allowed when 'tools' are specified"
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name")
        if choice.get("type") != "function" or name not in _openai_names(tools):
            return f"tool_choice: no function named {name!r} among the tools"
    elif choice not in (None, "none", "auto", "required"):
        return f"tool_choice: invalid value {choice!r}"
    return _openai_messages_problem(body.get("messages") or [])


def _openai_names(tools: Any) -> list[str]:
    return [t["function"]["name"] for t in tools or ()]


def _openai_messages_problem(messages: list[Any]) -> str | None:
    open_calls: set[str] = set()
    for i, message in enumerate(messages):
        role = message.get("role")
        if role == "tool":
            if message.get("tool_call_id") not in open_calls:
                return (
                    f"messages[{i}]: messages with role 'tool' must be a response to a "
                    f"preceding message with 'tool_calls'"
                )
            open_calls.discard(message["tool_call_id"])
            continue
        if open_calls:
            return (
                f"messages[{i}]: an assistant message with 'tool_calls' must be followed by "
                f"tool messages responding to each 'tool_call_id' ({sorted(open_calls)})"
            )
        for j, call in enumerate(message.get("tool_calls") or ()):
            function = call.get("function") or {}
            if role != "assistant" or call.get("type") != "function" or not call.get("id"):
                return f"messages[{i}].tool_calls[{j}]: malformed tool call"
            if not isinstance(function.get("arguments"), str) or not function.get("name"):
                return f"messages[{i}].tool_calls[{j}].function: needs a name and arguments text"
            open_calls.add(call["id"])
    return None


def openai_calls(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The tool calls the server answers a chat body with, or None for words."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    messages = body.get("messages") or []
    if not tools or choice == "none" or (messages and messages[-1].get("role") == "tool"):
        return None
    name = choice["function"]["name"] if isinstance(choice, dict) else None
    function = next(t["function"] for t in tools if name in (None, t["function"]["name"]))
    arguments = json.dumps(arguments_for(function.get("parameters")))
    return [{"id": call_id("call", json.dumps(messages)), "type": "function",
             "function": {"name": function["name"], "arguments": arguments}}]  # fmt: skip


def tool_result_text(messages: list[Any]) -> str | None:
    """The text of the tool result a conversation ends with (either wire), or None."""
    if not messages:
        return None
    last = messages[-1]
    if last.get("role") == "tool":
        content = last.get("content")
        return content if isinstance(content, str) else json.dumps(content)
    content = last.get("content")
    if last.get("role") == "user" and isinstance(content, list):
        results = [b for b in content if isinstance(b, dict) and b.get("type") == "tool_result"]
        if results and len(results) == len(content):  # text after the results: a new question
            inner = results[-1].get("content")
            if isinstance(inner, list):
                return "".join(b.get("text", "") for b in inner if isinstance(b, dict))
            return str(inner)
    return None


# --- Anthropic Messages ------------------------------------------------------------------------


# A custom tool's fields lmpress may send (ToolParam declares more: strict, defer_loading...).
CUSTOM_TOOL_FIELDS = frozenset({"name", "description", "input_schema", "cache_control"})


def anthropic_problem(body: dict[str, Any]) -> str | None:
    """What the Messages API would answer 400 to in a body's tools, tool_choice and blocks."""
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            return "tools: Input should be a valid list"
        for i, tool in enumerate(tools):
            if not isinstance(tool, dict) or set(tool) - CUSTOM_TOOL_FIELDS:
                return f"tools.{i}: Extra inputs are not permitted"
            if not NAME.fullmatch(str(tool.get("name", ""))):
                return f"tools.{i}.name: String should match pattern '^[a-zA-Z0-9_-]{{1,64}}$'"
            schema = tool.get("input_schema")
            if not isinstance(schema, dict) or schema.get("type") != "object":
                return f"tools.{i}.input_schema.type: Input should be 'object'"
    choice = body.get("tool_choice")
    if choice is not None:
        if tools is None:
            return "tool_choice: may only be specified while providing tools"
        kind = choice.get("type") if isinstance(choice, dict) else None
        if kind not in ("auto", "any", "tool", "none"):
            return f"tool_choice.type: invalid value {kind!r}"
        if kind == "tool" and choice.get("name") not in [t["name"] for t in tools]:
            return f"tool_choice.name: no tool named {choice.get('name')!r}"
    return _anthropic_messages_problem(body.get("messages") or [])


def _anthropic_messages_problem(messages: list[Any]) -> str | None:
    uses: set[str] = set()
    for i, message in enumerate(messages):
        content = message.get("content")
        blocks = [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []
        results = [b.get("tool_use_id") for b in blocks if b.get("type") == "tool_result"]
        if uses and set(results) != uses:
            return (
                f"messages.{i}: `tool_use` ids were found without `tool_result` blocks "
                f"immediately after: {sorted(uses - set(results))}"
            )
        if results:
            if message.get("role") != "user" or set(results) - uses:
                return f"messages.{i}: unexpected `tool_use_id` found in `tool_result` blocks"
            firsts = [b.get("type") for b in blocks[: len(results)]]
            if any(kind != "tool_result" for kind in firsts):
                return f"messages.{i}: tool_result blocks must come first in the content"
        uses = set()
        for block in blocks:
            if block.get("type") == "tool_use":
                if message.get("role") != "assistant" or not isinstance(block.get("input"), dict):
                    return f"messages.{i}: a tool_use block needs an assistant turn and an input"
                uses.add(block.get("id"))
    if uses:
        return "messages: the last assistant turn's tool_use blocks have no tool_result"
    return None


def anthropic_calls(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The tool_use blocks the server answers a Messages body with, or None for words."""
    tools, choice = body.get("tools"), body.get("tool_choice") or {"type": "auto"}
    messages = body.get("messages") or []
    if not tools or choice["type"] == "none" or tool_result_text(messages) is not None:
        return None
    name = choice.get("name") if choice["type"] == "tool" else None
    tool = next(t for t in tools if name in (None, t["name"]))
    return [{"type": "tool_use", "id": call_id("toolu", json.dumps(messages)), "name": tool["name"],
             "input": arguments_for(tool["input_schema"])}]  # fmt: skip


def anthropic_call_events(
    calls: list[dict[str, Any]], index: int = 0
) -> list[tuple[str, dict[str, Any]]]:
    """A tool_use block as the Messages API streams it: opened with an empty input, then the
    input's JSON in pieces (one block, at `index`, which the caller closes)."""
    call = calls[0]
    opened = {**call, "input": {}}
    events = [("content_block_start",
               {"type": "content_block_start", "index": index, "content_block": opened})]  # fmt: skip
    text = json.dumps(call["input"])
    for k in range(0, len(text), 8):
        delta = {"type": "input_json_delta", "partial_json": text[k : k + 8]}
        events.append(("content_block_delta",
                       {"type": "content_block_delta", "index": index, "delta": delta}))  # fmt: skip
    return events
