"""Structured output and tool calls on the real SmolLM2 model, greedy, on both CPU engines:
every reply follows the JSON Schema, the regex or the choice its row asked for, one full batch
of 16 rows of each; one batch mixes rows with different constraints and rows with none; a required tool call
is a valid call even from a model this small."""

from __future__ import annotations

import asyncio
import json
import re

import jsonschema
import pytest

from lmpress.batch.guided_check import check_structure
from lmpress.builtin_models.packaged import SMOLLM2
from lmpress.configs import load_config
from lmpress.engines.registry import create_engine
from lmpress.vocabulary.types import GenerationParams, Message, Request

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 16},
        "age": {"type": "integer", "minimum": 18, "maximum": 99},
        "role": {"enum": ["captain", "cook", "navigator", "gunner"]},
        "skills": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 2},
        "ship": {
            "type": "object",
            "properties": {"name": {"type": "string", "maxLength": 16}, "guns": {"type": "integer", "minimum": 0, "maximum": 120}},
            "required": ["name", "guns"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "age", "role", "skills", "ship"],
    "additionalProperties": False,  # as OpenAI's strict mode requires of every object
}  # fmt: skip
REGEX = r"[A-Z][a-z]{2,9}-[0-9]{3}"
CHOICE = ["positive", "negative", "neutral"]
SUBJECTS = ["pirate", "sailor", "merchant", "explorer", "fisher", "admiral", "smuggler", "scout",
            "doctor", "carpenter"]  # fmt: skip
MOODS = ["I love it!", "This is awful.", "It is a table.", "Best day ever.", "I hate waiting."]
# One full batch (generation.batch_size below): every row follows its own constraint side by
# side with 15 others; more batches run the same code again, rows of other kinds in one batch
# are test_one_batch_mixes_constraints_and_free_rows.
ROWS = 16


def prompts(kind: str) -> list[str]:
    if kind == "json":
        texts = [f"Describe crew member {i} of a {s} ship as JSON." for i in range(2)
                 for s in SUBJECTS]  # fmt: skip
    elif kind == "regex":
        texts = [f"Invent a ticket code for {s} number {i}." for i in range(2) for s in SUBJECTS]
    else:
        texts = [f"What is the sentiment of: '{m}' (say it {i} ways)" for i in range(4)
                 for m in MOODS]  # fmt: skip
    return texts[:ROWS]


GUIDED = {
    "json": {"json": SCHEMA, "disable_any_whitespace": True},
    "regex": {"regex": REGEX},
    "choice": {"choice": CHOICE},
}


@pytest.fixture(scope="module", params=["LLAMACPP", "NATIVE"])
def engine(request):
    config = load_config(None, {
        "engine": request.param, "model.model_name": SMOLLM2,
        "generation.batch_size": 16, "generation.max_new_tokens": 128,
    })  # fmt: skip
    engine = create_engine(config)
    yield engine
    asyncio.run(engine.aclose())


def run(engine, rows: list[tuple[str, dict | None]]) -> list:
    params = GenerationParams(max_new_tokens=128)
    requests = [
        Request(f"r{i}", [Message("user", text)], params.replace(guided_decoding=guided))
        for i, (text, guided) in enumerate(rows)
    ]
    results = engine.generate(requests)
    return [check_structure(req, res) for req, res in zip(requests, results, strict=True)]


@pytest.mark.parametrize("kind", ["json", "regex", "choice"])
def test_a_full_batch_of_rows_follows_their_structure(engine, kind):
    results = run(engine, [(text, GUIDED[kind]) for text in prompts(kind)])
    assert len(results) == ROWS
    assert [r.error for r in results if not r.ok] == []
    for result in results:
        assert result.finish_reason == "stop"
        if kind == "json":
            jsonschema.validate(json.loads(result.text), SCHEMA)
            assert result.structured == {"valid": True, "parsed": json.loads(result.text)}
        elif kind == "regex":
            assert re.fullmatch(REGEX, result.text)
        else:
            assert result.text in CHOICE
    if kind != "choice":  # the model writes different things for different rows
        assert len({r.text for r in results}) > ROWS // 4  # 8 of 16 on LLAMACPP


def test_one_batch_mixes_constraints_and_free_rows(engine):
    rows = [
        ("Describe a pirate as JSON.", GUIDED["json"]),
        ("Say hello.", None),
        ("Invent a ticket code.", GUIDED["regex"]),
        ("Sentiment of 'great'?", GUIDED["choice"]),
        ("Describe a cook as JSON.", {"json": {"type": "object", "properties": {"dish": {"type": "string", "maxLength": 20}}, "required": ["dish"]}}),
        ("Name a colour.", None),
    ]  # fmt: skip
    results = run(engine, rows)
    assert all(r.ok for r in results), [r.error for r in results]
    jsonschema.validate(json.loads(results[0].text), SCHEMA)
    assert re.fullmatch(REGEX, results[2].text) and results[3].text in CHOICE
    assert list(json.loads(results[4].text)) == ["dish"]
    free = [results[1].text, results[5].text]
    assert all(t and not t.startswith("{") for t in free)
    assert results[1].structured is None


def test_a_reply_cut_mid_json_fails_its_row(engine):
    params = GenerationParams(max_new_tokens=6, guided_decoding=GUIDED["json"])
    request = Request("cut", [Message("user", "Describe a pirate as JSON.")], params)
    result = check_structure(request, engine.generate([request])[0])
    assert result.error.kind == "invalid_output"
    assert result.error.message == (
        "the reply does not follow generation.guided_decoding.json: the reply was cut at "
        "max_new_tokens before it was complete"
    )
    assert result.text.startswith("{")


TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 30},
            "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "get_time", "description": "Current time in a timezone",
        "parameters": {"type": "object", "properties": {
            "timezone": {"type": "string", "maxLength": 30}},
            "required": ["timezone"], "additionalProperties": False}}},
]  # fmt: skip
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


def call(engine, text: str, tool_choice, **params) -> object:
    return engine.generate([tool_request(text, tool_choice, **params)])[0]


def tool_request(text: str, tool_choice, rid: str = "t", **params) -> Request:
    params = GenerationParams(max_new_tokens=96, tool_choice=tool_choice, **params)
    return Request(rid, [Message("user", text)], params, tools=TOOLS)


REQUIRED = ["What's the weather in Paris?", "What time is it in Tokyo?", "Hello there!"]
NAMED = {"type": "function", "function": {"name": "get_time"}}


def after_a_tool_reply() -> Request:
    """The earlier call and the tool's answer, for the model to answer in words."""
    from lmpress.vocabulary.types import ToolCall

    asked = ToolCall("call_1", "get_weather", '{"city": "Paris", "unit": "celsius"}')
    messages = [
        Message("user", "What's the weather in Paris?"),
        Message("assistant", "", tool_calls=[asked]),
        Message("tool", "18 degrees and sunny", tool_call_id="call_1"),
    ]
    params = GenerationParams(max_new_tokens=40, tool_choice="auto")
    return Request("after", messages, params, tools=TOOLS)


@pytest.fixture(scope="module")
def calls(engine) -> dict:
    """One batch of the rows the tool-call tests below read, by request id: a required call
    for each of REQUIRED, a named one, and an answer after a tool's reply."""
    requests = [tool_request(text, "required", f"required{i}") for i, text in enumerate(REQUIRED)]
    requests += [tool_request("What's the weather in Paris?", NAMED, "named"), after_a_tool_reply()]
    return {r.request_id: r for r in engine.generate(requests)}


@pytest.mark.parametrize("row", range(len(REQUIRED)), ids=REQUIRED)
def test_a_required_call_names_a_tool_and_its_arguments_follow_its_schema(calls, row):
    result = calls[f"required{row}"]
    assert result.ok and result.finish_reason == "tool_calls" and result.text == ""
    [tool_call] = result.samples[0].tool_calls
    jsonschema.validate(json.loads(tool_call.arguments), SCHEMAS[tool_call.name])
    assert tool_call.id.startswith("call_")


def test_a_named_function_is_the_one_called(calls):
    [tool_call] = calls["named"].samples[0].tool_calls
    assert tool_call.name == "get_time"
    jsonschema.validate(json.loads(tool_call.arguments), SCHEMAS["get_time"])


def test_a_call_after_a_tool_reply_reads_it(calls):
    """The earlier call and the tool's answer reach the model (in the hermes form, since
    SmolLM2's template renders no tools); the model then answers in words."""
    result = calls["after"]
    assert result.ok and result.finish_reason in ("stop", "length")
    assert result.samples[0].tool_calls is None and result.text


def test_a_required_call_and_guided_decoding_together_are_refused(engine):
    result = call(engine, "Weather?", "required", guided_decoding={"choice": ["a"]})
    assert result.error.kind == "invalid_request"
    assert "cannot both constrain one reply" in result.error.message
