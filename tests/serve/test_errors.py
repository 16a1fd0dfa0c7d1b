"""Bad requests get OpenAI error objects with the right status; a full queue gets 503; a client
that goes away is cancelled. Mostly against ECHO, whose reply shows what reached the engine."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

MODEL = "echo-model"
HI = [{"role": "user", "content": "hi"}]


def chat(**fields) -> dict:
    return {"model": MODEL, "messages": HI, **fields}


def assert_error(response: httpx.Response, status: int, param: str | None = None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    if param is not None:
        assert error["param"] == param, error
    return error


def test_what_reaches_the_engine(echo_server):
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "hello "}, {"type": "text", "text": "there"}]},
    ]  # fmt: skip
    reply = echo_server.client().chat.completions.create(model=MODEL, messages=messages)
    sent = json.loads(reply.choices[0].message.content.removeprefix("ECHO "))
    assert sent == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hello there"},
    ]


@pytest.mark.parametrize("argument", ["max_tokens", "max_completion_tokens"])
def test_max_tokens_reaches_the_engine(echo_server, argument):
    reply = echo_server.client().chat.completions.create(model=MODEL, messages=HI, **{argument: 2})
    assert reply.choices[0].message.content == 'ECHO [{"role":'
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens == 2


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b"{not json", None),
        (b"[1, 2]", None),
        (json.dumps({"messages": HI}).encode(), "model"),
        (json.dumps({"model": MODEL}).encode(), "messages"),
        (json.dumps(chat(messages="hi")).encode(), "messages"),
        (json.dumps(chat(temperature="hot")).encode(), "temperature"),
        (json.dumps(chat(n=1.5)).encode(), "n"),
        (json.dumps(chat(stream="yes")).encode(), "stream"),
        (json.dumps(chat(stop=["ok", 5])).encode(), "stop"),
        (json.dumps(chat(stop="")).encode(), "stop"),
        (json.dumps(chat(bogus=1)).encode(), "bogus"),
        (json.dumps(chat(n=0)).encode(), "n"),
        (json.dumps(chat(max_tokens=0)).encode(), "max_tokens"),
        (json.dumps(chat(temperature=-1)).encode(), "temperature"),
        (json.dumps(chat(stream_options={"include_usage": True})).encode(), "stream_options"),
        (json.dumps(chat(top_logprobs=2)).encode(), "top_logprobs"),
        (json.dumps(chat(tools=[{"type": "function", "function": {"name": "f"}}])).encode(), "tools"),
        (json.dumps(chat(response_format={"type": "yaml"})).encode(), "response_format"),
    ],
)  # fmt: skip
def test_malformed_chat_bodies_are_400(echo_server, body, param):
    with echo_server.http() as http:
        response = http.post("/v1/chat/completions", content=body)
    error = assert_error(response, 400, param)
    assert error["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    ("messages", "says"),
    [
        ([], "'messages' is empty"),
        ([{"role": "robot", "content": "hi"}], 'unknown role "robot"'),
        ([{"content": "hi"}], "unknown role null"),
        (["hi"], "must be an object"),
        ([{"role": "user", "content": [{"type": "audio"}]}], 'unknown type "audio"'),
    ],
)
def test_invalid_messages_are_400_through_the_official_client(echo_server, messages, says):
    with pytest.raises(openai.BadRequestError) as caught:
        echo_server.client().chat.completions.create(model=MODEL, messages=messages)
    assert caught.value.status_code == 400
    assert says in caught.value.body["message"]
    assert caught.value.body["param"] == "messages"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"top_p": 0.5}, "top_p"),
        ({"logprobs": True}, "logprobs"),
        ({"presence_penalty": 1}, "presence_penalty"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"top_k": 5}, "top_k"),
    ],
)  # fmt: skip
def test_a_parameter_the_engine_does_not_support_is_400(echo_server, fields, param):
    with echo_server.http() as http:
        response = http.post("/v1/chat/completions", json=chat(**fields))
    error = assert_error(response, 400, param)
    assert "engine ECHO does not support" in error["message"]
    assert error["code"] == "unsupported_parameter"


def test_arguments_at_their_neutral_values_are_accepted(echo_server):
    """What generic clients send along: nulls, empty lists, the defaults."""
    body = chat(
        tools=[], tool_choice="none", response_format={"type": "text"}, logprobs=False,
        top_logprobs=0, stop=None, logit_bias={}, user="u1", metadata={"a": "b"}, store=False,
        parallel_tool_calls=True, stream=False, stream_options=None, n=1,
    )  # fmt: skip
    with echo_server.http() as http:
        response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text


def test_malformed_completion_bodies_are_400(echo_server):
    bad = [
        ({"model": MODEL, "prompt": [1, 2, 3]}, "prompt"),
        ({"model": MODEL, "prompt": []}, "prompt"),
        ({"model": MODEL, "prompt": "x", "suffix": "y"}, "suffix"),
        ({"model": MODEL, "prompt": "x", "messages": HI}, "messages"),
    ]
    with echo_server.http() as http:
        for body, param in bad:
            assert_error(http.post("/v1/completions", json=body), 400, param)


def test_unknown_model_is_404(echo_server):
    client = echo_server.client()
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="gpt-4o", messages=HI)
    assert caught.value.body["code"] == "model_not_found"
    assert "echo-model" in caught.value.body["message"]  # says what is served
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4o", prompt="hi")
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o")


def test_unknown_route_is_an_openai_404(echo_server):
    with echo_server.http() as http:
        error = assert_error(http.get("/v1/moderations"), 404)
        assert "/v1/moderations" in error["message"]
        assert_error(http.get("/v1/chat/completions"), 405)


def test_a_body_over_the_limit_is_413(echo_server):
    big = chat(messages=[{"role": "user", "content": "x" * 5000}])  # the limit is 4096 bytes
    with echo_server.http() as http:
        error = assert_error(http.post("/v1/chat/completions", json=big), 413)
        assert "4096" in error["message"]

        def chunked():  # no Content-Length: counted as it arrives
            data = json.dumps(big).encode()
            for i in range(0, len(data), 1000):
                yield data[i : i + 1000]

        assert_error(http.post("/v1/chat/completions", content=chunked()), 413)
        assert http.post("/v1/chat/completions", json=chat()).status_code == 200


def test_a_full_queue_is_503_and_a_client_that_leaves_frees_its_place(slow_echo_server):
    served = slow_echo_server  # room for one request; ECHO says 20 words a second
    long = [{"role": "user", "content": "word " * 2000}]
    client = served.client()
    body = chat(messages=long, stream=True)
    with served.http() as http, http.stream("POST", "/v1/chat/completions", json=body) as held:
        assert held.status_code == 200
        request_id = held.headers["x-request-id"]
        lines = held.iter_lines()  # kept: dropping it would close the connection
        assert next(lines).startswith("data: ")  # it is generating
        with pytest.raises(openai.InternalServerError) as caught:
            client.chat.completions.create(model=MODEL, messages=HI)
        assert caught.value.status_code == 503
        assert caught.value.body["code"] == "queue_full"
        assert caught.value.response.headers["retry-after"] == "1"
    # leaving the block dropped the connection mid-stream
    assert " 499 " in served.request_line(request_id)
    served.wait_until_idle()
    reply = client.chat.completions.create(model=MODEL, messages=HI)
    assert reply.choices[0].message.content.startswith("ECHO ")


def test_a_client_that_leaves_before_a_non_streamed_reply_is_cancelled(slow_echo_server):
    served = slow_echo_server
    long = [{"role": "user", "content": "word " * 2000}]
    cancelled_before = served.log.count(" 499 ")
    # The reply would take 100 s; the client gives up after 1 s and drops the connection.
    with pytest.raises(httpx.ReadTimeout), served.http(timeout=httpx.Timeout(60, read=1.0)) as http:
        http.post("/v1/chat/completions", json=chat(messages=long))
    served.wait_for_log(lambda _: served.log.count(" 499 ") > cancelled_before)
    [line] = [line for line in served.lines if " 499 " in line][cancelled_before:]
    assert " POST /v1/chat/completions 499 tokens=- " in line
    served.wait_until_idle()
    assert served.client().chat.completions.create(model=MODEL, messages=HI).choices


def test_request_log_has_no_content_unless_asked(llama_server, echo_server):
    marker = "zebra-marker-31337"
    messages = [{"role": "user", "content": marker}]
    reply = llama_server.client().chat.completions.create(
        model="tiny-llama", messages=messages, max_tokens=2
    )
    assert marker not in llama_server.request_line(reply.id)
    assert marker not in llama_server.log
    reply = echo_server.client().chat.completions.create(model=MODEL, messages=messages)
    line = echo_server.request_line(reply.id)  # this one runs with --log-content
    assert marker in line
    content = json.loads(line.split(" content=", 1)[1])
    assert content["messages"] == messages
    assert content["reply"] == [reply.choices[0].message.content]
