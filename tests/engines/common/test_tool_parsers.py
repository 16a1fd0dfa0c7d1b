"""Tool calls read back from a model's text, in each family's form, and the grammar that makes a
model write a valid one."""

import json

import pytest

from lmpress.engines.common.tool_parsers import (
    call_grammar,
    chosen_tools,
    parse_tool_calls,
    parser_for,
)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}


@pytest.mark.parametrize(
    "parser, text",
    [
        ("hermes", 'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'),
        ("llama3_json", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo"}}'),
        ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Oslo"}}'),
        ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Oslo"}}]'),
        ("mistral", '[TOOL_CALLS]get_weather{"city": "Oslo"}'),
    ],
)  # fmt: skip
def test_each_family_form_reads_back_as_one_call(parser, text):
    content, calls = parse_tool_calls(text, parser)
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Oslo"})]
    assert calls[0].id.startswith("call_")
    assert "tool_call" not in content and "TOOL_CALLS" not in content


def test_two_hermes_calls_and_the_text_before_them():
    text = (
        'Checking both.<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'
        '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
    )
    content, calls = parse_tool_calls(text, "hermes")
    assert content == "Checking both."
    assert [c.name for c in calls] == ["get_weather", "get_time"]


@pytest.mark.parametrize("parser", ["hermes", "llama3_json", "mistral"])
def test_words_and_broken_calls_stay_text(parser):
    for text in ["The weather in Oslo is mild.", '<tool_call>{"name": "get_weather", "argu',
                 '[TOOL_CALLS][{"nam', '{"city": "Oslo"}']:  # fmt: skip
        assert parse_tool_calls(text, parser) == (text, [])


def test_the_parser_follows_the_template_unless_named():
    assert parser_for("{{ '[TOOL_CALLS]' }}") == "mistral"
    assert parser_for("{{ '<|python_tag|>' }}") == "llama3_json"
    assert parser_for("{% if tools %}<tool_call>{% endif %}") == "hermes"
    assert parser_for(None) == "hermes"
    assert parser_for("[TOOL_CALLS]", "hermes") == "hermes"
    with pytest.raises(ValueError, match="tool_call_parser 'qwen9'"):
        parser_for(None, "qwen9")


def test_tool_choice_narrows_the_tools_a_reply_must_call():
    assert chosen_tools([WEATHER, TIME], "auto") is None
    assert chosen_tools([WEATHER, TIME], "required") == [WEATHER, TIME]
    named = {"type": "function", "function": {"name": "get_time"}}
    assert chosen_tools([WEATHER, TIME], named) == [TIME]
    with pytest.raises(ValueError, match="'nope'"):
        chosen_tools([WEATHER], {"type": "function", "function": {"name": "nope"}})


@pytest.mark.parametrize("parser", ["hermes", "llama3_json", "mistral"])
def test_the_call_grammar_compiles_and_admits_a_valid_call_only(parser):
    from llguidance import LLMatcher

    grammar = LLMatcher.grammar_from_lark(call_grammar([WEATHER, TIME], parser))
    assert LLMatcher.validate_grammar(grammar) == ""


def request_with_history(tool_choice="auto", tools=(WEATHER, TIME)):
    from lmpress.vocabulary.types import GenerationParams, Message, Request, ToolCall

    asked = ToolCall("call_1", "get_weather", '{"city": "Oslo"}')
    messages = [
        Message("system", "Be brief."),
        Message("user", "Weather in Oslo?"),
        Message("assistant", "", tool_calls=[asked]),
        Message("tool", "Mild.", tool_call_id="call_1"),
    ]
    params = GenerationParams(tool_choice=tool_choice)
    return Request("r", messages, params, tools=list(tools) or None)


def test_a_template_that_renders_tools_gets_them_and_the_calls_as_they_are():
    from lmpress.engines.common.tool_parsers import plan_tools

    plan = plan_tools(request_with_history(), "{% if tools %}...{% endif %}<tool_call>", None)
    assert plan.tools == [WEATHER, TIME] and plan.parser == "hermes" and plan.grammar is None
    assert plan.messages[0] == {"role": "system", "content": "Be brief."}
    assert plan.messages[2]["tool_calls"][0]["function"] == {
        "name": "get_weather",
        "arguments": {"city": "Oslo"},
    }
    assert plan.messages[3] == {"role": "tool", "content": "Mild.", "tool_call_id": "call_1"}


def test_a_template_without_tools_gets_them_in_the_system_turn_and_the_hermes_form():
    from lmpress.engines.common.tool_parsers import plan_tools

    plan = plan_tools(request_with_history("required"), "{{ messages }}", None)
    assert plan.tools is None
    system = plan.messages[0]["content"]
    assert system.startswith("Be brief.\n\n") and '"name": "get_time"' in system
    assert plan.messages[2]["content"] == (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    )
    assert plan.messages[3] == {
        "role": "user",
        "content": "<tool_response>\nMild.\n</tool_response>",
    }
    assert plan.grammar.startswith('start: "<tool_call>\\n" call')


def test_tool_choice_none_offers_no_tools():
    from lmpress.engines.common.tool_parsers import plan_tools

    plan = plan_tools(request_with_history("none"), "{{ messages }}", None)
    assert plan.tools is None and plan.grammar is None
    assert plan.messages[0] == {"role": "system", "content": "Be brief."}
