"""ANTHROPIC: the Messages API translation both ways, then the engine through the real
`anthropic` SDK against the test server (which enforces the API's rules on roles)."""

from __future__ import annotations

import asyncio

import pytest

from lmpress.configs import load_config
from lmpress.engines.registry import create_engine
from lmpress.vocabulary.errors import ConfigError, RequestError, UnsupportedParamError
from lmpress.vocabulary.types import (
    ContentPart,
    Delta,
    GenerationParams,
    Message,
    Request,
    Result,
    ToolCall,
)
from lmpress.wire.anthropic.client import convert_messages, parse_message, request_body
from lmpress.wire.replies import MalformedResponse
from tests.servers.llm_server import Faults, LLMServer, reply_text
from tests.servers.request_types import body_problem

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True)
def key(monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    for name in ("ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_BASE_URL"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def server():
    with LLMServer() as s:
        yield s


def make_engine(server: LLMServer | None, **overrides):
    values = {
        "engine": "ANTHROPIC",
        "model.model_name": "claude-test",
        "remote_params.retry_backoff_base": 0.01,
        "remote_params.retry_backoff_max": 0.5,
        "remote_params.connection_timeout": 2.0,
    }
    if server is not None:
        values["remote_params.api_url"] = server.anthropic_url
    values.update(overrides)
    return create_engine(load_config(None, values))


def run(engine, request: Request, stream: bool = False) -> tuple[list[Delta], Result]:
    async def go():
        try:
            if stream:
                return [item async for item in engine.stream(request)]
            return [await engine.complete(request)]
        finally:
            await engine.aclose()

    items = asyncio.run(go())
    return [i for i in items if isinstance(i, Delta)], items[-1]


def conversation(*turns: tuple[str, str], **params) -> Request:
    return Request("r", [Message(role, text) for role, text in turns], GenerationParams(**params))


# --- the translation ---------------------------------------------------------------------


def test_system_goes_to_its_own_field_and_same_role_turns_merge():
    system, turns = convert_messages([
        Message("system", "Be brief."),
        Message("user", "Hello."),
        Message("user", "Are you there?"),
        Message("assistant", "Yes."),
        Message("developer", "Answer in French."),
        Message("tool", "42"),
        Message("user", [ContentPart("text", text="And now?")]),
    ])  # fmt: skip
    assert system == "Be brief.\n\nAnswer in French."
    assert turns == [
        {"role": "user", "content": "Hello.\n\nAre you there?"},
        {"role": "assistant", "content": "Yes."},
        {"role": "user", "content": [{"type": "text", "text": "42"},
                                     {"type": "text", "text": "And now?"}]},
    ]  # fmt: skip


def test_images_become_image_blocks(tmp_path):
    image = tmp_path / "dot.jpg"
    image.write_bytes(b"\xff\xd8 fake jpeg")
    message = Message("user", [
        ContentPart("image_url", image_url="https://example.com/cat.png"),
        ContentPart("image_url", image_url="data:image/gif;base64,R0lGOD"),
        ContentPart("image_url", image_url=f"file://{image}"),
    ])  # fmt: skip
    _, turns = convert_messages([message])
    sources = [block["source"] for block in turns[0]["content"]]
    assert sources[0] == {"type": "url", "url": "https://example.com/cat.png"}
    assert sources[1] == {"type": "base64", "media_type": "image/gif", "data": "R0lGOD"}
    assert sources[2]["media_type"] == "image/jpeg" and sources[2]["type"] == "base64"


def test_request_body_maps_stop_strings_max_tokens_and_structured_output():
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    body = request_body(
        conversation(
            ("system", "S"),
            ("user", "hi"),
            max_new_tokens=12,
            stop_strings=["END"],
            guided_decoding={"json": schema},
        ),  # fmt: skip
        "claude-x",
    )
    assert body == {
        "model": "claude-x",
        "max_tokens": 12,
        "messages": [{"role": "user", "content": "hi"}],
        "system": "S",
        "stop_sequences": ["END"],
        "output_config": {"format": {"type": "json_schema", "schema": schema}},
    }
    with pytest.raises(RequestError, match="raw text prompt"):
        request_body(Request("r", [], prompt="Once"), "claude-x")
    with pytest.raises(RequestError, match="json"):
        request_body(conversation(("user", "hi"), guided_decoding={"regex": "a"}), "claude-x")


@pytest.mark.parametrize("stream", [False, True])
def test_a_body_with_everything_the_engine_sends_fits_the_sdk_type(stream):
    tools = [
        {
            "type": "function",
            "function": {
                "name": "lookup",
                "description": "Look it up.",
                "parameters": {"type": "object", "properties": {"w": {"type": "string"}}},
            },
        }
    ]
    request = Request("r", [
        Message("system", "Be brief."),
        Message("user", [ContentPart("text", "What are these?"),
                         ContentPart("image_url", image_url="https://example.com/cat.png"),
                         ContentPart("image_url", image_url="data:image/gif;base64,R0lGOD")]),
        Message("assistant", "Let me look.", tool_calls=[ToolCall("c1", "lookup", '{"w": "x"}')]),
        Message("tool", "a cat", tool_call_id="c1"),
    ], GenerationParams(max_new_tokens=9, stop_strings=["END"], tool_choice="required",
                        parallel_tool_calls=False, guided_decoding={"json_object": True}),
        tools=tools)  # fmt: skip
    engine = make_engine(None, **{"remote_params.user_id": "user-7"})
    body = {**engine.request_body(request), **({"stream": True} if stream else {})}
    assert body["metadata"] == {"user_id": "user-7"} and body["tool_choice"]["type"] == "any"
    assert body_problem(body, "messages") is None


def test_parse_message_reads_text_stop_reason_and_usage():
    reply = parse_message({
        "model": "claude-x", "content": [{"type": "thinking", "thinking": "hmm"},
                                         {"type": "text", "text": "Hel"},
                                         {"type": "text", "text": "lo"}],
        "stop_reason": "max_tokens",
        "usage": {"input_tokens": 5, "cache_read_input_tokens": 100,
                  "cache_creation_input_tokens": 7, "output_tokens": 3},
    })  # fmt: skip
    assert reply.samples[0].text == "Hello" and reply.samples[0].finish_reason == "length"
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (112, 3)
    assert parse_message({"content": [], "stop_reason": "end_turn"}).samples[0].finish_reason == (
        "stop"
    )
    for bad in ({}, {"content": "text"}, {"content": [{"type": "text"}]}, []):
        with pytest.raises(MalformedResponse):
            parse_message(bad)


# --- the engine against the test server -----------------------------------------------------


def test_complete_and_stream_round_trip(server):
    request = conversation(("system", "Be kind."), ("user", "Hi"), ("user", "what is up"))
    _, result = run(make_engine(server), request)
    assert result.ok, result.error
    assert result.text == reply_text("Hi\n\nwhat is up")  # the merged user turn
    assert result.usage.prompt_tokens > 0
    assert result.usage.completion_tokens == len(result.text.split())
    assert result.engine == "ANTHROPIC" and result.model == "claude-test"
    path, body = server.stats.bodies[-1]
    assert path == "/v1/messages" and body["system"] == "Be kind."
    assert server.stats.credentials == {"sk-ant-test"}

    deltas, streamed = run(make_engine(server), request, stream=True)
    assert len(deltas) > 3
    assert "".join(d.text for d in deltas) == streamed.text == result.text
    assert streamed.usage.completion_tokens == len(result.text.split())
    assert streamed.usage.prompt_tokens == result.usage.prompt_tokens


def test_max_tokens_and_stop_sequences_reach_the_server(server):
    _, short = run(make_engine(server), conversation(("user", "tell me more"), max_new_tokens=2))
    assert short.finish_reason == "length" and len(short.text.split()) == 2
    _, stopped = run(make_engine(server), conversation(("user", "tell me"), stop_strings=["me"]))
    assert stopped.text == reply_text("tell me").split("me")[0]
    assert stopped.samples[0].stop_sequence == "me"  # the reply's stop_sequence, kept
    request = conversation(("user", "tell me"), stop_strings=["me"])
    _, streamed = run(make_engine(server), request, stream=True)
    assert streamed.text == stopped.text and streamed.samples[0].stop_sequence == "me"
    assert short.samples[0].stop_sequence is None


def test_sampling_parameters_the_api_lacks_are_refused_up_front(server):
    with pytest.raises(UnsupportedParamError, match="temperature"):
        make_engine(server, **{"generation.temperature": 0.7})
    assert server.stats.requests == 0


def test_asking_for_the_sampling_the_api_always_uses_is_accepted_and_not_sent(server):
    """Oumi's Claude configs set temperature 1.0: what the Messages API does anyway."""
    engine = make_engine(server, **{"generation.temperature": 1.0, "generation.top_p": 1.0})
    _, result = run(engine, conversation(("user", "hello claude")))
    assert result.ok and result.text == reply_text("hello claude")
    path, body = server.stats.bodies[-1]
    assert path == "/v1/messages"
    assert "temperature" not in body and "top_p" not in body


def test_a_missing_key_fails_first_naming_the_variable(monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    with pytest.raises(ConfigError, match="ANTHROPIC_API_KEY"):
        make_engine(None)


@pytest.mark.parametrize("kind", ["429", "500", "hang", "drop", "malformed"])
@pytest.mark.parametrize("stream", [False, True])
def test_transient_faults_are_retried(kind, stream):
    faults = Faults(transient_rate=1.0, transient_kinds=(kind,), retry_after="0", hang_s=1.5,
                    stream_drop_after=0)  # fmt: skip
    with LLMServer(faults) as server:
        engine = make_engine(server, **{"remote_params.connection_timeout": 0.5})
        _, result = run(engine, conversation(("user", "a flaky question")), stream=stream)
        assert result.ok, result.error
        assert result.text == reply_text("a flaky question")
        assert server.stats.requests == 2


def test_a_bad_request_fails_at_once_with_the_servers_message():
    with LLMServer(Faults(permanent={"BAD": 400})) as server:
        _, result = run(make_engine(server), conversation(("user", "a BAD question")))
        assert result.error.status == 400 and result.error.kind == "bad_request"
        assert "refused" in result.error.message
        assert server.stats.requests == 1


def test_overloaded_529_is_retried():
    with LLMServer(Faults(permanent={"BUSY": 529})) as server:
        engine = make_engine(server, **{"remote_params.max_retries": 2})
        _, result = run(engine, conversation(("user", "BUSY now")))
        assert result.error.kind == "overloaded" and result.error.status == 529
        assert server.stats.requests == 3
