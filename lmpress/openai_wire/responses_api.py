"""OpenAI's Responses API (`POST /v1/responses`) on the wire, both ways: a request body -> the
messages, tools and GenerationParams overrides of an engine Request; a Result -> a `response`
object, or the stream of events that builds one. The way out is built from the `openai`
package's own types (`openai.types.responses`), so that its `responses.create` and
`responses.stream` parse what serve answers.

lmpress keeps no responses, so the API is stateless here: `previous_response_id`,
`conversation` and `background` are refused in one line (send the whole conversation as
`input`), and a body's `store` (the API's default is true) is accepted and answered with
`store: false`, which says that nothing was kept. A reasoning model's thinking is a `reasoning`
output item whose `content` holds the thinking as `reasoning_text`, as vLLM serves it; lmpress
writes no summaries of it, so `summary` is empty.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseContentPartAddedEvent,
    ResponseContentPartDoneEvent,
    ResponseCreatedEvent,
    ResponseErrorEvent,
    ResponseFailedEvent,
    ResponseFunctionCallArgumentsDeltaEvent,
    ResponseFunctionCallArgumentsDoneEvent,
    ResponseFunctionToolCall,
    ResponseIncompleteEvent,
    ResponseInProgressEvent,
    ResponseOutputItem,
    ResponseOutputItemAddedEvent,
    ResponseOutputItemDoneEvent,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseReasoningItem,
    ResponseReasoningTextDeltaEvent,
    ResponseReasoningTextDoneEvent,
    ResponseTextDeltaEvent,
    ResponseTextDoneEvent,
    ResponseUsage,
)
from openai.types.responses.response_reasoning_item import Content as ReasoningText
from openai.types.responses.response_usage import InputTokensDetails, OutputTokensDetails
from pydantic import BaseModel, ConfigDict

from lmpress.openai_wire.errors import ApiError
from lmpress.openai_wire.requests import Sampling, StreamOptions, guided_decoding, validate_body
from lmpress.vocabulary.tools import ToolError, check_tool_choice, check_tools
from lmpress.vocabulary.types import ContentPart, FinishReason, Message, Result, Sample, ToolCall
from lmpress.vocabulary.types import Usage as EngineUsage

RESPONSES_PATH = "/v1/responses"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class TextConfig(_Strict):
    format: dict[str, Any] | None = None
    verbosity: str | None = None  # refused when given: lmpress cannot honour it


class ReasoningConfig(_Strict):
    effort: str | None = None
    # Accepted: the thinking comes whole as the reasoning item's content, never summarized.
    summary: str | None = None
    generate_summary: str | None = None


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
    metadata: dict[str, Any] | None = None
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


# --- the response ----------------------------------------------------------------------------

# Why a response stopped short, by the reason its reply ended (the others complete it).
INCOMPLETE: dict[FinishReason, Literal["max_output_tokens", "content_filter"]] = {
    "length": "max_output_tokens",
    "content_filter": "content_filter",
}


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


@dataclass
class ResponseHead:
    """What a response repeats of its request, and the ids of its output items (the same in
    every event of a stream and in the response that ends it)."""

    id: str
    model: str
    body: ResponsesBody
    created_at: int = field(default_factory=lambda: int(time.time()))
    reasoning_id: str = field(default_factory=lambda: _id("rs"))
    message_id: str = field(default_factory=lambda: _id("msg"))
    call_ids: list[str] = field(default_factory=list)

    def call_id(self, index: int) -> str:
        while len(self.call_ids) <= index:
            self.call_ids.append(_id("fc"))
        return self.call_ids[index]

    def response(
        self,
        status: Literal["in_progress", "completed", "incomplete", "failed"],
        output: list[ResponseOutputItem] | None = None,
        usage: EngineUsage | None = None,
        **extra: Any,
    ) -> Response:
        body = self.body
        fields: dict[str, Any] = dict(
            id=self.id, object="response", created_at=self.created_at, model=self.model,
            status=status, output=output or [], tools=body.tools or [],
            tool_choice=body.tool_choice or "auto",
            parallel_tool_calls=body.parallel_tool_calls is not False,
            instructions=body.instructions, max_output_tokens=body.max_output_tokens,
            temperature=body.temperature, top_p=body.top_p, metadata=body.metadata,
            text=body.text.model_dump(exclude_none=True) if body.text else {"format": {"type": "text"}},
            reasoning=body.reasoning.model_dump(exclude_none=True) if body.reasoning else None,
            previous_response_id=None, incomplete_details=None, error=None,
            usage=None if usage is None else _usage(usage), store=False,
        )  # fmt: skip
        return Response(**{**fields, **extra})

    def reasoning_item(self, text: str, status: str = "completed") -> ResponseReasoningItem:
        opened = status == "in_progress"  # its text comes in the content part events
        content = [] if opened else [ReasoningText(type="reasoning_text", text=text)]
        return ResponseReasoningItem(
            id=self.reasoning_id, type="reasoning", summary=[], content=content, status=status
        )

    def message_item(self, text: str | None, status: str = "completed") -> ResponseOutputMessage:
        content = [] if text is None else [_output_text(text)]
        return ResponseOutputMessage(
            id=self.message_id, type="message", role="assistant", status=status, content=content
        )

    def call_item(self, index: int, call: ToolCall, arguments: str, status: str = "completed"):
        return ResponseFunctionToolCall(
            id=self.call_id(index), type="function_call", call_id=call.id, name=call.name,
            arguments=arguments, status=status,
        )  # fmt: skip

    def output(self, sample: Sample) -> list[ResponseOutputItem]:
        """A reply's output items: its thinking, its text (none when it only calls tools),
        its calls."""
        incomplete = sample.finish_reason in INCOMPLETE
        items: list[ResponseOutputItem] = []
        if sample.reasoning is not None:
            items.append(self.reasoning_item(sample.reasoning))
        if sample.text or not sample.tool_calls:
            items.append(
                self.message_item(sample.text, "incomplete" if incomplete else "completed")
            )
        for i, call in enumerate(sample.tool_calls or ()):
            items.append(self.call_item(i, call, call.arguments))
        return items

    def finished(self, result: Result) -> Response:
        """The whole response to a Result."""
        sample = result.samples[0]
        reason = INCOMPLETE.get(sample.finish_reason)
        return self.response(
            "incomplete" if reason else "completed",
            self.output(sample),
            result.usage,
            incomplete_details={"reason": reason} if reason else None,
            completed_at=None if reason else int(time.time()),
        )


def _output_text(text: str) -> ResponseOutputText:
    return ResponseOutputText(type="output_text", text=text, annotations=[], logprobs=[])


def _usage(usage: EngineUsage) -> ResponseUsage:
    return ResponseUsage(
        input_tokens=usage.prompt_tokens,
        input_tokens_details=InputTokensDetails(cached_tokens=0, cache_write_tokens=0),
        output_tokens=usage.completion_tokens,
        output_tokens_details=OutputTokensDetails(reasoning_tokens=usage.reasoning_tokens),
        total_tokens=usage.total_tokens,
    )


def dump(model: BaseModel) -> dict[str, Any]:
    return model.model_dump(mode="json", exclude_unset=True, warnings=False, by_alias=True)


# --- the stream ------------------------------------------------------------------------------


class ResponseEvents:
    """The event stream of one response, as SSE lines: created and in_progress; the thinking
    as a reasoning item, then the text as a message item, each opened, filled by deltas and
    closed; the tool calls, each with its arguments; then completed (or incomplete). Every
    event carries the next sequence_number."""

    def __init__(self, head: ResponseHead):
        self.head = head
        self.sequence = 0
        self.items: list[ResponseOutputItem] = []  # those closed, in output order
        self.open: Literal["reasoning", "message"] | None = None
        self.text = ""

    def _event(self, event_type: type[BaseModel], **fields: Any) -> bytes:
        event = event_type(sequence_number=self.sequence, **fields)
        self.sequence += 1
        data = json.dumps(dump(event), ensure_ascii=False, separators=(",", ":"))
        return f"event: {fields['type']}\ndata: {data}\n\n".encode()

    def start(self) -> list[bytes]:
        response = self.head.response("in_progress")
        return [
            self._event(ResponseCreatedEvent, type="response.created", response=response),
            self._event(ResponseInProgressEvent, type="response.in_progress", response=response),
        ]

    def _where(self) -> dict[str, Any]:
        item_id = self.head.reasoning_id if self.open == "reasoning" else self.head.message_id
        return {"item_id": item_id, "output_index": len(self.items), "content_index": 0}

    def _opening(self, kind: Literal["reasoning", "message"]) -> list[bytes]:
        if self.open == kind:
            return []
        out = self._closing()
        self.open, self.text = kind, ""
        head, index = self.head, len(self.items)
        if kind == "reasoning":
            item: ResponseOutputItem = head.reasoning_item("", "in_progress")
            part: dict[str, Any] = {"type": "reasoning_text", "text": ""}
        else:
            item, part = head.message_item(None, "in_progress"), dump(_output_text(""))
        added = ResponseOutputItemAddedEvent
        out.append(
            self._event(added, type="response.output_item.added", item=item, output_index=index)
        )
        out.append(
            self._event(
                ResponseContentPartAddedEvent,
                type="response.content_part.added",
                part=part,
                **self._where(),
            )
        )
        return out  # fmt: skip

    def delta(self, text: str, reasoning: bool) -> list[bytes]:
        out = self._opening("reasoning" if reasoning else "message")
        self.text += text
        if reasoning:
            event, kind, extra = (
                ResponseReasoningTextDeltaEvent,
                "response.reasoning_text.delta",
                {},
            )
        else:
            event, kind, extra = (
                ResponseTextDeltaEvent,
                "response.output_text.delta",
                {"logprobs": []},
            )
        out.append(self._event(event, type=kind, delta=text, **extra, **self._where()))
        return out  # fmt: skip

    def _closing(self, status: str = "completed") -> list[bytes]:
        if self.open is None:
            return []
        where, text = self._where(), self.text
        if self.open == "reasoning":
            item: ResponseOutputItem = self.head.reasoning_item(text)
            part: dict[str, Any] = {"type": "reasoning_text", "text": text}
            done = [
                self._event(
                    ResponseReasoningTextDoneEvent,
                    type="response.reasoning_text.done",
                    text=text,
                    **where,
                )
            ]
        else:
            item, part = self.head.message_item(text, status), dump(_output_text(text))
            done = [
                self._event(
                    ResponseTextDoneEvent,
                    type="response.output_text.done",
                    text=text,
                    logprobs=[],
                    **where,
                )
            ]
        done.append(
            self._event(
                ResponseContentPartDoneEvent, type="response.content_part.done", part=part, **where
            )
        )
        done.append(
            self._event(
                ResponseOutputItemDoneEvent,
                type="response.output_item.done",
                item=item,
                output_index=where["output_index"],
            )
        )
        self.items.append(item)
        self.open = None
        return done  # fmt: skip

    def finish(self, result: Result) -> list[bytes]:
        """What is left of the reply (text an engine gives only with its Result, such as a
        reply that may call tools), its calls, and the response's last event."""
        sample = result.samples[0]
        reason = INCOMPLETE.get(sample.finish_reason)
        out: list[bytes] = []
        if (
            sample.reasoning
            and not any(i.type == "reasoning" for i in self.items)
            and self.open != "reasoning"
        ):
            out += self.delta(sample.reasoning, reasoning=True)
        streamed = self.text if self.open == "message" else ""
        if sample.text.startswith(streamed) and sample.text != streamed:
            out += self.delta(sample.text[len(streamed) :], reasoning=False)
        elif self.open != "message" and not sample.tool_calls:
            out += self._opening("message")  # an empty reply is still a message
        out += self._closing("incomplete" if reason else "completed")
        for i, call in enumerate(sample.tool_calls or ()):
            out += self._call(i, call)
        final = self.head.finished(result).model_copy(update={"output": self.items})
        if reason:
            return [
                *out,
                self._event(ResponseIncompleteEvent, type="response.incomplete", response=final),
            ]
        return [*out, self._event(ResponseCompletedEvent, type="response.completed", response=final)]  # fmt: skip

    def _call(self, index: int, call: ToolCall) -> list[bytes]:
        head, output_index = self.head, len(self.items)
        where = {"item_id": head.call_id(index), "output_index": output_index}
        item = head.call_item(index, call, call.arguments)
        self.items.append(item)
        return [
            self._event(ResponseOutputItemAddedEvent, type="response.output_item.added", item=head.call_item(index, call, "", "in_progress"), output_index=output_index),
            self._event(ResponseFunctionCallArgumentsDeltaEvent, type="response.function_call_arguments.delta", delta=call.arguments, **where),
            self._event(ResponseFunctionCallArgumentsDoneEvent, type="response.function_call_arguments.done", arguments=call.arguments, **where),
            self._event(ResponseOutputItemDoneEvent, type="response.output_item.done", item=item, output_index=output_index),
        ]  # fmt: skip

    def failed(self, error: ApiError) -> list[bytes]:
        """An error midway: the error event, then the response, failed."""
        failed = self.head.response(
            "failed", self.items, error={"code": "server_error", "message": error.message}
        )
        return [
            self._event(ResponseErrorEvent, type="error", code=error.code, message=error.message, param=error.param),
            self._event(ResponseFailedEvent, type="response.failed", response=failed),
        ]  # fmt: skip
