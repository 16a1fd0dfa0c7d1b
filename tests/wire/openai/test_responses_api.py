"""The Responses API's event stream, read by the openai package's own parser: every event
parses as the type it names, in order, numbered; an engine error midway ends it with an
`error` event and a failed response; tool calls given only with the Result come as their
own items."""

from __future__ import annotations

import json

from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from lmpress.vocabulary.types import Result, Sample, ToolCall, Usage
from lmpress.wire.openai.errors import ApiError
from lmpress.wire.openai.responses_api.requests import ResponsesBody
from lmpress.wire.openai.responses_api.responses import ResponseEvents, ResponseHead

EVENT = TypeAdapter(ResponseStreamEvent)


def parsed(lines: list[bytes]) -> list:
    events = []
    for line in lines:
        kind, data = line.decode().removesuffix("\n\n").split("\n")
        event = EVENT.validate_python(json.loads(data.removeprefix("data: ")))
        assert kind == f"event: {event.type}"
        events.append(event)
    return events


def events_for(body: dict) -> ResponseEvents:
    return ResponseEvents(ResponseHead("resp_1", "m", ResponsesBody.model_validate(body)))


def test_an_error_midway_ends_the_stream_failed():
    events = events_for({"input": "hi"})
    lines = [*events.start(), *events.delta("Hel", False)]
    lines += events.failed(ApiError(500, "the engine broke", type="server_error", code="x"))
    out = parsed(lines)
    assert [e.type for e in out] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.content_part.added", "response.output_text.delta", "error", "response.failed",
    ]  # fmt: skip
    assert [e.sequence_number for e in out] == list(range(len(out)))
    assert (out[-2].message, out[-2].code) == ("the engine broke", "x")
    assert out[-1].response.status == "failed"
    assert out[-1].response.error.message == "the engine broke"


def test_calls_given_with_the_result_come_as_their_own_items():
    tool = {"type": "function", "name": "f", "parameters": {"type": "object"}, "strict": None}
    events = events_for({"input": "hi", "tools": [tool]})
    call = ToolCall("call_1", "f", '{"a": 1}')
    result = Result("r", [Sample("", "tool_calls", tool_calls=[call])], Usage(3, 4))
    out = parsed([*events.start(), *events.finish(result)])
    assert [e.type for e in out][2:] == [
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done",
        "response.completed",
    ]  # fmt: skip
    [item] = out[-1].response.output
    assert (item.type, item.call_id, item.name, item.arguments) == (
        "function_call", "call_1", "f", '{"a": 1}',
    )  # fmt: skip
    assert out[2].item.id == item.id and out[2].item.arguments == ""
    assert out[-1].response.usage.total_tokens == 7
