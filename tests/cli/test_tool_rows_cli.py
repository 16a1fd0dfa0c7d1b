"""`lmpress batch` with rows that offer tools, through the real CLI on remote engines against the
loopback server: each input format's rows get their calls back, written in that format, and a
re-run resumes them like any other row."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from openai.types.chat import ChatCompletion

from tests.conftest import run_lmpress
from tests.servers.llm_server import LLMServer, reply_text

pytestmark = pytest.mark.timeout(300)

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"},
                                     "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"]}}}  # fmt: skip
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}
ARGS = {"city": "value", "unit": "c"}
EARLIER_CALL = {"id": "call_0", "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Oslo", "unit": "c"}}}  # fmt: skip
ROWS = [
    # lmpress's chat row: its own tool_choice names the second tool
    {"id": "chat", "messages": [{"role": "user", "content": "What time is it?"}],
     "tools": [WEATHER, TIME], "tool_choice": {"type": "function", "function": {"name": "get_time"}}},
    # Oumi's conversation: an earlier call (arguments as an object, content null) and its result
    {"conversation_id": "oumi", "metadata": {"src": "x"}, "tools": [WEATHER], "messages": [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [EARLIER_CALL]},
        {"role": "tool", "content": "cold", "tool_call_id": "call_0"},
        {"role": "user", "content": "And in Paris?"}]},
    # an OpenAI Batch line
    {"custom_id": "batch", "method": "POST", "url": "/v1/chat/completions",
     "body": {"model": "m", "messages": [{"role": "user", "content": "Paris?"}],
              "tools": [WEATHER], "tool_choice": "required"}},
    # no tools: words, as before
    {"id": "plain", "prompt": "hello there"},
]  # fmt: skip


def read_rows(path: Path) -> dict[str, dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return {row.get("custom_id") or row.get("id") or row["conversation_id"]: row for row in rows}


@pytest.mark.parametrize("engine", ["OPENAI", "ANTHROPIC"])
def test_tool_rows_in_every_format_get_their_calls(tmp_path, monkeypatch, engine):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    with LLMServer() as server:
        url = server.anthropic_url if engine == "ANTHROPIC" else server.openai_url
        args = ["batch", "--engine", engine, "--remote_params.api_url", url,
                "--model.model_name", "m", "-i", str(source), "-o", str(out)]  # fmt: skip
        run = run_lmpress(*args)
        assert run.returncode == 0, run.stderr[-3000:]
        sent = len(server.stats.bodies)
        again = run_lmpress(*args)  # everything done: nothing is sent again
        assert again.returncode == 0 and len(server.stats.bodies) == sent
    rows = read_rows(out)

    chat = rows["chat"]
    [call] = chat["messages"][-1]["tool_calls"]
    assert chat["messages"][-1]["content"] is None
    assert (call["function"]["name"], json.loads(call["function"]["arguments"])) == ("get_time", {})
    assert chat["response"]["finish_reason"] == "tool_calls"
    assert chat["response"]["tool_calls"] == [call]

    oumi = rows["oumi"]  # the input conversation as it was, then Oumi's assistant message
    assert oumi["messages"][:4] == ROWS[1]["messages"] and oumi["metadata"] == {"src": "x"}
    reply = oumi["messages"][-1]
    assert reply["role"] == "assistant" and reply["content"] is None
    assert json.loads(reply["tool_calls"][0]["function"]["arguments"]) == ARGS

    completion = ChatCompletion.model_validate(rows["batch"]["response"]["body"])
    assert completion.choices[0].finish_reason == "tool_calls"
    tool_call = completion.choices[0].message.tool_calls[0]
    assert json.loads(tool_call.function.arguments) == ARGS

    assert rows["plain"]["response"]["text"] == reply_text("hello there")
    assert "tool_calls" not in rows["plain"]["response"]


def test_a_tool_row_on_an_engine_without_tools_fails_in_one_line(tmp_path, echo_plugin):
    from tests.conftest import with_plugin

    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_text(json.dumps(ROWS[0]) + "\n" + json.dumps(ROWS[3]) + "\n")
    run = run_lmpress(
        "batch", "--engine", "ECHO", "-i", str(source), "-o", str(out), env=with_plugin(echo_plugin)
    )
    assert run.returncode == 1
    [line] = [ln for ln in run.stderr.splitlines() if ln.startswith(f"lmpress: {source}:1: ")]
    assert "engine ECHO cannot take tools" in line
    assert list(read_rows(out)) == ["plain"]
