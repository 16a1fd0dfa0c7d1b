"""The loopback server refuses what the SDKs' own request types do not allow: an unknown field, or
one of the wrong type, is a 400 naming it, on the live endpoints and in a batch's rows alike."""

from __future__ import annotations

import typing
from typing import Any

import httpx
import pytest
from anthropic.types.message_create_params import MessageCreateParamsBase

from tests.servers.llm_server import Faults, LLMServer
from tests.servers.request_types import VLLM_EXTENSIONS, body_problem
from tests.servers.test_batch_api import (
    anthropic_client,
    chat_body,
    input_lines,
    make_server,
    message_params,
    openai_client,
    run_anthropic,
    run_openai,
)

CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def server():
    with LLMServer() as s:
        yield s


def post(server: LLMServer, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"http://127.0.0.1:{server.port}{path}", json=body, timeout=10)


def openai_error(response: httpx.Response) -> str:
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    return error["message"]


def anthropic_error(response: httpx.Response) -> str:
    assert response.status_code == 400
    body = response.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    return body["error"]["message"]


def test_a_body_that_fits_the_sdk_type_is_answered(server):
    assert post(server, CHAT, {**chat_body("hi"), "temperature": 0.5, "seed": 1}).status_code == 200
    completion = {"model": "gpt-test", "prompt": "once", "max_tokens": 3, "logprobs": 2}
    assert post(server, "/v1/completions", completion).status_code == 200
    assert post(server, "/v1/messages", message_params("hi")).status_code == 200


def test_an_unknown_field_gets_400_naming_it(server):
    message = openai_error(post(server, CHAT, {**chat_body("hi"), "temprature": 0.5}))
    assert message == "Unrecognized request argument supplied: temprature"
    message = openai_error(post(server, "/v1/completions", {"model": "m", "prompt": "p", "b": 1}))
    assert message == "Unrecognized request argument supplied: b"
    response = post(server, "/v1/messages", {**message_params("hi"), "stop": ["x"]})
    assert anthropic_error(response) == "stop: Extra inputs are not permitted"


def test_an_unknown_field_inside_a_message_is_named_by_its_path(server):
    body = {**chat_body("hi"), "messages": [{"role": "user", "content": "hi", "speaker": "me"}]}
    assert openai_error(post(server, CHAT, body)) == (
        "messages.0.speaker: Extra inputs are not permitted"
    )
    blocks = [{"type": "text", "text": "hi", "style": "bold"}]
    params = {**message_params("hi"), "messages": [{"role": "user", "content": blocks}]}
    assert anthropic_error(post(server, "/v1/messages", params)) == (
        "messages.0.content.0.style: Extra inputs are not permitted"
    )


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"temperature": "0.5"}, "temperature: Input should be a valid number"),
        ({"max_tokens": 2.5}, "max_tokens: Input should be a valid integer"),
        ({"stream": "yes"}, "stream: Input should be False"),
        ({"logit_bias": {"5": -100.0}}, "logit_bias.5: Input should be a valid integer"),
        ({"messages": [{"role": "user", "content": 7}]},
         "messages.0.content: Input should be a valid string"),
        ({"messages": [{"role": "human", "content": "hi"}]},
         "messages.0.role: Input should be 'developer' or 'system' or 'user' or 'assistant' or "
         "'tool' or 'function'"),
        ({"model": None}, "model: Input should be a valid string"),
    ],
)  # fmt: skip
def test_a_field_of_the_wrong_type_gets_400_naming_it(server, change, problem):
    assert openai_error(post(server, CHAT, {**chat_body("hi"), **change})) == problem


def test_a_missing_required_field_gets_400_naming_it(server):
    assert openai_error(post(server, CHAT, {"model": "gpt-test"})) == "messages: Field required"
    params = {"model": "claude-test", "messages": [{"role": "user", "content": "hi"}]}
    assert anthropic_error(post(server, "/v1/messages", params)) == "max_tokens: Field required"


def test_vllm_fields_are_taken_only_from_a_server_playing_vllm():
    body = {**chat_body("hi"), "top_k": 5, "structured_outputs": {"regex": "[a-z]+"}}
    with LLMServer() as openai_like:
        assert openai_error(post(openai_like, CHAT, body)) == (
            "Unrecognized request arguments supplied: structured_outputs, top_k"
        )
    with LLMServer(Faults(extensions=VLLM_EXTENSIONS)) as vllm_like:
        assert post(vllm_like, CHAT, body).status_code == 200
        # A field vLLM does not have is still refused, so a misspelt one is caught.
        assert openai_error(post(vllm_like, CHAT, {**body, "top_kk": 5})) == (
            "Unrecognized request argument supplied: top_kk"
        )


def test_anthropic_sampling_parameters_are_not_in_the_sdk_type(server):
    declared = typing.get_type_hints(MessageCreateParamsBase)
    assert {"temperature", "top_p", "top_k"}.isdisjoint(declared)
    assert {"max_tokens", "messages", "model", "stop_sequences", "system"} <= set(declared)
    response = post(server, "/v1/messages", {**message_params("hi"), "temperature": 1.0})
    assert anthropic_error(response) == "temperature: Extra inputs are not permitted"


def test_the_streaming_type_is_the_one_checked_for_a_streaming_body():
    body = {**chat_body("hi"), "stream": True, "stream_options": {"include_usage": True}}
    assert body_problem(body, "chat") is None
    assert body_problem({**body, "stream_options": {"usage": True}}, "chat") == (
        "stream_options.usage: Extra inputs are not permitted"
    )


def test_an_openai_batch_row_with_an_unknown_field_fails_with_that_400():
    rows = {"good": chat_body("fine"), "bad": {**chat_body("odd"), "temprature": 0.1}}
    with make_server() as server:
        seen, output, errors = run_openai(openai_client(server), input_lines(rows))
        assert seen[-1].request_counts.model_dump() == {"total": 2, "completed": 1, "failed": 1}
        assert [line["custom_id"] for line in output] == ["good"]
        (line,) = errors
        assert line["custom_id"] == "bad" and line["response"]["status_code"] == 400
        assert line["response"]["body"]["error"]["message"] == (
            "Unrecognized request argument supplied: temprature"
        )


def test_an_anthropic_batch_request_with_a_mistyped_param_comes_back_errored():
    params = {"good": message_params("fine"), "bad": {**message_params("odd"), "max_tokens": "64"}}
    with make_server() as server:
        _, results = run_anthropic(anthropic_client(server), params)
        assert results["good"].type == "succeeded"
        error = results["bad"].error.error
        assert (error.type, error.message) == (
            "invalid_request_error",
            "max_tokens: Input should be a valid integer",
        )
