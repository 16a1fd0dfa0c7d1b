"""The Responses API's answer, the way out: a `response` object for a Result, and the event
stream that builds the same object, built from `openai.types.responses`."""

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
from pydantic import BaseModel, ValidationError

from lmpress.vocabulary.types import FinishReason, Result, Sample, ToolCall
from lmpress.vocabulary.types import Usage as EngineUsage
from lmpress.wire.openai.errors import ApiError
from lmpress.wire.openai.requests import validation_error
from lmpress.wire.openai.responses_api.requests import ResponsesBody

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

    def check(self) -> None:
        """A 400 naming the argument, for a request whose settings the response cannot
        repeat: `openai`'s Response type, which the response is built from, is stricter about
        some of them (metadata values, reasoning's summary) than the body's own model."""
        try:
            self.response("in_progress")
        except ValidationError as exc:
            raise validation_error(exc) from None

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

    def call_item(
        self, index: int, call: ToolCall, arguments: str, status: str = "completed"
    ) -> ResponseFunctionToolCall:
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
