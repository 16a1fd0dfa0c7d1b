"""Tools through `lmpress serve`: the official `openai` client offers tools to serve in front of a
remote engine (REMOTE and ANTHROPIC, pointed at the loopback server) and gets the call back,
whole or streamed as deltas the client assembles; an engine that takes no tools answers 400."""

from __future__ import annotations

import json

import openai
import pytest

from tests.servers.llm_server import LLMServer, reply_text

pytestmark = pytest.mark.timeout(300)

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city", "days"]}}}  # fmt: skip
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}
QUESTION = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module")
def upstream():
    with LLMServer() as server:
        yield server


@pytest.fixture(scope="module")
def anthropic_server(serve_process, upstream):
    return serve_process(
        "--engine", "ANTHROPIC", "--remote_params.api_url", upstream.anthropic_url,
        "--model.model_name", "test-model", "--remote_params.max_retries", "0",
        env={"ANTHROPIC_API_KEY": "sk-ant-test"},
    )  # fmt: skip


# REMOTE is the session's `remote_server` (the same arguments): a worker starts it once for
# every file that needs it.
@pytest.fixture(
    scope="module", params=["remote_server", "anthropic_server"], ids=["REMOTE", "ANTHROPIC"]
)
def served(request):
    return request.getfixturevalue(request.param)


def test_the_official_client_gets_the_call(served):
    completion = served.client().chat.completions.create(
        model="test-model", messages=QUESTION, tools=[WEATHER, TIME]
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.id
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "value", "days": 1}


def test_the_official_client_assembles_the_streamed_call(served):
    choice = {"type": "function", "function": {"name": "get_time"}}
    with served.client().chat.completions.stream(
        model="test-model", messages=QUESTION, tools=[WEATHER, TIME], tool_choice=choice
    ) as stream:
        events = [event.type for event in stream]
        completion = stream.get_final_completion()
    assert "tool_calls.function.arguments.done" in events
    [call] = completion.choices[0].message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_time", {})
    assert completion.choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize("stream", [False, True])
def test_a_call_and_its_result_sent_back_get_words(served, stream):
    first = served.client().chat.completions.create(
        model="test-model", messages=QUESTION, tools=[WEATHER]
    )
    call = first.choices[0].message.tool_calls[0]
    messages = [
        *QUESTION,
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "18 degrees"},
    ]
    client = served.client()
    if stream:
        pieces = client.chat.completions.create(
            model="test-model", messages=messages, tools=[WEATHER], stream=True
        )
        text = "".join(c.choices[0].delta.content or "" for c in pieces if c.choices)
    else:
        reply = client.chat.completions.create(
            model="test-model", messages=messages, tools=[WEATHER]
        )
        text = reply.choices[0].message.content
    assert text == reply_text("18 degrees")


def test_a_malformed_tool_is_400_naming_it(served):
    with pytest.raises(openai.BadRequestError) as caught:
        served.client().chat.completions.create(
            model="test-model", messages=QUESTION,
            tools=[{"type": "function", "function": {"name": "has space"}}],
        )  # fmt: skip
    assert caught.value.body["param"] == "tools"
    assert "'tools[0].function.name'" in caught.value.body["message"]


def test_an_engine_without_tools_answers_400(echo_server):
    with pytest.raises(openai.BadRequestError) as caught:
        echo_server.client().chat.completions.create(
            model="echo-model", messages=QUESTION, tools=[WEATHER]
        )
    body = caught.value.body
    assert body["code"] == "unsupported_parameter" and body["param"] == "tools"
    assert body["message"].startswith("engine ECHO cannot take tools")
