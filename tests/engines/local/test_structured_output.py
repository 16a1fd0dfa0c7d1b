"""Structured output on the real SmolLM2 model, greedy, on both CPU engines: every reply
follows the JSON Schema, the regex or the choice its row asked for, 50 rows of each; and one
batch mixes rows with different constraints and rows with none."""

from __future__ import annotations

import asyncio
import json
import re

import jsonschema
import pytest

from lmpress.configs import load_config
from lmpress.engines.registry import create_engine
from lmpress.packaged import SMOLLM2
from lmpress.structured import check_structure
from lmpress.types import GenerationParams, Message, Request

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 18, "maximum": 99},
        "role": {"enum": ["captain", "cook", "navigator", "gunner"]},
        "skills": {"type": "array", "items": {"type": "string", "maxLength": 16}, "maxItems": 3},
        "ship": {
            "type": "object",
            "properties": {"name": {"type": "string", "maxLength": 24}, "guns": {"type": "integer", "minimum": 0, "maximum": 120}},
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


def prompts(kind: str) -> list[str]:
    if kind == "json":
        return [f"Describe crew member {i} of a {s} ship as JSON." for i in range(5)
                for s in SUBJECTS]  # fmt: skip
    if kind == "regex":
        return [f"Invent a ticket code for {s} number {i}." for i in range(5) for s in SUBJECTS]
    return [f"What is the sentiment of: '{m}' (say it {i} ways)" for i in range(10) for m in MOODS]


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
def test_fifty_rows_follow_their_structure(engine, kind):
    results = run(engine, [(text, GUIDED[kind]) for text in prompts(kind)])
    assert len(results) == 50
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
        assert len({r.text for r in results}) > 10


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
