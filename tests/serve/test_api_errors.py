"""Malformed requests that once answered 500, a traceback or FastAPI's own shapes (issue 49):
each is now a 4xx in its API's error shape, OpenAI's or Anthropic's on /v1/messages, and a 405
names in `Allow` the methods its path takes. Against the tiny Llama on NATIVE, with the Files
and Batch routes on."""

from __future__ import annotations

import httpx
import pytest

from tests.serve.test_errors import assert_error

MODEL = "tiny-llama"
HI = [{"role": "user", "content": "hi"}]


def deep(levels: int) -> bytes:
    """A chat body whose metadata nests `levels` arrays deep."""
    return (
        b'{"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}], "metadata": '
        + b'{"a": '
        + b"[" * levels
        + b"]" * levels
        + b"}}"
    )


def assert_anthropic_error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
    return body["error"]


def assert_not_leaked(served, response: httpx.Response) -> None:
    assert "Traceback" not in response.text and "detail" not in response.json()
    assert "Traceback" not in served.log


def test_an_empty_prompt_is_a_400_naming_prompt(llama_server):
    with llama_server.http() as http:
        for prompt in ("", ["a", ""]):
            response = http.post("/v1/completions", json={"model": MODEL, "prompt": prompt})
            error = assert_error(response, 400, "prompt")
            assert "empty" in error["message"]
            assert "tensor" not in error["message"].lower()
        # A chat message with no text still has its template's tokens: answered.
        empty = [{"role": "user", "content": ""}]
        body = {"model": MODEL, "messages": empty, "max_tokens": 2}
        assert http.post("/v1/chat/completions", json=body).status_code == 200
    assert_not_leaked(llama_server, response)


@pytest.mark.parametrize(
    ("reasoning", "param"),
    [
        ({"generate_summary": ""}, "reasoning.generate_summary"),
        ({"summary": "brief"}, "reasoning.summary"),
    ],
)
def test_a_responses_setting_the_response_cannot_repeat_is_a_400(llama_server, reasoning, param):
    body = {"model": MODEL, "input": "hi", "reasoning": reasoning}
    with llama_server.http() as http:
        response = http.post("/v1/responses", json=body)
    error = assert_error(response, 400, param)
    assert "ValidationError" not in error["message"]
    assert_not_leaked(llama_server, response)


def test_metadata_the_response_cannot_repeat_is_a_400(llama_server):
    body = {"model": MODEL, "input": "hi", "metadata": {"n": 1}}  # Responses' values are strings
    with llama_server.http() as http:
        assert_error(http.post("/v1/responses", json=body), 400, "metadata.n")


@pytest.mark.parametrize("levels", [70, 900, 100_000])
def test_a_body_nested_too_deep_is_a_400(llama_server, levels):
    with llama_server.http() as http:
        response = http.post("/v1/chat/completions", content=deep(levels))
        error = assert_error(response, 400)
        assert "more than 64 deep" in error["message"]
        response = http.post("/v1/messages", content=deep(levels))
        assert "more than 64 deep" in assert_anthropic_error(response, 400)["message"]
        # Nesting within the limit is read as any body is.
        assert http.post("/v1/chat/completions", content=deep(40)).status_code == 200
    assert "RecursionError" not in llama_server.log
    assert_not_leaked(llama_server, response)


@pytest.mark.parametrize(
    ("query", "param"),
    [("limit=abc", "limit"), ("limit=0", "limit"), ("limit=1.5", "limit")],
)
def test_a_query_parameter_of_the_wrong_type_is_an_openai_400(llama_server, query, param):
    with llama_server.http() as http:
        response = http.get(f"/v1/files?{query}")
        assert_error(response, 400, param)
        assert_error(http.get(f"/v1/batches?{query}"), 400, param)
    assert_not_leaked(llama_server, response)


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("GET", "/v1/chat/completions", "POST"),
        ("DELETE", "/v1/models", "GET"),
        ("PUT", "/v1/files", "GET, POST"),
        ("POST", "/v1/files/file-1", "DELETE, GET"),
        ("PATCH", "/health", "GET"),
    ],
)
def test_a_method_the_path_does_not_take_is_405_with_allow(llama_server, method, path, allowed):
    with llama_server.http() as http:
        response = http.request(method, path)
    error = assert_error(response, 405)
    assert response.headers["allow"] == allowed
    assert error["code"] == "method_not_allowed"


def test_a_405_on_the_messages_routes_is_in_anthropics_shape(llama_server):
    with llama_server.http() as http:
        response = http.get("/v1/messages")
    assert_anthropic_error(response, 405)
    assert response.headers["allow"] == "POST"


def test_a_bug_answers_500_with_the_request_id_and_logs_the_traceback(serve_process, echo_plugin):
    from tests.conftest import with_plugin

    served = serve_process(
        "--engine", "ECHO", "--model.model_name", "echo-model",
        env={**with_plugin(echo_plugin), "ECHO_RAISE": "Expected tensor of type Long"},
    )  # fmt: skip
    body = {"model": "echo-model", "messages": HI}
    with served.http() as http:
        response = http.post("/v1/chat/completions", json=body)
        error = assert_error(response, 500)
        assert error["type"] == "server_error"
        assert "tensor" not in error["message"] and "RuntimeError" not in error["message"]
        request_id = response.headers["x-request-id"]
        assert request_id in error["message"]
    with served.http() as http:  # a new connection: uvicorn closes one whose request raised
        messages = http.post("/v1/messages", json={**body, "max_tokens": 4})
        assert_anthropic_error(messages, 500)
    line = served.wait_for_log(lambda line: "Expected tensor of type Long" in line)
    assert "RuntimeError" in line  # the detail is the server's
