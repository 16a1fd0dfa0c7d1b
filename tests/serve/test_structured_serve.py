"""The official `openai` client against `lmpress serve` on NATIVE with the real SmolLM2 model:
`response_format` json_schema and `tools`, non-streaming and streaming, give valid results."""

from __future__ import annotations

import json

import jsonschema
import pytest

from lmpress.builtin_models.packaged import SMOLLM2

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 16},
        "population": {"type": "integer", "minimum": 0},
        "landmarks": {"type": "array", "items": {"type": "string", "maxLength": 16}, "maxItems": 2},
    },
    "required": ["city", "population", "landmarks"],
    "additionalProperties": False,
}
RESPONSE_FORMAT = {
    "type": "json_schema",
    "json_schema": {"name": "city", "schema": SCHEMA, "strict": True},
}
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 30},
            "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"], "additionalProperties": False}}},
]  # fmt: skip
QUESTION = [{"role": "user", "content": "Describe Paris."}]


@pytest.fixture(scope="module")
def smollm2_server(serve_process):
    return serve_process(
        "--engine", "NATIVE", "--model.model_name", SMOLLM2, "--serve.served_model_name", "smol",
        "--generation.max_new_tokens", "96", "--generation.batch_size", "4",
    )  # fmt: skip


def test_response_format_json_schema(smollm2_server):
    reply = smollm2_server.client().chat.completions.create(
        model="smol", messages=QUESTION, response_format=RESPONSE_FORMAT
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "stop"
    jsonschema.validate(json.loads(choice.message.content), SCHEMA)


def test_response_format_json_schema_streamed(smollm2_server):
    stream = smollm2_server.client().chat.completions.create(
        model="smol", messages=QUESTION, response_format=RESPONSE_FORMAT, stream=True
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(chunks) > 3
    jsonschema.validate(json.loads(text), SCHEMA)


def test_tools_with_a_required_call(smollm2_server):
    reply = smollm2_server.client().chat.completions.create(
        model="smol",
        messages=[{"role": "user", "content": "What's the weather in Paris?"}],
        tools=TOOLS,
        tool_choice="required",
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), TOOLS[0]["function"]["parameters"])


def test_tools_streamed_assemble_into_a_call(smollm2_server):
    stream = smollm2_server.client().chat.completions.create(
        model="smol",
        messages=[{"role": "user", "content": "What's the weather in Paris?"}],
        tools=TOOLS,
        tool_choice="required",
        stream=True,
    )
    name, arguments, finish = "", "", None
    for chunk in stream:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        for delta in choice.delta.tool_calls or []:
            name += delta.function.name or "" if delta.function else ""
            arguments += delta.function.arguments or "" if delta.function else ""
        finish = choice.finish_reason or finish
    assert finish == "tool_calls" and name == "get_weather"
    jsonschema.validate(json.loads(arguments), TOOLS[0]["function"]["parameters"])
