"""Anthropic's Messages API on `lmpress serve`, driven by the official `anthropic` SDK: on NATIVE
with the real SmolLM2 the same greedy reply as /v1/chat/completions gives, whole and streamed in
Anthropic's event order; tools both ways; count_tokens equal to the reply's input_tokens;
`x-api-key` beside the bearer token, and errors in Anthropic's shape. Images on the tiny
LLaVA-style model, thinking blocks on tiny:think."""

from __future__ import annotations

import json

import jsonschema
import pytest

from lmpress.builtin_models.packaged import SMOLLM2
from tests.image_files import data_url, picture

anthropic = pytest.importorskip("anthropic")

pytestmark = pytest.mark.timeout(600)

KEY = "sk-local-test"
SYSTEM = "You are a helpful assistant. Answer in one sentence."
CONVERSATION = [
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "The capital of France is Paris."},
    {"role": "user", "content": "And of Italy?"},
]
WEATHER_SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 30},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
WEATHER = {"name": "get_weather", "description": "Current weather in a city",
           "input_schema": WEATHER_SCHEMA}  # fmt: skip
ASK_WEATHER = [{"role": "user", "content": "What's the weather in Paris?"}]
FORCE_WEATHER = {"type": "tool", "name": "get_weather"}


@pytest.fixture(scope="module")
def smol(serve_process):
    return serve_process(
        "--engine", "NATIVE", "--model.model_name", SMOLLM2, "--api-key", KEY,
        "--generation.max_new_tokens", "64", "--generation.batch_size", "4",
    )  # fmt: skip


def client(served, **kwargs):
    return anthropic.Anthropic(base_url=served.url, max_retries=0, **({"api_key": KEY} | kwargs))


# --- text, whole and streamed ----------------------------------------------------------------


def test_the_reply_is_the_chat_completions_reply(smol):
    message = client(smol).messages.create(
        model=SMOLLM2, max_tokens=24, system=SYSTEM, messages=CONVERSATION
    )
    chat = smol.client(KEY).chat.completions.create(
        model=SMOLLM2,
        max_tokens=24,
        messages=[{"role": "system", "content": SYSTEM}, *CONVERSATION],
    )
    [block] = message.content
    assert block.type == "text" and block.text == chat.choices[0].message.content
    assert block.text
    finish = chat.choices[0].finish_reason
    assert message.stop_reason == {"stop": "end_turn", "length": "max_tokens"}[finish]
    assert message.stop_sequence is None
    assert message.usage.input_tokens == chat.usage.prompt_tokens
    assert message.usage.output_tokens == chat.usage.completion_tokens
    assert message.id.startswith("msg") and message.model == SMOLLM2
    # System as blocks, and a stop at max_tokens.
    short = client(smol).messages.create(
        model=SMOLLM2,
        max_tokens=3,
        system=[{"type": "text", "text": SYSTEM}],
        messages=CONVERSATION,
        metadata={"user_id": "someone"},
    )
    assert short.stop_reason == "max_tokens" and short.usage.output_tokens == 3
    assert block.text.startswith(short.content[0].text)
    # A stop sequence from the reply's words ends it there, as `stop` does in chat.
    word = block.text.split()[2]
    stopped = client(smol).messages.create(
        model=SMOLLM2, max_tokens=24, system=SYSTEM, messages=CONVERSATION, stop_sequences=[word]
    )
    assert stopped.content[0].text == block.text[: block.text.index(word)]
    # As Anthropic answers: the stop reason says a stop sequence, and which one (a stop
    # sequence that never appears is not named).
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == word
    # Streamed, the message_delta names it too.
    events = list(
        client(smol).messages.create(
            model=SMOLLM2,
            max_tokens=24,
            system=SYSTEM,
            messages=CONVERSATION,
            stop_sequences=["never in this reply", word],
            stream=True,
        )
    )
    assert events[-2].type == "message_delta"
    assert events[-2].delta.stop_reason == "stop_sequence"
    assert events[-2].delta.stop_sequence == word
    assert "".join(e.delta.text for e in events[2:-3]) == stopped.content[0].text


def test_the_stream_is_the_same_reply_in_anthropics_event_order(smol):
    whole = client(smol).messages.create(
        model=SMOLLM2, max_tokens=24, system=SYSTEM, messages=CONVERSATION
    )
    with client(smol).messages.stream(
        model=SMOLLM2, max_tokens=24, system=SYSTEM, messages=CONVERSATION
    ) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert len(pieces) > 1 and "".join(pieces) == whole.content[0].text
    assert final.content[0].text == whole.content[0].text
    assert final.stop_reason == whole.stop_reason
    assert final.usage.input_tokens == whole.usage.input_tokens
    assert final.usage.output_tokens == whole.usage.output_tokens

    events = list(
        client(smol).messages.create(
            model=SMOLLM2, max_tokens=24, system=SYSTEM, messages=CONVERSATION, stream=True
        )
    )
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start" and kinds[1] == "content_block_start"
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(kinds[2:-3]) == {"content_block_delta"}
    assert events[-2].delta.stop_reason == whole.stop_reason
    assert "".join(e.delta.text for e in events[2:-3]) == whole.content[0].text


# --- tools -----------------------------------------------------------------------------------


def test_a_forced_tool_call_comes_back_as_a_tool_use_block(smol):
    message = client(smol).messages.create(
        model=SMOLLM2, max_tokens=64, messages=ASK_WEATHER, tools=[WEATHER],
        tool_choice=FORCE_WEATHER,
    )  # fmt: skip
    assert message.stop_reason == "tool_use"
    [call] = [b for b in message.content if b.type == "tool_use"]
    assert call.name == "get_weather" and call.id
    jsonschema.validate(call.input, WEATHER_SCHEMA)

    with client(smol).messages.stream(
        model=SMOLLM2,
        max_tokens=64,
        messages=ASK_WEATHER,
        tools=[WEATHER],
        tool_choice=FORCE_WEATHER,
    ) as stream:
        kinds = [event.type for event in stream]
        streamed = stream.get_final_message()
    assert "input_json" in kinds  # the SDK's event for an input_json_delta
    [streamed_call] = [b for b in streamed.content if b.type == "tool_use"]
    assert (streamed_call.name, streamed_call.input) == (call.name, call.input)
    assert streamed.stop_reason == "tool_use"
    assert [b.type for b in streamed.content] == [b.type for b in message.content]

    # The call and its result sent back: the model answers in words.
    turns = [
        *ASK_WEATHER,
        {"role": "assistant", "content": [b.model_dump() for b in message.content]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": call.id, "content": "18 degrees, sunny"}]},
    ]  # fmt: skip
    answer = client(smol).messages.create(
        model=SMOLLM2, max_tokens=16, messages=turns, tools=[WEATHER]
    )
    assert answer.content[0].type == "text" and answer.content[0].text
    # The same conversation through chat completions: the same words.
    chat = smol.client(KEY).chat.completions.create(
        model=SMOLLM2,
        max_tokens=16,
        tools=[{"type": "function", "function": {
            "name": "get_weather", "description": WEATHER["description"],
            "parameters": WEATHER_SCHEMA}}],
        messages=[
            *ASK_WEATHER,
            {"role": "assistant", "content": None, "tool_calls": [{
                "id": call.id, "type": "function",
                "function": {"name": "get_weather", "arguments": json.dumps(call.input)}}]},
            {"role": "tool", "tool_call_id": call.id, "content": "18 degrees, sunny"},
        ],
    )  # fmt: skip
    assert answer.content[0].text == chat.choices[0].message.content


def test_count_tokens_is_the_replys_input_tokens(smol):
    for extra in ({}, {"system": SYSTEM}, {"tools": [WEATHER]}):
        counted = client(smol).messages.count_tokens(model=SMOLLM2, messages=CONVERSATION, **extra)
        message = client(smol).messages.create(
            model=SMOLLM2, max_tokens=1, messages=CONVERSATION, **extra
        )
        assert counted.input_tokens == message.usage.input_tokens > 0


# --- keys and errors -------------------------------------------------------------------------


def test_x_api_key_and_the_bearer_token_both_open_every_route(smol):
    by_bearer = client(smol, api_key=None, auth_token=KEY)
    assert by_bearer.messages.create(model=SMOLLM2, max_tokens=2, messages=ASK_WEATHER).content
    with smol.http() as http:
        assert http.get("/v1/models", headers={"x-api-key": KEY}).status_code == 200
        assert http.get("/v1/models", headers={"x-api-key": "wrong"}).status_code == 401
        missing = http.post("/v1/messages", json={})
    assert missing.status_code == 401
    assert missing.json()["type"] == "error"
    assert missing.json()["error"]["type"] == "authentication_error"
    assert "x-api-key" in missing.json()["error"]["message"]
    with pytest.raises(anthropic.AuthenticationError) as wrong:
        client(smol, api_key="wrong").messages.create(
            model=SMOLLM2, max_tokens=2, messages=ASK_WEATHER
        )
    assert wrong.value.status_code == 401
    assert wrong.value.body == {"type": "error", "error": {
        "type": "authentication_error", "message": "Incorrect API key provided."}}  # fmt: skip


def test_a_bad_body_is_a_400_in_anthropics_shape_naming_the_field(smol):
    c = client(smol)
    cases = [
        ({"max_tokens": 0}, "max_tokens"),
        ({"extra_body": {"frobnicate": 1}}, "frobnicate"),
        ({"extra_body": {"temperature": -1.0}}, "temperature"),
        ({"stop_sequences": [""]}, "stop_sequences"),
        ({"tool_choice": {"type": "tool", "name": "nope"}, "tools": [WEATHER]}, "tool_choice"),
        ({"messages": [{"role": "user", "content": [{"type": "video"}]}]}, "messages[0]"),
        ({"messages": [*ASK_WEATHER, {"role": "assistant", "content": "It is"}]}, "prefill"),
    ]
    for change, named in cases:
        kwargs = {"model": SMOLLM2, "max_tokens": 8, "messages": ASK_WEATHER, **change}
        with pytest.raises(anthropic.BadRequestError) as bad:
            c.messages.create(**kwargs)
        assert bad.value.body["type"] == "error", change
        assert bad.value.body["error"]["type"] == "invalid_request_error"
        assert named in bad.value.body["error"]["message"], (change, bad.value.body)
    with pytest.raises(anthropic.NotFoundError) as missing:
        c.messages.create(model="claude-opus", max_tokens=8, messages=ASK_WEATHER)
    assert missing.value.body["error"]["type"] == "not_found_error"
    with smol.http(headers={"x-api-key": KEY}) as http:
        no_max = http.post("/v1/messages", json={"model": SMOLLM2, "messages": ASK_WEATHER})
        not_json = http.post("/v1/messages", content=b"{")
    assert no_max.status_code == 400
    assert "max_tokens" in no_max.json()["error"]["message"]
    assert not_json.json()["error"]["type"] == "invalid_request_error"


# --- images, thinking: the tiny models -------------------------------------------------------


def image_block(raw: bytes) -> dict:
    source = {"type": "base64", "media_type": "image/png", "data": data_url(raw).split(",")[1]}
    return {"type": "image", "source": source}


def test_image_blocks_reach_the_model(llava_server):
    pytest.importorskip("PIL")
    c = client(llava_server)

    def ask(*blocks):
        content = [{"type": "text", "text": "What is this?"}, *blocks]
        return c.messages.create(
            model="tiny-llava", max_tokens=8, messages=[{"role": "user", "content": content}]
        )

    text, first, second = ask(), ask(image_block(picture(1))), ask(image_block(picture(2)))
    assert first.usage.input_tokens > text.usage.input_tokens
    assert first.content[0].text != second.content[0].text
    chat = llava_server.client().chat.completions.create(
        model="tiny-llava",
        messages=[{"role": "user", "content": [
            {"type": "text", "text": "What is this?"},
            {"type": "image_url", "image_url": {"url": data_url(picture(1))}}]}],
    )  # fmt: skip
    assert first.content[0].text == chat.choices[0].message.content
    assert first.usage.input_tokens == chat.usage.prompt_tokens
    with pytest.raises(anthropic.BadRequestError) as local:
        ask({"type": "image", "source": {"type": "url", "url": "file:///etc/passwd"}})
    assert "http(s)" in local.value.body["error"]["message"]


def test_thinking_comes_as_a_thinking_block_before_the_text(think_server):
    c = client(think_server)
    hi = [{"role": "user", "content": "hi"}]
    budget = {"type": "enabled", "budget_tokens": 3}
    message = c.messages.create(model="think", max_tokens=12, messages=hi, thinking=budget)
    thinking, text = message.content
    assert thinking.type == "thinking" and thinking.thinking and thinking.signature
    assert text.type == "text" and text.text
    chat = think_server.client().chat.completions.create(
        model="think", max_tokens=12, messages=hi, extra_body={"max_reasoning_tokens": 3}
    )
    assert thinking.thinking == chat.choices[0].message.reasoning_content
    assert text.text == chat.choices[0].message.content

    with c.messages.stream(model="think", max_tokens=12, messages=hi, thinking=budget) as stream:
        kinds = [event.type for event in stream]
        streamed = stream.get_final_message()
    assert kinds.index("thinking") < kinds.index("text") and "signature" in kinds
    assert [b.model_dump() for b in streamed.content] == [b.model_dump() for b in message.content]

    off = c.messages.create(
        model="think", max_tokens=12, messages=hi, thinking={"type": "disabled"}
    )
    assert [b.type for b in off.content] == ["text"]
    # The thinking block sent back in a later turn is accepted.
    again = c.messages.create(
        model="think", max_tokens=4, thinking=budget,
        messages=[*hi, {"role": "assistant", "content": [b.model_dump() for b in message.content]},
                  {"role": "user", "content": "more"}],
    )  # fmt: skip
    assert again.content


# --- what reaches the engine, the body limit, a client gone: ECHO ----------------------------


def test_the_engine_gets_the_conversation_as_chat_completions_would(echo_server):
    content = [{"type": "text", "text": "look"}, image_block(b"\x89PNG")]
    message = client(echo_server, api_key="unused").messages.create(
        model="echo-model", max_tokens=200, messages=[*CONVERSATION[:2], {"role": "user",
        "content": content}], system=[{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
    )  # fmt: skip
    transcript = json.loads(message.content[0].text[len("ECHO ") :])
    assert transcript == [
        {"role": "system", "content": "a\n\nb"},
        *CONVERSATION[:2],
        {"role": "user", "content": [{"type": "text", "text": "look"}, {"type": "image_url",
         "image_url": {"url": "data:image/png;base64," + image_block(b"\x89PNG")["source"]["data"]}}]},
    ]  # fmt: skip
    with pytest.raises(anthropic.APIStatusError) as too_large:
        client(echo_server, api_key="unused").messages.create(
            model="echo-model", max_tokens=8, messages=[{"role": "user", "content": "x" * 5000}]
        )
    assert too_large.value.status_code == 413
    assert too_large.value.body["error"]["type"] == "request_too_large"


def test_a_full_server_is_a_503_and_a_client_gone_mid_stream_a_499(slow_echo_server):
    stream = client(slow_echo_server, api_key="unused").messages.create(
        model="echo-model", max_tokens=100000, messages=ASK_WEATHER, stream=True
    )
    events = iter(stream)
    start = next(events)
    next(events), next(events)
    with pytest.raises(anthropic.APIStatusError) as full:  # the server's one place is taken
        client(slow_echo_server, api_key="unused").messages.create(
            model="echo-model", max_tokens=8, messages=ASK_WEATHER
        )
    assert full.value.status_code == 503
    assert full.value.body["error"]["type"] == "overloaded_error"
    stream.close()
    line = slow_echo_server.request_line(start.message.id)
    assert " POST /v1/messages 499 " in line
    slow_echo_server.wait_until_idle()


# --- a remote engine behind serve: REMOTE on the loopback OpenAI server --------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_remote_engine_answers_and_calls_tools(remote_server, stream):
    from tests.servers.llm_server import reply_text

    sdk = client(remote_server, api_key="unused")
    ask = [{"role": "user", "content": "Weather in Paris?"}]
    tool = {"name": "get_weather", "input_schema": {"type": "object"}}
    if stream:
        with sdk.messages.stream(model="test-model", max_tokens=64, messages=ask) as events:
            reply = events.get_final_message()
        with sdk.messages.stream(
            model="test-model", max_tokens=64, messages=ask, tools=[tool]
        ) as events:
            called = events.get_final_message()
    else:
        reply = sdk.messages.create(model="test-model", max_tokens=64, messages=ask)
        called = sdk.messages.create(model="test-model", max_tokens=64, messages=ask, tools=[tool])
    assert [block.type for block in reply.content] == ["text"]
    assert reply.content[0].text == reply_text("Weather in Paris?")
    assert reply.stop_reason == "end_turn"
    uses = [block for block in called.content if block.type == "tool_use"]
    assert [use.name for use in uses] == ["get_weather"] and called.stop_reason == "tool_use"
