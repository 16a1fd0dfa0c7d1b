"""Gemini's own generateContent wire (`lmpress/wire/gemini.py`), checked against
the google-genai SDK's own types: every field lmpress writes is one the SDK's models know (they
refuse any other), and what the SDK reads from a response is what lmpress reads."""

from __future__ import annotations

import pytest

from lmpress.batch.provider.gemini import genai_base_url
from lmpress.vocabulary.errors import RequestError
from lmpress.vocabulary.types import ContentPart, GenerationParams, Message, Request, ToolCall
from lmpress.wire.gemini import generate_content_request, parse_generate_content

types = pytest.importorskip("google.genai.types")

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}  # fmt: skip
PIXEL = "data:image/png;base64,iVBORw0KGgo="
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}}}


def request(**params) -> Request:
    call = ToolCall("call_1", "get_weather", '{"city": "Paris"}')
    messages = [
        Message("system", "Be terse."),
        Message("user", [ContentPart("text", "Look:"), ContentPart("image_url", image_url=PIXEL)]),
        Message("assistant", "", tool_calls=[call], reasoning="hidden thoughts"),
        Message("tool", "sunny", tool_call_id="call_1"),
    ]
    return Request("r", messages, GenerationParams(**params), tools=[WEATHER])


def test_every_field_written_is_one_the_sdk_types_know():
    params = dict(max_new_tokens=64, temperature=0.5, top_p=0.9, stop_strings=["END"], seed=3,
                  n=2, presence_penalty=0.1, frequency_penalty=0.2, max_reasoning_tokens=32,
                  guided_decoding={"json": SCHEMA}, tool_choice="required")  # fmt: skip
    body = generate_content_request(request(**params))
    config = types.GenerationConfig.model_validate(body["generationConfig"])
    assert (config.max_output_tokens, config.temperature, config.top_p, config.seed,
            config.candidate_count) == (64, 0.5, 0.9, 3, 2)  # fmt: skip
    assert config.stop_sequences == ["END"]
    assert config.response_json_schema == SCHEMA
    assert config.thinking_config.thinking_budget == 32 and config.thinking_config.include_thoughts
    system = types.Content.model_validate(body["systemInstruction"])
    assert [p.text for p in system.parts] == ["Be terse."]
    contents = [types.Content.model_validate(c) for c in body["contents"]]
    assert [c.role for c in contents] == ["user", "model", "user"]
    assert contents[0].parts[1].inline_data.mime_type == "image/png"
    call = contents[1].parts[0].function_call
    assert (call.name, call.args, call.id) == ("get_weather", {"city": "Paris"}, "call_1")
    answer = contents[2].parts[0].function_response
    assert (answer.name, answer.response, answer.id) == ("get_weather", {"result": "sunny"},
                                                         "call_1")  # fmt: skip
    assert "hidden thoughts" not in str(body)  # an earlier turn's thinking is not sent back
    tool = types.Tool.model_validate(body["tools"][0])
    assert tool.function_declarations[0].parameters_json_schema == WEATHER["function"]["parameters"]
    assert types.ToolConfig.model_validate(body["toolConfig"]).function_calling_config.mode == "ANY"


@pytest.mark.parametrize("effort, budget", [("none", 0), ("low", 1024), ("high", 24576)])
def test_reasoning_effort_is_the_budget_googles_compatibility_layer_gives_it(effort, budget):
    config = generate_content_request(request(reasoning_effort=effort))["generationConfig"]
    assert config["thinkingConfig"] == {"thinkingBudget": budget}


def test_what_has_no_generate_content_form_is_refused_in_one_line():
    with pytest.raises(RequestError, match="parallel_tool_calls"):
        generate_content_request(request(parallel_tool_calls=False))
    orphan = Request("r", [Message("tool", "x", tool_call_id="nobody")])
    with pytest.raises(RequestError, match="no\\s+earlier assistant turn made"):
        generate_content_request(orphan)


def test_a_response_reads_as_the_sdk_reads_it():
    data = {
        "candidates": [
            {"index": 0, "finishReason": "MAX_TOKENS", "content": {"role": "model", "parts": [
                {"text": "Let me think.", "thought": True}, {"text": "Blue"}]}},
            {"index": 1, "finishReason": "STOP", "content": {"role": "model", "parts": [
                {"functionCall": {"name": "get_weather", "args": {"city": "Oslo"}}}]}},
        ],
        "usageMetadata": {"promptTokenCount": 7, "candidatesTokenCount": 5,
                          "thoughtsTokenCount": 3},
        "modelVersion": "gemini-2.5-flash",
    }  # fmt: skip
    sdk = types.GenerateContentResponse.model_validate(data)
    reply = parse_generate_content(data)
    first, second = reply.samples
    assert first.text == "".join(p.text for p in sdk.candidates[0].content.parts if not p.thought)
    assert (first.reasoning, first.finish_reason) == ("Let me think.", "length")
    call = sdk.candidates[1].content.parts[0].function_call
    assert [(c.name, c.arguments) for c in second.tool_calls] == [(call.name, '{"city": "Oslo"}')]
    assert second.finish_reason == "tool_calls" and second.tool_calls[0].id.startswith("call_")
    usage = sdk.usage_metadata
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens,
            reply.usage.reasoning_tokens) == (usage.prompt_token_count,
                                              usage.candidates_token_count
                                              + usage.thoughts_token_count,
                                              usage.thoughts_token_count)  # fmt: skip
    assert reply.model == sdk.model_version


@pytest.mark.parametrize(
    "url, base",
    [("https://generativelanguage.googleapis.com/v1beta/openai/",
      "https://generativelanguage.googleapis.com/"),
     ("http://127.0.0.1:8123/v1", "http://127.0.0.1:8123/"),
     ("https://proxy.example/gemini/v1beta/openai", "https://proxy.example/gemini/")],
)  # fmt: skip
def test_the_sdk_is_pointed_at_the_engine_host(url, base):
    assert genai_base_url(url) == base
