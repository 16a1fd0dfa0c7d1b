"""Tool calls through the remote engines: OPENAI (chat completions) and ANTHROPIC (Messages),
each through its real SDK against the loopback server, which checks tool definitions and tool
turns as the real APIs do and calls the chosen tool with arguments from its schema."""

from __future__ import annotations

import asyncio
import json

import pytest

from lmpress.configs import load_config
from lmpress.engines.registry import create_engine
from lmpress.vocabulary.types import GenerationParams, Message, Request, Result, ToolCall
from tests.servers.llm_server import LLMServer, reply_text

pytestmark = pytest.mark.timeout(120)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 3},
            },
            "required": ["city", "unit", "days"],
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}}}  # fmt: skip
WEATHER_ARGS = {"city": "value", "unit": "celsius", "days": 3}


@pytest.fixture(autouse=True)
def keys(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    for name in ("OPENAI_ADMIN_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_BASE_URL"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def server():
    with LLMServer() as s:
        yield s


def engine_for(server: LLMServer, name: str):
    url = server.anthropic_url if name == "ANTHROPIC" else server.openai_url
    return create_engine(
        load_config(
            None,
            {
                "engine": name,
                "model.model_name": "m",
                "remote_params.api_url": url,
                "remote_params.retry_backoff_base": 0.01,
                "remote_params.max_retries": 0,
            },
        )  # fmt: skip
    )


def run(engine, request: Request, stream: bool) -> Result:
    async def go():
        try:
            if stream:
                return [item async for item in engine.stream(request)][-1]
            return await engine.complete(request)
        finally:
            await engine.aclose()

    return asyncio.run(go())


def ask(tools, tool_choice=None, parallel=True, messages=None) -> Request:
    params = GenerationParams(tool_choice=tool_choice, parallel_tool_calls=parallel)
    messages = messages or [Message("user", "What is the weather in Paris?")]
    return Request("r", messages, params, tools=tools)


ENGINES = ["OPENAI", "ANTHROPIC"]


@pytest.mark.parametrize("stream", [False, True], ids=["complete", "stream"])
@pytest.mark.parametrize("name", ENGINES)
def test_a_request_with_tools_gets_the_call_back(server, name, stream):
    result = run(engine_for(server, name), ask([WEATHER, TIME]), stream)
    assert result.error is None, result.error
    sample = result.samples[0]
    assert sample.finish_reason == "tool_calls"
    assert sample.text == ""
    [call] = sample.tool_calls
    assert call.name == "get_weather"
    assert json.loads(call.arguments) == WEATHER_ARGS
    assert call.id.startswith("toolu_" if name == "ANTHROPIC" else "call_")


@pytest.mark.parametrize("stream", [False, True], ids=["complete", "stream"])
@pytest.mark.parametrize("name", ENGINES)
def test_a_named_tool_choice_reaches_the_api(server, name, stream):
    choice = {"type": "function", "function": {"name": "get_time"}}
    result = run(engine_for(server, name), ask([WEATHER, TIME], choice, parallel=False), stream)
    [call] = result.samples[0].tool_calls
    assert (call.name, json.loads(call.arguments)) == ("get_time", {"zone": "value"})
    _, body = server.stats.bodies[-1]
    if name == "ANTHROPIC":
        assert body["tool_choice"] == {
            "type": "tool", "name": "get_time", "disable_parallel_tool_use": True
        }  # fmt: skip
        assert body["tools"][0] == {
            "name": "get_weather", "description": "The weather in a city.",
            "input_schema": WEATHER["function"]["parameters"],
        }  # fmt: skip
    else:
        assert body["tool_choice"] == choice
        assert body["parallel_tool_calls"] is False
        assert body["tools"] == [WEATHER, TIME]


@pytest.mark.parametrize("name", ENGINES)
def test_tool_choice_none_and_required_are_sent_in_the_apis_words(server, name):
    engine = engine_for(server, name)
    result = run(engine, ask([WEATHER], "none"), stream=False)
    assert result.samples[0].tool_calls is None
    assert result.text == reply_text("What is the weather in Paris?")
    run(engine_for(server, name), ask([WEATHER], "required"), stream=False)
    _, body = server.stats.bodies[-1]
    assert body["tool_choice"] == ({"type": "any"} if name == "ANTHROPIC" else "required")


@pytest.mark.parametrize("stream", [False, True], ids=["complete", "stream"])
@pytest.mark.parametrize("name", ENGINES)
def test_an_earlier_call_and_its_result_are_sent_back(server, name, stream):
    call = ToolCall("call_1", "get_weather", json.dumps(WEATHER_ARGS))
    messages = [
        Message("system", "Be brief."),
        Message("user", "What is the weather in Paris?"),
        Message("assistant", "Let me look.", tool_calls=[call]),
        Message("tool", "18 degrees and sunny", tool_call_id="call_1"),
    ]
    result = run(engine_for(server, name), ask([WEATHER], messages=messages), stream)
    assert result.error is None, result.error  # the server checks the call/result pairing
    assert result.samples[0].tool_calls is None
    assert result.text == reply_text("18 degrees and sunny")
    _, body = server.stats.bodies[-1]
    if name == "ANTHROPIC":
        assert body["messages"][1:] == [
            {"role": "assistant", "content": [
                {"type": "text", "text": "Let me look."},
                {"type": "tool_use", "id": "call_1", "name": "get_weather",
                 "input": WEATHER_ARGS}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "call_1",
                 "content": "18 degrees and sunny"}]},
        ]  # fmt: skip
    else:
        assert body["messages"][2:] == [
            {"role": "assistant", "content": "Let me look.", "tool_calls": [call.to_openai()]},
            {"role": "tool", "content": "18 degrees and sunny", "tool_call_id": "call_1"},
        ]


@pytest.mark.parametrize("name", ENGINES)
def test_a_tool_result_without_its_call_is_refused_by_the_api(server, name):
    messages = [Message("user", "hi"), Message("tool", "18", tool_call_id="call_9")]
    result = run(engine_for(server, name), ask([WEATHER], messages=messages), stream=False)
    assert result.error is not None and result.error.status == 400


@pytest.mark.parametrize("name", ENGINES)
def test_a_tool_choice_naming_no_tool_is_refused_before_sending(server, name):
    choice = {"type": "function", "function": {"name": "nope"}}
    result = run(engine_for(server, name), ask([WEATHER], choice), stream=False)
    assert result.error is not None and result.error.kind == "invalid_request"
    assert "'nope'" in result.error.message
    assert server.stats.requests == 0


@pytest.mark.parametrize("name", ENGINES)
def test_malformed_tools_made_in_python_are_refused_before_sending(server, name):
    result = run(engine_for(server, name), ask([{"name": "get_weather"}]), stream=False)
    assert result.error is not None and result.error.kind == "invalid_request"
    assert "'tools[0].function' must be an object" in result.error.message
    assert server.stats.requests == 0


def test_a_turn_that_only_called_goes_out_with_null_content(server):
    call = ToolCall("call_1", "get_weather", "{}")
    messages = [Message("user", "hi"), Message("assistant", "", tool_calls=[call]),
                Message("tool", "sunny", tool_call_id="call_1")]  # fmt: skip
    assert run(engine_for(server, "OPENAI"), ask([WEATHER], messages=messages), False).ok
    _, body = server.stats.bodies[-1]
    assert body["messages"][1] == {"role": "assistant", "content": None,
                                   "tool_calls": [call.to_openai()]}  # fmt: skip
