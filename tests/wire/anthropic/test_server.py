"""Anthropic's Messages bodies into lmpress Requests, without a server: blocks in order, tool
results as tool turns, thinking sent back kept whole, settings named as the client sent them."""

from __future__ import annotations

import pytest

from lmpress.vocabulary.types import (
    FINISH_REASONS,
    ContentPart,
    Message,
    Result,
    Sample,
    ToolCall,
)
from lmpress.wire.anthropic.server import (
    STOP_REASONS,
    MessagesBody,
    anthropic_error,
    message_body,
    request_messages,
    request_sampling,
)
from lmpress.wire.openai.errors import ApiError

TOOL = {"name": "lookup", "input_schema": {"type": "object"}}


def body(**fields) -> MessagesBody:
    return MessagesBody.model_validate(
        {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}], **fields}
    )


def test_tool_use_and_tool_result_blocks_are_the_chat_turns_they_stand_for():
    messages = request_messages(body(messages=[
        {"role": "user", "content": "find x"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "hmm", "signature": "s"},
            {"type": "text", "text": "Looking."},
            {"type": "tool_use", "id": "t1", "name": "lookup", "input": {"q": "x"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "42"}],
             "is_error": False, "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": "and?"}]},
    ], system="be brief"))  # fmt: skip
    assert [m.role for m in messages] == ["system", "user", "assistant", "tool", "user"]
    assistant = messages[2]
    assert assistant.content == "Looking."
    assert assistant.tool_calls == [ToolCall("t1", "lookup", '{"q": "x"}')]
    assert assistant.reasoning == "hmm"
    assert assistant.reasoning_details == [
        {"type": "thinking", "thinking": "hmm", "signature": "s"}
    ]
    assert messages[3] == Message("tool", [ContentPart("text", text="42")], tool_call_id="t1")
    assert messages[4].text() == "and?"


def test_settings_are_named_as_the_client_sent_them():
    sampling = request_sampling(
        body(stop_sequences=["\n"], top_k=5, thinking={"type": "enabled", "budget_tokens": 10},
             tools=[TOOL], tool_choice={"type": "any", "disable_parallel_tool_use": True}),
        thinks=True,
    )  # fmt: skip
    assert sampling.overrides == {
        "max_new_tokens": 8, "top_k": 5, "stop_strings": ["\n"], "max_reasoning_tokens": 10,
        "tool_choice": "required", "parallel_tool_calls": False,
    }  # fmt: skip
    assert sampling.source["max_reasoning_tokens"] == "thinking.budget_tokens"
    assert sampling.tools == [{"type": "function", "function": {
        "name": "lookup", "parameters": {"type": "object"}}}]  # fmt: skip
    # Thinking off asks a model that thinks to stop; one that does not is left alone.
    off = body(thinking={"type": "disabled"})
    assert request_sampling(off, thinks=True).overrides["reasoning_effort"] == "none"
    assert "reasoning_effort" not in request_sampling(off, thinks=False).overrides


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"tools": [{"name": "bad name", "input_schema": {"type": "object"}}]}, "tools[0].name"),
        ({"tool_choice": {"type": "tool"}, "tools": [TOOL]}, "tool_choice.name"),
        ({"tool_choice": {"type": "any"}}, "tool_choice"),
        ({"thinking": {"type": "enabled"}}, "thinking.budget_tokens"),
        ({"top_p": 2.0}, "top_p"),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "image", "source": {"type": "file", "file_id": "f"}}],
                    }
                ]
            },
            "messages[0].content[0].source.type",
        ),  # fmt: skip
        ({"messages": [{"role": "user", "content": [{"type": "tool_result"}]}]}, "tool_use_id"),
        ({"system": [{"type": "image"}]}, "system[0]"),
    ],
)
def test_a_bad_field_is_a_400_naming_it(fields, named):
    with pytest.raises(ApiError) as bad:
        b = body(**fields)
        request_messages(b)
        request_sampling(b, thinks=False)
    assert bad.value.status == 400 and named in bad.value.message


def test_every_finish_reason_has_a_stop_reason_and_errors_take_anthropics_shape():
    assert set(STOP_REASONS) == set(FINISH_REASONS)
    error = anthropic_error(ApiError(404, "no such model", code="model_not_found"))
    assert error.status == 404
    assert error.body() == {
        "type": "error", "error": {"type": "not_found_error", "message": "no such model"}}  # fmt: skip
    assert anthropic_error(ApiError(502, "upstream")).body()["error"]["type"] == "api_error"


def test_a_providers_signed_blocks_go_out_and_come_back_whole_and_lmpress_own_do_not():
    """Behind serve, the ANTHROPIC engine's reply carries Anthropic's own blocks: the client gets
    them with their signatures (and redacted thinking), and sends them back unchanged. A block
    lmpress signed itself carries nothing a provider could check, so it goes back as text."""
    signed = [{"type": "thinking", "thinking": "hmm", "signature": "sig-real"},
              {"type": "redacted_thinking", "data": "opaque"}]  # fmt: skip
    sample = Sample("Paris.", "stop", reasoning="hmm", reasoning_details=signed)
    body_out = message_body("msg-1", "m", Result("msg-1", [sample]))
    assert body_out["content"][:2] == signed
    ours = message_body("msg-2", "m", Result("msg-2", [Sample("Paris.", "stop", reasoning="hmm")]))
    [back_signed, back_ours] = [
        request_messages(
            body(
                messages=[
                    {"role": "user", "content": "q"},
                    {"role": "assistant", "content": reply["content"]},
                    {"role": "user", "content": "and?"},
                ]
            )
        )[1]  # fmt: skip
        for reply in (body_out, ours)
    ]
    assert back_signed.reasoning_details == signed
    assert back_ours.reasoning == "hmm" and back_ours.reasoning_details is None
