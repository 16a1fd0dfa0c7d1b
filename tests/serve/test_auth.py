"""The API key: required on every route but /health and the API's description when set (from
LMPRESS_API_KEY or --api-key), vLLM's root routes included; never in the log; no key means no
check."""

from __future__ import annotations

import json

import openai
import pytest

KEY = "sk-lmpress-test-7f3a9c"
MODEL = "echo-model"
HI = [{"role": "user", "content": "hi"}]
V1_ROUTES = [
    ("GET", "/v1/models"),
    ("GET", f"/v1/models/{MODEL}"),
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/responses"),
    ("POST", "/v1/files"),
    ("GET", "/v1/files"),
    ("GET", "/v1/files/file-1/content"),
    ("POST", "/v1/batches"),
    ("GET", "/v1/batches"),
    ("POST", "/v1/batches/batch-1/cancel"),
    ("GET", "/metrics"),
    ("GET", "/v1/no-such-route"),
    # vLLM's routes beside /v1 run the model too
    ("POST", "/classify"),
    ("POST", "/pooling"),
    ("POST", "/score"),
    ("POST", "/rerank"),
    ("POST", "/v2/rerank"),
    ("POST", "/tokenize"),
    ("POST", "/detokenize"),
]


@pytest.fixture(scope="module")
def keyed_server(serve_process, echo_plugin, with_echo, tmp_path_factory):
    state = tmp_path_factory.mktemp("state")  # so the Files and Batches routes are there
    return serve_process(
        "--engine", "ECHO", "--model.model_name", MODEL, "--state-dir", str(state),
        env={**with_echo, "LMPRESS_API_KEY": KEY},
    )  # fmt: skip


@pytest.fixture(scope="module")
def with_echo(echo_plugin):
    from tests.conftest import with_plugin

    return with_plugin(echo_plugin)


@pytest.mark.parametrize(("method", "path"), V1_ROUTES)
@pytest.mark.parametrize("sent", [None, "Bearer wrong-key", KEY, f"Bearer {KEY}x", "Basic abc"])
def test_every_route_refuses_a_missing_or_wrong_key(keyed_server, method, path, sent):
    headers = {"authorization": sent} if sent else {}
    body = {"model": MODEL, "messages": HI, "prompt": "hi"}
    with keyed_server.http() as http:
        response = http.request(method, path, headers=headers, json=body)
    assert response.status_code == 401, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_api_key"
    assert KEY not in response.text


def test_the_right_key_is_let_in(keyed_server):
    client = keyed_server.client(api_key=KEY)
    assert [m.id for m in client.models.list().data] == [MODEL]
    reply = client.chat.completions.create(model=MODEL, messages=HI)
    assert reply.choices[0].message.content.startswith("ECHO ")
    assert client.completions.create(model=MODEL, prompt="hi").choices[0].text == 'ECHO "hi"'
    assert client.responses.create(model=MODEL, input="hi").output_text.startswith("ECHO ")
    line = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": MODEL, "messages": HI}}  # fmt: skip
    uploaded = client.files.create(file=("in.jsonl", json.dumps(line).encode()), purpose="batch")
    assert [f.id for f in client.files.list()] == [uploaded.id]
    assert client.batches.list().data == []
    with pytest.raises(openai.AuthenticationError):
        keyed_server.client(api_key="not-it").chat.completions.create(model=MODEL, messages=HI)
    with keyed_server.http() as http:  # the scheme's case does not matter (RFC 7235)
        assert http.get("/v1/models", headers={"authorization": f"bearer {KEY}"}).is_success


def test_health_and_the_api_description_need_no_key(keyed_server):
    with keyed_server.http() as http:
        assert http.get("/health").json()["status"] == "ok"
        assert http.get("/openapi.json").is_success


def test_the_key_is_never_logged(keyed_server, serve_process, with_echo):
    flagged = serve_process("--engine", "ECHO", "--api-key", KEY, env=with_echo)
    for served in (keyed_server, flagged):
        client = served.client(api_key=KEY)
        model = client.models.list().data[0].id  # "echo" when no model name is given
        reply = client.chat.completions.create(model=model, messages=HI)
        served.request_line(reply.id)
        with pytest.raises(openai.AuthenticationError):
            served.client(api_key=KEY + "-wrong").models.list()
        assert "API key required" in served.log  # the banner says a key is needed...
        assert KEY not in served.log  # ...and never what it is


def test_without_a_key_any_or_no_authorization_is_accepted(echo_server):
    assert echo_server.client(api_key="anything").models.list().data
    with echo_server.http() as http:
        assert http.get("/v1/models").status_code == 200
