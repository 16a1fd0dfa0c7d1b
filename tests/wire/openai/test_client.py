"""The bodies `request_body` builds fit the `openai` SDK's own request types, for every
parameter OpenAI takes, read from a config as a user writes one."""

from __future__ import annotations

import dataclasses

import pytest

from lmpress.configs import load_config
from lmpress.engines.remote.presets import BY_NAME
from lmpress.vocabulary.types import ContentPart, GenerationParams, Message, Request, ToolCall
from lmpress.wire.openai.client import OPENAI_PARAMS, request_body
from tests.servers.request_types import VLLM_EXTENSIONS, body_problem

# A value away from the default for each parameter in OPENAI_PARAMS.
EVERY_PARAM = {
    "generation.max_new_tokens": 9, "generation.temperature": 0.7, "generation.top_p": 0.9,
    "generation.presence_penalty": 0.5, "generation.frequency_penalty": 1,
    "generation.stop_strings": ["END"], "generation.seed": 3, "generation.n": 2,
    "generation.logprobs": True, "generation.top_logprobs": 3,
    "generation.logit_bias": {"50256": -100},
    "generation.guided_decoding": {"json": {"type": "object"}},
}  # fmt: skip
TOOLS = [{"type": "function", "function": {
    "name": "lookup", "description": "Look a word up.",
    "parameters": {"type": "object", "properties": {"word": {"type": "string"}}}}}]  # fmt: skip
CONVERSATION = [
    Message("system", "Be brief."),
    Message("user", [ContentPart("text", "What is this?"),
                     ContentPart("image_url", image_url="https://example.com/cat.png")]),
    Message("assistant", "", tool_calls=[ToolCall("call_1", "lookup", '{"word": "cat"}')]),
    Message("tool", "a small feline", tool_call_id="call_1"),
]  # fmt: skip


def params(engine: str, **overrides) -> GenerationParams:
    return load_config(None, {"engine": engine, **EVERY_PARAM, **overrides}).generation


def test_every_openai_parameter_is_set_here():
    names = {key.removeprefix("generation.") for key in EVERY_PARAM}
    assert names == set(OPENAI_PARAMS)


@pytest.mark.parametrize("engine", ["OPENAI", "REMOTE"])
@pytest.mark.parametrize("stream", [False, True])
def test_a_chat_body_with_every_parameter_fits_the_sdk_type(engine, stream):
    p = params(engine)
    for request in (
        Request("r", CONVERSATION, p, tools=TOOLS),
        Request("r", CONVERSATION, dataclasses.replace(p, parallel_tool_calls=False,
                tool_choice={"type": "function", "function": {"name": "lookup"}}), tools=TOOLS),
        Request("r", CONVERSATION[:2], dataclasses.replace(p, guided_decoding=None)),
    ):  # fmt: skip
        body = request_body(request, "gpt-test", BY_NAME[engine].dialect, stream=stream)
        assert body_problem(body, "chat") is None


@pytest.mark.parametrize("stream", [False, True])
def test_a_completions_body_with_every_parameter_fits_the_sdk_type(stream):
    p = dataclasses.replace(params("REMOTE"), guided_decoding=None, logit_bias={"50256": -100.0})
    body = request_body(Request("r", [], p, prompt="Once upon"), "gpt-test", BY_NAME["REMOTE"].dialect,
                        stream=stream)  # fmt: skip
    assert body_problem(body, "completions") is None


def test_a_whole_number_logit_bias_goes_as_an_integer():
    """OpenAI's type takes integer biases; a config's -100 is read as the float -100.0. A
    fractional bias (vLLM takes one) goes as it is, for the server to take or refuse."""
    p = params("REMOTE", **{"generation.logit_bias": {"50256": -100, "13": 2.5}})
    assert p.logit_bias == {"50256": -100.0, "13": 2.5}
    body = request_body(Request("r", CONVERSATION, p), "m", BY_NAME["REMOTE"].dialect)
    assert body["logit_bias"] == {"50256": -100, "13": 2.5}
    assert type(body["logit_bias"]["50256"]) is int


def test_a_vllm_body_fits_the_sdk_type_beside_vllm_s_own_fields():
    vllm = {"generation.top_k": 5, "generation.min_p": 0.1, "generation.min_tokens": 2,
            "generation.stop_token_ids": [7], "generation.repetition_penalty": 1.1,
            "generation.skip_special_tokens": False,
            "generation.guided_decoding": {"regex": "[a-z]+"}}  # fmt: skip
    p = params("REMOTE_VLLM", **vllm)
    body = request_body(Request("r", CONVERSATION, p, tools=TOOLS), "m",
                        BY_NAME["REMOTE_VLLM"].dialect)  # fmt: skip
    assert body_problem(body, "chat", VLLM_EXTENSIONS) is None
    assert body_problem(body, "chat") == (
        "Unrecognized request arguments supplied: min_p, min_tokens, repetition_penalty, "
        "skip_special_tokens, stop_token_ids, structured_outputs, top_k"
    )
