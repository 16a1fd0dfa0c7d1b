"""Tool calling's vocabulary, checked once for every front: the tools a request offers (OpenAI's
function tools), its `tool_choice`, and the `tool_calls` of an assistant message.

Batch rows, OpenAI Batch lines, serve's bodies and chat's /load all read these through here, so
a tool definition means the same wherever it comes from; each front turns `ToolError` into its
own kind of refusal (a failed row, an HTTP 400). The shapes are OpenAI's, which Oumi writes too:

    tools:        [{"type": "function", "function": {"name", "description"?, "parameters"?}}]
    tool_choice:  "auto" | "none" | "required" | {"type": "function", "function": {"name"}}
    tool_calls:   [{"id", "type": "function", "function": {"name", "arguments": "<JSON>"}}]
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal, get_args

from lmpress.vocabulary.types import Request, ToolCall

# tool_choice as a word (a named function is the other form).
ToolChoiceMode = Literal["auto", "none", "required"]
TOOL_CHOICES: tuple[ToolChoiceMode, ...] = get_args(ToolChoiceMode)
# OpenAI's rule for a function's name, which every provider lmpress speaks to accepts.
NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
FUNCTION_KEYS = frozenset({"name", "description", "parameters", "strict"})


class ToolError(ValueError):
    """A tool definition, tool_choice or tool call that is malformed; the message names it."""


def check_tools(value: Any, where: str = "tools") -> list[dict[str, Any]] | None:
    """OpenAI function tools, checked; None for none (an empty list offers nothing)."""
    if value is None or value == []:
        return None
    if not isinstance(value, list):
        raise ToolError(f"'{where}' must be a list of function tools")
    names: set[str] = set()
    for i, tool in enumerate(value):
        at = f"{where}[{i}]"
        if not isinstance(tool, dict) or tool.get("type", "function") != "function":
            raise ToolError(f"'{at}' must be an object with type 'function'")
        function = tool.get("function")
        if not isinstance(function, dict):
            raise ToolError(f"'{at}.function' must be an object with a 'name'")
        unknown = sorted(set(function) - FUNCTION_KEYS)
        if unknown:
            raise ToolError(f"'{at}.function' has unknown key '{unknown[0]}'")
        name = function.get("name")
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise ToolError(
                f"'{at}.function.name' must be 1 to 64 letters, digits, '_' or '-', "
                f"got {json.dumps(name)}"
            )
        if name in names:
            raise ToolError(f"'{at}.function.name': '{name}' is offered twice")
        names.add(name)
        parameters = function.get("parameters")
        if parameters is not None and (
            not isinstance(parameters, dict) or parameters.get("type", "object") != "object"
        ):
            raise ToolError(f"'{at}.function.parameters' must be a JSON Schema of an object")
        if not isinstance(function.get("description", ""), str):
            raise ToolError(f"'{at}.function.description' must be a string")
    return [{"type": "function", "function": dict(tool["function"])} for tool in value]


def check_tool_choice(
    value: Any, tools: list[dict[str, Any]] | None, where: str = "tool_choice"
) -> str | dict[str, Any] | None:
    """A tool_choice, checked against the tools it chooses among."""
    if value is None:
        return None
    if isinstance(value, str):
        if value not in TOOL_CHOICES:
            raise ToolError(
                f"'{where}' must be one of {', '.join(TOOL_CHOICES)} or a named function, "
                f"got {json.dumps(value)}"
            )
        if value == "required" and not tools:
            raise ToolError(f"'{where}': 'required' needs tools to choose from")
        return value
    name = chosen_name(value)
    if name is None:
        raise ToolError(
            f"'{where}' must be one of {', '.join(TOOL_CHOICES)} or "
            f'{{"type": "function", "function": {{"name": ...}}}}'
        )
    if name not in tool_names(tools):
        raise ToolError(f"'{where}' names function '{name}', which is not among the tools")
    return {"type": "function", "function": {"name": name}}


def chosen_name(tool_choice: Any) -> str | None:
    """The function a named tool_choice forces, or None for a string choice."""
    if not isinstance(tool_choice, dict) or tool_choice.get("type", "function") != "function":
        return None
    function = tool_choice.get("function")
    name = function.get("name") if isinstance(function, dict) else None
    return name if isinstance(name, str) and name else None


def tool_names(tools: list[dict[str, Any]] | None) -> list[str]:
    return [tool["function"]["name"] for tool in tools or ()]


def parse_tool_calls(value: Any, where: str) -> list[ToolCall] | None:
    """An assistant message's tool_calls, as OpenAI and Oumi write them (Oumi also takes the
    arguments as an object, written out as JSON here)."""
    if value is None or value == []:
        return None
    if not isinstance(value, list):
        raise ToolError(f"'{where}' must be a list of tool calls")
    calls = []
    for i, item in enumerate(value):
        at = f"{where}[{i}]"
        function = item.get("function") if isinstance(item, dict) else None
        if not isinstance(function, dict) or item.get("type", "function") != "function":
            raise ToolError(f"'{at}' must be a function call with a 'function' object")
        call_id, name = item.get("id"), function.get("name")
        if not isinstance(call_id, str) or not call_id:
            raise ToolError(f"'{at}.id' must be a non-empty string")
        if not isinstance(name, str) or not name:
            raise ToolError(f"'{at}.function.name' must be a non-empty string")
        arguments = function.get("arguments", "{}")
        if isinstance(arguments, (dict, list)):
            arguments = json.dumps(arguments, ensure_ascii=False)
        if not isinstance(arguments, str):
            raise ToolError(f"'{at}.function.arguments' must be JSON text or an object")
        calls.append(ToolCall(call_id, name, arguments))
    return calls


def uses_tools(request: Request) -> bool:
    """Whether a request needs an engine that takes tools: it offers some, or its
    conversation holds calls made earlier."""
    return bool(request.tools) or any(m.tool_calls for m in request.messages)


def check_request(request: Request) -> None:
    """Refuse malformed tools (a Request made in Python comes through no front's checks), and
    a tool_choice that does not fit them. Without tools a tool_choice means nothing and is not
    sent, so a recipe's tool_choice leaves rows without tools alone."""
    if request.tools:
        check_tools(request.tools)
        check_tool_choice(request.params.tool_choice, request.tools, "generation.tool_choice")
