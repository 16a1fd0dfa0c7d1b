"""`POST /v1/responses` through the official openai client's `responses.create` and
`responses.stream`, against a real `lmpress serve` on NATIVE: SmolLM2 (greedy, so the same
request through chat completions is the reference), the tiny LLaVA for images and tiny:think
for a reasoning model; ECHO for what reaches the engine and the server's limits, and REMOTE on
the loopback OpenAI server for a remote engine behind serve."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from lmpress.builtin_models.packaged import SMOLLM2
from tests.image_files import data_url, picture
from tests.servers.llm_server import reply_text

pytestmark = pytest.mark.timeout(600)

MODEL = "smol"
SYSTEM = "Answer in one word."
QUESTION = "What is the capital of France?"
CHAT = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
WEATHER = {
    "name": "get_weather",
    "description": "Current weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 16}},
    "required": ["city"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def smol(serve_process):
    return serve_process(
        "--engine", "NATIVE", "--model.model_name", SMOLLM2, "--serve.served_model_name", MODEL,
        "--generation.max_new_tokens", "24", "--generation.batch_size", "4",
    )  # fmt: skip


def chat_reply(served, messages, **kwargs):
    return served.client().chat.completions.create(model=MODEL, messages=messages, **kwargs)


def test_a_response_is_the_chat_completions_reply(smol):
    response = smol.client().responses.create(model=MODEL, instructions=SYSTEM, input=QUESTION)
    chat = chat_reply(smol, CHAT)
    assert response.status == "completed" and chat.choices[0].finish_reason == "stop"
    assert response.output_text == chat.choices[0].message.content
    [message] = response.output
    assert (message.type, message.role, message.status) == ("message", "assistant", "completed")
    usage = response.usage
    assert (usage.input_tokens, usage.output_tokens, usage.total_tokens) == (
        chat.usage.prompt_tokens, chat.usage.completion_tokens, chat.usage.total_tokens,
    )  # fmt: skip
    assert usage.output_tokens_details.reasoning_tokens == 0
    assert response.model_extra["store"] is False  # stateless: nothing was kept
    assert response.instructions == SYSTEM
    assert f" {response.id} POST /v1/responses 200 " in smol.request_line(response.id) + " "


def test_the_stream_gives_the_same_text_event_by_event(smol):
    whole = smol.client().responses.create(model=MODEL, instructions=SYSTEM, input=QUESTION)
    with smol.client().responses.stream(model=MODEL, instructions=SYSTEM, input=QUESTION) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [event.type for event in events]
    assert kinds[:4] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.content_part.added",
    ]  # fmt: skip
    assert kinds[-4:] == [
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.completed",
    ]  # fmt: skip
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert [event.sequence_number for event in events] == list(range(len(events)))
    deltas = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    assert deltas == final.output_text == whole.output_text
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert events[-2].item.id == final.output[0].id  # the ids streamed are the response's


def test_input_items_of_several_turns_are_the_chat_conversation(smol):
    items = [
        {"role": "developer", "content": SYSTEM},
        {"role": "user", "content": [{"type": "input_text", "text": "What is the capital of Italy?"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Rome."}]},
        {"role": "user", "content": QUESTION},
    ]  # fmt: skip
    response = smol.client().responses.create(model=MODEL, input=items)
    chat = chat_reply(smol, [
        {"role": "developer", "content": SYSTEM},
        {"role": "user", "content": [{"type": "text", "text": "What is the capital of Italy?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Rome."}]},
        {"role": "user", "content": QUESTION},
    ])  # fmt: skip
    assert response.output_text == chat.choices[0].message.content
    assert response.usage.input_tokens == chat.usage.prompt_tokens


def test_a_function_call_and_its_output_sent_back(smol):
    client = smol.client()
    asked = [{"role": "user", "content": "What's the weather in Paris?"}]
    tool = {"type": "function", "strict": True, **WEATHER}
    first = client.responses.create(
        model=MODEL, input=asked, tools=[tool], tool_choice="required", max_output_tokens=48
    )
    [call] = first.output
    assert (call.type, call.name, call.status) == ("function_call", "get_weather", "completed")
    assert call.call_id and call.id
    jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])

    result = {"type": "function_call_output", "call_id": call.call_id, "output": "18 degrees"}
    second = client.responses.create(
        model=MODEL, input=[*asked, *first.output, result], tools=[tool], max_output_tokens=8
    )
    chat = chat_reply(smol, [
        *asked,
        {"role": "assistant", "tool_calls": [{"id": call.call_id, "type": "function",
            "function": {"name": call.name, "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": call.call_id, "content": "18 degrees"},
    ], tools=[{"type": "function", "function": {**WEATHER, "strict": True}}], max_tokens=8)  # fmt: skip
    assert second.output_text == chat.choices[0].message.content
    assert second.usage.input_tokens == chat.usage.prompt_tokens


def test_a_streamed_function_call(smol):
    with smol.client().responses.stream(
        model=MODEL, input="What's the weather in Paris?", max_output_tokens=48,
        tools=[{"type": "function", "strict": True, **WEATHER}],
        tool_choice={"type": "function", "name": "get_weather"},
    ) as stream:  # fmt: skip
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done", "response.completed",
    ]  # fmt: skip
    [call] = final.output
    assert call.name == "get_weather"
    assert call.parsed_arguments == json.loads(call.arguments)  # the client parsed a strict tool's
    jsonschema.validate(call.parsed_arguments, WEATHER["parameters"])


def test_text_format_json_schema_gives_valid_json(smol):
    text = {"format": {"type": "json_schema", "name": "city", "schema": SCHEMA, "strict": True}}
    response = smol.client().responses.create(
        model=MODEL, input="Describe Paris.", text=text, max_output_tokens=64
    )
    assert response.status == "completed"
    jsonschema.validate(json.loads(response.output_text), SCHEMA)


def test_max_output_tokens_makes_the_response_incomplete(smol):
    response = smol.client().responses.create(
        model=MODEL, input="Why is the sky blue?", max_output_tokens=3
    )
    assert response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.output[0].status == "incomplete"
    assert response.usage.output_tokens == 3
    stream = smol.client().responses.create(
        model=MODEL, input="Why is the sky blue?", max_output_tokens=3, stream=True
    )
    *_, last = stream
    assert last.type == "response.incomplete" and last.response.output_text == response.output_text


def test_what_lmpress_cannot_do_is_refused_in_one_line(smol):
    client = smol.client()
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model=MODEL, input=QUESTION, previous_response_id="resp_123")
    assert caught.value.body["param"] == "previous_response_id"
    assert "lmpress keeps no responses" in caught.value.message
    assert "send the whole conversation as 'input'" in caught.value.message
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model=MODEL, input=QUESTION, tools=[{"type": "web_search"}])
    assert caught.value.body["param"] == "tools[0]"
    assert '"web_search" tool; lmpress runs no built-in tools' in caught.value.message
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model=MODEL, input=[{"type": "item_reference", "id": "x"}])
    assert "'input[0].type': \"item_reference\" is not an input item" in caught.value.message
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="other", input=QUESTION)


# --- images: the tiny LLaVA ---------------------------------------------------------------------


def test_an_input_image_reaches_the_model(llava_server):
    url = data_url(picture(1))
    response = llava_server.client().responses.create(
        model="tiny-llava",
        input=[{"role": "user", "content": [
            {"type": "input_text", "text": "What is this?"},
            {"type": "input_image", "image_url": url, "detail": "auto"}]}],
    )  # fmt: skip
    chat = llava_server.client().chat.completions.create(
        model="tiny-llava",
        messages=[{"role": "user", "content": [
            {"type": "text", "text": "What is this?"},
            {"type": "image_url", "image_url": {"url": url}}]}],
    )  # fmt: skip
    assert response.output_text == chat.choices[0].message.content
    assert response.usage.input_tokens == chat.usage.prompt_tokens
    with pytest.raises(openai.BadRequestError) as caught:
        llava_server.client().responses.create(
            model="tiny-llava",
            input=[{"role": "user", "content": [{"type": "input_image", "file_id": "file-1"}]}],
        )
    assert "lmpress keeps no files" in caught.value.message
    with pytest.raises(openai.BadRequestError) as caught:
        llava_server.client().responses.create(
            model="tiny-llava",
            input=[
                {"role": "user", "content": [{"type": "input_image", "image_url": "/etc/x.png"}]}
            ],
        )
    assert "the server reads no local files for a client" in caught.value.message
    assert caught.value.body["param"] == "input"


# --- a reasoning model: tiny:think ------------------------------------------------------------


def test_a_reasoning_model_gives_a_reasoning_item(think_server):
    client = think_server.client()
    response = client.responses.create(model="think", input="hi")
    chat = client.chat.completions.create(
        model="think", messages=[{"role": "user", "content": "hi"}]
    )
    reasoning, message = response.output
    assert reasoning.type == "reasoning" and reasoning.summary == []
    assert reasoning.content[0].text == chat.choices[0].message.reasoning_content
    assert message.content[0].text == chat.choices[0].message.content
    assert response.usage.output_tokens_details.reasoning_tokens == 4

    stream = client.responses.create(model="think", input="hi", stream=True)
    events = list(stream)
    thinking = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert (thinking, text) == (reasoning.content[0].text, message.content[0].text)
    kinds = [e.type for e in events if e.type.endswith(".delta")]
    assert kinds == sorted(kinds, key=lambda kind: kind == "response.output_text.delta")
    assert [item.type for item in events[-1].response.output] == ["reasoning", "message"]
    assert events[-1].response.usage.output_tokens_details.reasoning_tokens == 4


# --- what reaches the engine, and the server's limits: ECHO -------------------------------------


def test_input_items_reach_the_engine_as_chat_messages(echo_server):
    items = [
        {"role": "developer", "content": "Be kind."},
        {"role": "user", "content": [{"type": "input_text", "text": "a"},
                                     {"type": "input_text", "text": "b"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [],
         "content": [{"type": "reasoning_text", "text": "hmm"}]},
        {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
         "content": [{"type": "output_text", "text": "Rome.", "annotations": []}]},
        {"role": "user", "content": "c"},
    ]  # fmt: skip
    response = echo_server.client().responses.create(
        model="echo-model", instructions="Be brief.", input=items
    )
    assert json.loads(response.output_text[len("ECHO ") :]) == [
        {"role": "system", "content": "Be brief."},
        {"role": "developer", "content": "Be kind."},
        {"role": "user", "content": "ab"},
        {"role": "assistant", "content": "Rome.", "reasoning": "hmm"},
        {"role": "user", "content": "c"},
    ]


def test_a_body_over_the_limit_is_a_413(echo_server):
    with echo_server.http() as http:
        reply = http.post("/v1/responses", json={"model": "echo-model", "input": "x" * 5000})
    assert reply.status_code == 413
    assert "serve.max_body_bytes" in reply.json()["error"]["message"]


def test_a_client_that_leaves_mid_stream_cancels_its_response(slow_echo_server):
    stream = slow_echo_server.client().responses.create(
        model="echo-model", input="hi " * 50, stream=True
    )
    events = stream.__iter__()
    created = next(events)
    assert created.type == "response.created"
    while next(events).type != "response.output_text.delta":
        pass
    stream.close()
    line = slow_echo_server.request_line(created.response.id)
    assert " POST /v1/responses 499 " in line
    slow_echo_server.wait_until_idle()


def test_reasoning_effort_reaches_the_engine_by_its_name(echo_server):
    client = echo_server.client()
    assert client.responses.create(model="echo-model", input="hi", reasoning={"effort": "none"})
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model="echo-model", input="hi", reasoning={"effort": "max"})
    assert caught.value.body["param"] == "reasoning.effort"
    assert "'reasoning.effort': 'max' must be one of none, minimal" in caught.value.message


# --- a remote engine behind serve: REMOTE on the loopback OpenAI server --------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_a_remote_engine_answers_and_calls_tools(remote_server, stream):
    client = remote_server.client()
    if stream:
        with client.responses.stream(model="test-model", input="Weather in Paris?") as events:
            text = events.get_final_response().output_text
    else:
        text = client.responses.create(model="test-model", input="Weather in Paris?").output_text
    assert text == reply_text("Weather in Paris?")
    tool = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}
    if stream:
        with client.responses.stream(model="test-model", input="Hi", tools=[tool]) as events:
            output = events.get_final_response().output
    else:
        output = client.responses.create(model="test-model", input="Hi", tools=[tool]).output
    [call] = output
    assert (call.type, call.name) == ("function_call", "get_weather")


def test_metrics_count_a_streamed_response(echo_server):
    from tests.serve.test_metrics_serve import requests_total, scrape, value

    model = {"model_name": "echo-model"}
    echo_server.wait_until_idle()
    before = scrape(echo_server)
    stream = echo_server.client().responses.create(model="echo-model", input="hi", stream=True)
    usage = list(stream)[-1].response.usage
    echo_server.wait_until_idle()
    after = scrape(echo_server)

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert (
        requests_total(after, "/v1/responses", "POST", 200)
        - requests_total(before, "/v1/responses", "POST", 200)
        == 1
    )
    assert moved("vllm:time_to_first_token_seconds_count", **model) == 1
    assert moved("vllm:prompt_tokens_total", **model) == usage.input_tokens
    assert moved("vllm:generation_tokens_total", **model) == usage.output_tokens
