"""The Responses API's request body, the way in: strict pydantic models (an unknown argument or
item field is refused, naming it) -> the conversation as lmpress Messages and the generation
settings as a `Sampling`, through the same checks as chat's (`wire.openai.requests`,
`vocabulary.tools`)."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from lmpress.vocabulary.tools import ToolError, check_tool_choice, check_tools
from lmpress.vocabulary.types import ContentPart, Message, ToolCall
from lmpress.wire.openai.errors import ApiError
from lmpress.wire.openai.requests import Sampling, StreamOptions, guided_decoding, validate_body

RESPONSES_PATH = "/v1/responses"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class TextConfig(_Strict):
    format: dict[str, Any] | None = None
    verbosity: str | None = None  # refused when given: lmpress cannot honour it


# The summaries `openai`'s Reasoning type takes (the response repeats the request's).
Summary = Literal["auto", "concise", "detailed"]


class ReasoningConfig(_Strict):
    effort: str | None = None
    # Accepted: the thinking comes whole as the reasoning item's content, never summarized.
    summary: Summary | None = None
    generate_summary: Summary | None = None


class ResponsesBody(_Strict):
    model: str | None = None
    input: str | list[Any]
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    store: bool | None = None  # accepted; nothing is stored, and the response says store: false
    include: list[str] | None = None  # accepted; there is nothing more to include
    truncation: Literal["disabled"] | None = None  # "auto" would drop turns: refused
    # Accepted and without effect on what is generated.
    metadata: dict[str, str] | None = None  # repeated in the response, as strings
    user: str | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    # Refused when given a value: they need responses kept, or lmpress cannot honour them.
    previous_response_id: str | None = None
    conversation: Any = None
    background: bool | None = None
    prompt: Any = None
    top_logprobs: int | None = None
    max_tool_calls: int | None = None


STATEFUL_ARGS = ("conversation", "background")
UNSUPPORTED_ARGS = ("prompt", "top_logprobs", "max_tool_calls")


# --- input items -----------------------------------------------------------------------------


class InputText(_Strict):
    type: Literal["input_text"]
    text: str


class OutputText(_Strict):  # an earlier reply's text, sent back as it came
    type: Literal["output_text"]
    text: str
    annotations: list[Any] | None = None
    logprobs: list[Any] | None = None


class Refusal(_Strict):
    type: Literal["refusal"]
    refusal: str


class InputImage(_Strict):
    type: Literal["input_image"]
    image_url: str | None = None
    file_id: str | None = None
    detail: str | None = None


class MessageItem(_Strict):
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[dict[str, Any]]
    id: str | None = None
    status: str | None = None
    phase: str | None = None


class FunctionCallItem(_Strict):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: str | None = None
    status: str | None = None


class FunctionCallOutputItem(_Strict):
    type: Literal["function_call_output"]
    call_id: str
    output: str | list[dict[str, Any]]
    id: str | None = None
    status: str | None = None


class ReasoningItem(_Strict):  # an earlier turn's thinking, sent back as it came
    type: Literal["reasoning"]
    summary: list[dict[str, Any]]
    content: list[dict[str, Any]] | None = None
    id: str | None = None
    encrypted_content: str | None = None
    status: str | None = None


ITEMS: dict[str, type[_Strict]] = {
    "message": MessageItem,
    "function_call": FunctionCallItem,
    "function_call_output": FunctionCallOutputItem,
    "reasoning": ReasoningItem,
}
PARTS: dict[str, type[_Strict]] = {
    "input_text": InputText,
    "output_text": OutputText,
    "refusal": Refusal,
    "input_image": InputImage,
}


def input_messages(body: ResponsesBody) -> list[Message]:
    """The conversation a body asks to continue: `instructions` as a system message first,
    then the input's items as chat messages (a function_call joins the assistant turn before
    it, a function_call_output is a tool turn, a reasoning item is the next assistant turn's
    thinking)."""
    messages = [Message("system", body.instructions)] if body.instructions else []
    items = [{"role": "user", "content": body.input}] if isinstance(body.input, str) else body.input
    if not items:
        raise ApiError(400, "'input' is empty", param="input")
    thinking: str | None = None
    for i, raw in enumerate(items):
        where = f"input[{i}]"
        item = _parse_item(raw, where)
        if isinstance(item, ReasoningItem):
            texts = [p.get("text", "") for p in item.content or item.summary]
            thinking = "\n\n".join(t for t in texts if isinstance(t, str))
            continue
        if isinstance(item, FunctionCallItem):
            last = messages[-1] if messages else None
            if last is None or last.role != "assistant" or thinking is not None:
                last = Message("assistant", "")
                messages.append(last)
            last.tool_calls = [*(last.tool_calls or []), _call(item)]
        elif isinstance(item, FunctionCallOutputItem):
            output = _content(item.output, f"{where}.output")
            messages.append(Message("tool", output, tool_call_id=item.call_id))
        else:
            assert isinstance(item, MessageItem)
            messages.append(Message(item.role, _content(item.content, f"{where}.content")))
        if thinking is not None and messages[-1].role == "assistant":
            messages[-1].reasoning, thinking = thinking, None
    return messages


def _parse_item(raw: Any, where: str) -> _Strict:
    if not isinstance(raw, dict):
        raise ApiError(400, f"'{where}' must be an object", param="input")
    kind = raw.get("type", "message")
    model = ITEMS.get(kind)
    if model is None:
        raise ApiError(
            400,
            f"'{where}.type': {json.dumps(kind)} is not an input item lmpress takes "
            f"({', '.join(ITEMS)})",
            param="input",
        )
    return validate_body(model, raw, f"{where}.")


def _call(item: FunctionCallItem) -> ToolCall:
    return ToolCall(item.call_id, item.name, item.arguments)


def _content(content: str | list[dict[str, Any]], where: str) -> str | list[ContentPart]:
    if isinstance(content, str):
        return content
    parts = []
    for j, raw in enumerate(content):
        at = f"{where}[{j}]"
        model = PARTS.get(raw.get("type"))
        if model is None:
            raise ApiError(
                400,
                f"'{at}.type': {json.dumps(raw.get('type'))} is not a content part lmpress "
                f"takes ({', '.join(PARTS)})",
                param="input",
            )
        part = validate_body(model, raw, f"{at}.")
        if isinstance(part, InputImage):
            if not part.image_url:
                raise ApiError(
                    400,
                    f"'{at}': lmpress keeps no files; send the image as 'image_url' "
                    f"(a data: URL or an http(s) URL)",
                    param="input",
                )
            parts.append(ContentPart("image_url", image_url=part.image_url))
        else:
            text = part.refusal if isinstance(part, Refusal) else part.text  # type: ignore[attr-defined]
            parts.append(ContentPart("text", text=text))
    return parts


# --- generation settings ---------------------------------------------------------------------


def responses_sampling(body: ResponsesBody) -> Sampling:
    """A body's generation settings and tools, or a 400 naming what lmpress cannot honour."""
    sampling = Sampling()
    if body.previous_response_id is not None:
        raise sampling.refuse(
            "previous_response_id",
            "is not supported: lmpress keeps no responses; send the whole conversation as 'input'",
            code="unsupported",
        )
    for name in (*STATEFUL_ARGS, *UNSUPPORTED_ARGS):
        if getattr(body, name) not in (None, False, 0):
            why = "needs responses kept, which lmpress does not do" if name in STATEFUL_ARGS else ""
            raise sampling.refuse(name, f"is not supported by lmpress{why and ': ' + why}")
    if body.stream_options is not None and not body.stream:
        raise sampling.refuse("stream_options", "is only allowed when 'stream' is true")
    sampling.overrides["n"] = 1  # a response has one reply, whatever the server's n
    if body.max_output_tokens is not None:
        sampling.set("max_new_tokens", body.max_output_tokens, "max_output_tokens")
    for name in ("temperature", "top_p"):
        if getattr(body, name) is not None:
            sampling.set(name, getattr(body, name), name)
    if body.reasoning is not None and body.reasoning.effort is not None:
        sampling.set("reasoning_effort", body.reasoning.effort, "reasoning.effort")
    _text_format(body, sampling)
    _tools(body, sampling)
    return sampling


def _text_format(body: ResponsesBody, sampling: Sampling) -> None:
    """`text.format` as chat's response_format, which has the one guided-decoding reader."""
    if body.text is None:
        return
    if body.text.verbosity is not None:
        raise sampling.refuse("text.verbosity", "is not supported by lmpress")
    spec = body.text.format
    if spec is None or spec.get("type") != "json_schema":
        response_format = spec
    else:
        inner = {k: v for k, v in spec.items() if k != "type"}
        response_format = {"type": "json_schema", "json_schema": inner}
    try:
        guided = guided_decoding(response_format)
    except ApiError as exc:
        message = exc.message.replace("response_format.json_schema", "text.format")
        message = message.replace("response_format", "text.format")
        raise ApiError(400, message, param="text.format") from None
    if guided is not None:
        sampling.set("guided_decoding", guided, "text.format")


FUNCTION_ORDER = ("name", "description", "parameters", "strict")


def _tools(body: ResponsesBody, sampling: Sampling) -> None:
    """Function tools in the Responses' flat shape, as chat's; built-in tools refused."""
    chat_tools = []
    for i, tool in enumerate(body.tools or ()):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            raise sampling.refuse(
                f"tools[{i}]",
                f"is a {json.dumps(kind)} tool; lmpress runs no built-in tools, only "
                f"function tools (type 'function', with a name and parameters)",
                code="unsupported",
            )
        # In chat's order, whatever the client's: a template writes the tools into the prompt.
        function = {k: tool[k] for k in FUNCTION_ORDER if tool.get(k) is not None}
        function.update({k: v for k, v in tool.items() if k != "type" and v is not None})
        chat_tools.append({"type": "function", "function": function})
    try:
        sampling.tools = check_tools(chat_tools)
    except ToolError as exc:
        raise ApiError(400, str(exc), param="tools") from None
    choice = body.tool_choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        choice = {"type": "function", "function": {"name": choice.get("name")}}
    try:
        if choice not in (None, "none") and not sampling.tools:
            raise ToolError("'tool_choice' is only allowed when 'tools' are specified")
        checked = check_tool_choice(choice, sampling.tools)
    except ToolError as exc:
        raise ApiError(400, str(exc), param="tool_choice") from None
    if checked is not None:
        sampling.set("tool_choice", checked, "tool_choice")
    if body.parallel_tool_calls is not None:
        sampling.set("parallel_tool_calls", body.parallel_tool_calls, "parallel_tool_calls")
