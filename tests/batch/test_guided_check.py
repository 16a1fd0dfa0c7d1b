"""A reply checked against the structure its row asked for."""

import pytest

from lmpress.batch.guided_check import check_reply

SCHEMA = {
    "type": "object",
    "properties": {"age": {"type": "integer", "minimum": 0}, "tags": {"type": "array"}},
    "required": ["age"],
}


def test_json_that_follows_the_schema_is_parsed_and_valid():
    checked = check_reply('{"age": 3, "tags": []}', "json", SCHEMA, "stop")
    assert checked.valid and checked.parsed == {"age": 3, "tags": []}
    assert checked.to_dict() == {"valid": True, "parsed": {"age": 3, "tags": []}}


@pytest.mark.parametrize(
    "text, why",
    [('{"age": -1}', "age: -1 is less than the minimum of 0"),
     ('{"tags": []}', "'age' is a required property"),
     ('{"age": 3, "tags": 5}', "tags: 5 is not of type 'array'")],
)  # fmt: skip
def test_json_that_breaks_the_schema_is_parsed_and_says_where(text, why):
    checked = check_reply(text, "json", SCHEMA, "stop")
    assert not checked.valid and checked.parsed is not None
    assert why in checked.error


def test_a_reply_cut_mid_json_is_invalid_and_never_parsed():
    checked = check_reply('{"age": 3', "json", SCHEMA, "length")
    assert checked.to_dict() == {
        "valid": False,
        "error": "the reply was cut at max_new_tokens before it was complete",
    }
    # even a cut reply that happens to parse is not trusted
    assert not check_reply('{"age": 3}', "json", SCHEMA, "length").valid


def test_not_json_says_where_it_broke():
    checked = check_reply("{'age': 3}", "json_object", None, "stop")
    assert not checked.valid and checked.error.startswith("not JSON")
    assert not check_reply("[1]", "json_object", None, "stop").valid


def test_regex_and_choice_hold_the_whole_reply():
    assert check_reply("123-abc", "regex", r"\d{3}-[a-z]+", "stop").valid
    assert not check_reply("123-abc!", "regex", r"\d{3}-[a-z]+", "stop").valid
    assert check_reply("no", "choice", ["yes", "no"], "stop").valid
    assert not check_reply("No", "choice", ["yes", "no"], "stop").valid
