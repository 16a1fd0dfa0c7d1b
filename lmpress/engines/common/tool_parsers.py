"""Tool calls on the local engines: tools into the prompt, calls out of the text.

A model that was trained to call tools writes its calls in its family's own form. `PARSERS`
reads each form back into `ToolCall`s:
- `hermes`: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (Hermes, Qwen 2.5 and 3,
  and what lmpress itself asks of a model whose chat template knows no tools);
- `llama3_json`: a bare `{"name": ..., "parameters": {...}}` object, after `<|python_tag|>` or
  alone (Llama 3.1 to 3.3);
- `mistral`: `[TOOL_CALLS]` followed by a JSON list of calls, or by `name{arguments}` pairs.

The parser comes from `model.tool_call_parser` (Oumi's and vLLM's field) or else from the marks
in the model's chat template. A template that renders no tools gets them in a system message
that asks for the hermes form.

With `tool_choice: required` or a named function, the reply is generated under a grammar that
admits only a well-formed call (`call_grammar`): the name is one of the tools and the arguments
follow that tool's JSON Schema, so even a small model writes a valid call.
"""

from __future__ import annotations

import dataclasses
import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from lmpress.vocabulary.types import Message, Request, Sample, ToolCall

PARSERS = ("hermes", "llama3_json", "mistral")

# The JSON written inside a constrained call: compact, as the parsers expect and as a small
# model cannot wander off into whitespace.
_COMPACT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def check_parser(explicit: str | None) -> str | None:
    """`model.tool_call_parser` checked when the engine loads."""
    from lmpress.vocabulary.errors import ConfigError

    try:
        parser_for(None, explicit)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    return explicit


def parser_for(chat_template: str | None, explicit: str | None = None) -> str:
    """The parser named by `model.tool_call_parser`, else the one the template's marks show."""
    if explicit:
        if explicit not in PARSERS:
            raise ValueError(
                f"model.tool_call_parser '{explicit}' is not one of {', '.join(PARSERS)}"
            )
        return explicit
    template = chat_template or ""
    if "[TOOL_CALLS]" in template:
        return "mistral"
    if "<|python_tag|>" in template or "ipython" in template:
        return "llama3_json"
    return "hermes"


def template_takes_tools(chat_template: str | None) -> bool:
    """Whether the chat template renders a `tools` argument."""
    return bool(chat_template) and re.search(r"\btools\b", chat_template) is not None


def tools_instruction(tools: list[dict[str, Any]]) -> str:
    """A system message that offers the tools, for a template that renders none."""
    listed = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools)
    return (
        "You may call one or more functions to assist with the user query. The functions are "
        f"listed as JSON within <tools></tools> tags:\n<tools>\n{listed}\n</tools>\n"
        "For each function call, return a JSON object with the function name and arguments "
        "within <tool_call></tool_call> tags:\n"
        '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )


@dataclass
class ToolPlan:
    """How one request's tools go into the prompt and its calls come back out."""

    parser: str
    messages: list[dict[str, Any]]  # the conversation as the chat template reads it
    tools: list[dict[str, Any]] | None  # for a template that renders tools itself
    grammar: str | None = None  # a call the reply must be (tool_choice required or named)

    def read(self, sample: Sample) -> Sample:
        """The sample with the calls its text makes, if it makes any."""
        if sample.finish_reason != "stop":  # a reply cut short stays text
            return sample
        content, calls = parse_tool_calls(sample.text, self.parser)
        if not calls:
            return sample
        return dataclasses.replace(
            sample, text=content, finish_reason="tool_calls", tool_calls=calls
        )


def plan_tools(request: Request, chat_template: str | None, parser: str | None) -> ToolPlan:
    """The prompt's messages and tools, and the grammar a required call follows. A template
    that renders tools gets them, and the turns that called tools as they are; any other gets
    the tools in a system message and earlier calls and replies written in the hermes form."""
    parser = parser_for(chat_template, parser)
    tool_choice = request.params.tool_choice
    offered = request.tools if request.tools and tool_choice != "none" else None
    native = template_takes_tools(chat_template)
    messages = [_template_message(m, native) for m in request.messages]
    if offered and not native:
        instruction = tools_instruction(offered)
        if messages and messages[0]["role"] == "system":
            messages[0] = {**messages[0], "content": f"{messages[0]['content']}\n\n{instruction}"}
        else:
            messages.insert(0, {"role": "system", "content": instruction})
    chosen = chosen_tools(offered, tool_choice) if offered else None
    grammar = call_grammar(chosen, parser) if chosen else None
    return ToolPlan(parser, messages, offered if native else None, grammar)


def tool_plan(request: Request, chat_template: str | None, parser: str | None) -> ToolPlan | None:
    """The request's tool plan, or None when it neither offers tools nor carries turns that
    called them."""
    return plan_tools(request, chat_template, parser) if wants_tool_plan(request) else None


def wants_tool_plan(request: Request) -> bool:
    """Whether a request offers tools or carries turns that called them."""
    return bool(request.tools) or any(m.tool_calls or m.role == "tool" for m in request.messages)


def _template_message(message: Message, native: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"role": message.role, "content": message.text()}
    if native:
        if message.tool_calls:
            out["tool_calls"] = [
                {"id": c.id, "type": "function",
                 "function": {"name": c.name, "arguments": json.loads(c.arguments)}}
                for c in message.tool_calls
            ]  # fmt: skip
        if message.tool_call_id is not None:
            out["tool_call_id"] = message.tool_call_id
        return out
    if message.tool_calls:
        calls = "\n".join(
            "<tool_call>\n"
            + json.dumps({"name": c.name, "arguments": json.loads(c.arguments)})
            + "\n</tool_call>"
            for c in message.tool_calls
        )
        out["content"] = f"{out['content']}\n{calls}".strip()
    if message.role == "tool":
        out = {"role": "user", "content": f"<tool_response>\n{out['content']}\n</tool_response>"}
    return out


def parse_tool_calls(text: str, parser: str) -> tuple[str, list[ToolCall]]:
    """The reply's plain text and the calls it makes; text that is not a well-formed call stays
    text, so a model that answers in words is not mistaken for one that called."""
    if parser == "hermes":
        return _parse_hermes(text)
    if parser == "llama3_json":
        return _parse_llama3(text)
    if parser == "mistral":
        return _parse_mistral(text)
    raise ValueError(f"unknown tool call parser '{parser}'")


def _call(obj: Any, arguments_key: str = "arguments") -> ToolCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    arguments = obj.get(arguments_key, obj.get("arguments", obj.get("parameters", {})))
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    if not isinstance(arguments, dict):
        return None
    return ToolCall(new_call_id(), obj["name"], json.dumps(arguments, ensure_ascii=False))


_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)


def _parse_hermes(text: str) -> tuple[str, list[ToolCall]]:
    calls = []
    for match in _HERMES.finditer(text):
        try:
            call = _call(json.loads(match.group(1)))
        except json.JSONDecodeError:
            call = None
        if call is None:
            return text, []
        calls.append(call)
    if not calls:
        return text, []
    return text[: text.index("<tool_call>")].strip(), calls


def _parse_llama3(text: str) -> tuple[str, list[ToolCall]]:
    body = text.split("<|python_tag|>", 1)[1] if "<|python_tag|>" in text else text
    body = body.strip()
    if not body.startswith("{"):
        return text, []
    calls = []
    for part in _json_values(body, separator=";"):
        call = _call(part, "parameters")
        if call is None:
            return text, []
        calls.append(call)
    content = text.split("<|python_tag|>", 1)[0].strip() if "<|python_tag|>" in text else ""
    return (content, calls) if calls else (text, [])


def _parse_mistral(text: str) -> tuple[str, list[ToolCall]]:
    if "[TOOL_CALLS]" not in text:
        return text, []
    content, body = text.split("[TOOL_CALLS]", 1)
    body = body.strip()
    calls: list[ToolCall] = []
    if body.startswith("["):
        try:
            items = json.loads(body)
        except json.JSONDecodeError:
            return text, []
        for item in items if isinstance(items, list) else []:
            call = _call(item)
            if call is None:
                return text, []
            calls.append(call)
    else:  # newer templates: name{arguments}[TOOL_CALLS]name{arguments}
        for chunk in body.split("[TOOL_CALLS]"):
            name, brace, rest = chunk.partition("{")
            try:
                call = _call({"name": name.strip(), "arguments": json.loads(brace + rest)})
            except json.JSONDecodeError:
                call = None
            if call is None:
                return text, []
            calls.append(call)
    return (content.strip(), calls) if calls else (text, [])


def _json_values(text: str, separator: str) -> list[Any]:
    """Consecutive JSON values, optionally separated by `separator`; [] if any part is not."""
    decoder = json.JSONDecoder()
    values, i = [], 0
    while i < len(text):
        try:
            value, end = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            return []
        values.append(value)
        i = end
        while i < len(text) and (text[i].isspace() or text[i] == separator):
            i += 1
    return values


# --- generating a call under a grammar ------------------------------------------------------


def chosen_tools(tools: list[dict[str, Any]], tool_choice: Any) -> list[dict[str, Any]] | None:
    """The tools a reply must call one of, or None when it may answer in words
    (`auto`, `none` or no choice)."""
    if tool_choice == "required":
        return tools
    if isinstance(tool_choice, dict):
        name = (tool_choice.get("function") or {}).get("name") or tool_choice.get("name")
        named = [t for t in tools if _function(t).get("name") == name]
        if not named:
            raise ValueError(f"tool_choice names '{name}', which is not among the tools")
        return named
    return None


def call_grammar(tools: list[dict[str, Any]], parser: str) -> str:
    """A Lark grammar (llguidance's dialect) whose only sentences are one call, in the parser's
    form, of one of `tools` with arguments that follow its schema."""
    arguments_key = "parameters" if parser == "llama3_json" else "arguments"
    options = []
    for tool in tools:
        function = _function(tool)
        parameters = function.get("parameters") or {"type": "object"}
        options.append({
            "type": "object",
            "properties": {"name": {"const": function["name"]}, arguments_key: parameters},
            "required": ["name", arguments_key],
            "additionalProperties": False,
        })  # fmt: skip
    schema = {"anyOf": options} if len(options) > 1 else options[0]
    schema = {**schema, "x-guidance": _COMPACT}
    call = f"call: %json {json.dumps(schema)}"
    if parser == "hermes":
        return f'start: "<tool_call>\\n" call "\\n</tool_call>"\n{call}'
    if parser == "mistral":
        return f'start: "[TOOL_CALLS][" call "]"\n{call}'
    return f"start: call\n{call}"


def _function(tool: dict[str, Any]) -> dict[str, Any]:
    return tool.get("function", tool) if isinstance(tool, dict) else {}
