"""Rows with tools: read as OpenAI and Oumi write them, and a reply's tool calls written back in
each output format (an Oumi conversation's as Oumi's `Conversation.to_dict` writes them:
`content: null` beside OpenAI-shaped `tool_calls`, the arguments as JSON text)."""

from __future__ import annotations

import json

import pytest
from openai.types.chat import ChatCompletion

from lmpress.data.row_shapes import RowError, parse_row, render_row
from lmpress.vocabulary.types import GenerationParams, Result, Sample, ToolCall, Usage

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"]}}}  # fmt: skip
CALL = ToolCall("call_1", "get_weather", '{"city": "Paris"}')


def called(text: str = "") -> Result:
    return Result("x", [Sample(text, "tool_calls", tool_calls=[CALL])], Usage(5, 2), "m", "OPENAI")


def test_a_chat_row_offers_its_tools_and_tool_choice_wins_over_its_generation():
    raw = {"id": "a", "messages": [{"role": "user", "content": "Weather in Paris?"}],
           "tools": [WEATHER], "tool_choice": "required",
           "generation": {"tool_choice": "auto", "max_new_tokens": 9}}  # fmt: skip
    row = parse_row(raw, 1)
    assert row.tools == [WEATHER]
    assert row.overrides == {"tool_choice": "required", "max_new_tokens": 9}
    request = row.request(GenerationParams())
    assert request.tools == [WEATHER]


def test_an_oumi_conversation_with_a_call_and_its_result_round_trips():
    raw = {"conversation_id": "c1", "metadata": {}, "tools": [WEATHER], "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "18C", "tool_call_id": "call_1"},
    ]}  # fmt: skip
    row = parse_row(raw, 1)
    assert row.shape == "oumi"
    assert row.messages[1].tool_calls == [CALL]  # Oumi's object arguments as JSON text
    assert row.messages[2].tool_call_id == "call_1"
    out = render_row(row, called())
    assert out["messages"][-1] == {
        "role": "assistant", "content": None, "tool_calls": [CALL.to_openai()]
    }  # fmt: skip
    assert out["response"]["finish_reason"] == "tool_calls"
    assert out["response"]["tool_calls"] == [CALL.to_openai()]
    assert out["tools"] == [WEATHER] and out["messages"][:3] == raw["messages"]


def test_an_openai_batch_line_with_tools_answers_a_chat_completion_with_the_call():
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [WEATHER],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "parallel_tool_calls": False}  # fmt: skip
    row = parse_row({"custom_id": "b1", "method": "POST", "url": "/v1/chat/completions",
                     "body": body}, 1)  # fmt: skip
    assert row.tools == [WEATHER]
    assert row.overrides["tool_choice"] == body["tool_choice"]
    assert row.overrides["parallel_tool_calls"] is False
    out = render_row(row, called("Checking."))
    completion = ChatCompletion.model_validate(out["response"]["body"])
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Checking."
    call = choice.message.tool_calls[0]
    assert (call.id, call.function.name, json.loads(call.function.arguments)) == (
        "call_1", "get_weather", {"city": "Paris"}
    )  # fmt: skip


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"tools": {"a": 1}}, "'tools' must be a list"),
        ({"tools": [{"type": "function", "function": {"name": "bad name"}}]},
         "'tools[0].function.name' must be 1 to 64"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]},
         "'tools[0].function.parameters' must be a JSON Schema"),
        ({"tools": [WEATHER, WEATHER]}, "offered twice"),
        ({"tools": [WEATHER], "tool_choice": "always"}, "'tool_choice' must be one of"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "g"}}},
         "names function 'g', which is not among the tools"),
        ({"tool_choice": "required"}, "'required' needs tools"),
        ({"messages": [{"role": "user", "content": "x", "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]},
         "message 1 has tool_calls, which only an assistant message may have"),
        ({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": None,
          "tool_calls": [{"type": "function", "function": {"name": "f"}}]}]},
         "message 2: 'tool_calls[0].id' must be a non-empty string"),
    ],
)  # fmt: skip
def test_a_malformed_tool_row_is_refused_in_one_line(change, expected):
    raw = {"messages": [{"role": "user", "content": "hi"}], **change}
    with pytest.raises(RowError, match=expected.replace("[", r"\[").replace("]", r"\]")):
        parse_row(raw, 1)
