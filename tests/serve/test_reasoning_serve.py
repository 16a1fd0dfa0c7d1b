"""A reasoning model behind `lmpress serve` (the ECHO engine thinking, ECHO_THINK), read by the
official openai client: the thinking beside the answer as vLLM serves it (`reasoning_content`
and `reasoning`), streamed before the content, counted in the usage; reasoning_effort and the
thinking budget accepted, and an earlier turn's thinking read from the messages."""

from __future__ import annotations

import json

import openai
import pytest

from tests.conftest import run_lmpress, with_plugin

THINKING = "let me think about it"
MODEL = "echo-model"
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def thinking_server(serve_process, echo_plugin):
    return serve_process(
        "--engine", "ECHO", "--model.model_name", MODEL,
        env={**with_plugin(echo_plugin), "ECHO_THINK": THINKING},
    )  # fmt: skip


def test_the_reply_has_the_thinking_beside_the_answer(thinking_server):
    reply = thinking_server.client().chat.completions.create(model=MODEL, messages=HI)
    message = reply.choices[0].message
    assert json.loads(message.content[len("ECHO ") :]) == HI
    assert message.reasoning_content == message.reasoning == THINKING
    assert reply.usage.completion_tokens_details.reasoning_tokens == 5


def test_the_stream_sends_the_thinking_first_then_the_content(thinking_server):
    stream = thinking_server.client().chat.completions.create(
        model=MODEL, messages=HI, stream=True, stream_options={"include_usage": True}
    )
    order, thinking, content, usage = [], "", "", None
    for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            piece = getattr(choice.delta, "reasoning_content", None)
            if piece:
                assert choice.delta.reasoning == piece
                thinking += piece
                order.append("thinking")
            if choice.delta.content:
                content += choice.delta.content
                order.append("content")
    assert thinking == THINKING
    assert json.loads(content[len("ECHO ") :]) == HI
    assert order == sorted(order, key=lambda kind: kind == "content")  # thinking, then content
    assert usage.completion_tokens_details.reasoning_tokens == 5


def test_reasoning_effort_and_the_thinking_budget_are_honoured(thinking_server):
    client = thinking_server.client()
    cut = client.chat.completions.create(
        model=MODEL, messages=HI, extra_body={"max_reasoning_tokens": 2}
    )
    assert cut.choices[0].message.reasoning_content == "let me"
    cut = client.chat.completions.create(
        model=MODEL, messages=HI, extra_body={"thinking_token_budget": 1}
    )
    assert cut.choices[0].message.reasoning_content == "let"
    none = client.chat.completions.create(model=MODEL, messages=HI, reasoning_effort="none")
    assert getattr(none.choices[0].message, "reasoning_content", None) is None
    assert none.usage.completion_tokens_details is None
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model=MODEL, messages=HI, extra_body={"reasoning_effort": "max"}
        )
    assert "'reasoning_effort': 'max' must be one of none, minimal, low, medium, high" in str(
        caught.value
    )


def test_an_earlier_turns_thinking_reaches_the_engine(thinking_server):
    messages = [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4", "reasoning_content": "add"},
        {"role": "user", "content": "why?"},
    ]
    reply = thinking_server.client().chat.completions.create(model=MODEL, messages=messages)
    sent = json.loads(reply.choices[0].message.content[len("ECHO ") :])
    assert sent[1] == {"role": "assistant", "content": "4", "reasoning": "add"}


def test_lmpress_reads_its_own_served_thinking_through_remote(thinking_server, tmp_path):
    """The round trip: `lmpress batch --engine REMOTE` against this server; the thinking comes
    back apart from the answer, as it left, and reasoning_effort goes over the wire."""
    source = tmp_path / "in.jsonl"
    rows = [{"id": "a", "prompt": "hi"},
            {"id": "b", "prompt": "hi", "generation": {"reasoning_effort": "none"}}]  # fmt: skip
    source.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = tmp_path / "out.jsonl"
    run = run_lmpress(
        "batch", "--engine", "REMOTE", "--remote_params.api_url", f"{thinking_server.url}/v1",
        "-i", str(source), "-o", str(out),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    rows = {row["id"]: row["response"] for row in map(json.loads, out.read_text().splitlines())}
    assert json.loads(rows["a"]["text"][len("ECHO ") :]) == HI
    assert (rows["a"]["reasoning"], rows["a"]["usage"]["reasoning_tokens"]) == (THINKING, 5)
    assert "reasoning" not in rows["b"]


# --- a real reasoning model's shape: NATIVE on tiny:think -------------------------------------


def test_tiny_think_streams_its_thinking_then_its_answer(think_server):
    client = think_server.client()
    whole = client.chat.completions.create(model="think", messages=HI)
    message = whole.choices[0].message
    assert message.reasoning_content and message.content
    assert whole.usage.completion_tokens_details.reasoning_tokens == 4
    stream = client.chat.completions.create(
        model="think", messages=HI, stream=True, stream_options={"include_usage": True}
    )
    kinds, thinking, content, usage = [], "", "", None
    for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            if getattr(choice.delta, "reasoning_content", None):
                thinking += choice.delta.reasoning_content
                kinds.append("thinking")
            if choice.delta.content:
                content += choice.delta.content
                kinds.append("content")
    # Greedy: the stream is the same reply, its thinking first.
    assert (thinking, content) == (message.reasoning_content, message.content)
    assert kinds == sorted(kinds, key=lambda kind: kind == "content") and "content" in kinds
    assert usage.completion_tokens_details.reasoning_tokens == 4
    budget = client.chat.completions.create(
        model="think", messages=HI, extra_body={"max_reasoning_tokens": 1}
    )
    assert budget.usage.completion_tokens_details.reasoning_tokens == 1
    # vLLM's per-request switch for Qwen3-style templates: the template closes the block.
    off = client.chat.completions.create(
        model="think", messages=HI, extra_body={"chat_template_kwargs": {"enable_thinking": False}}
    )
    assert not getattr(off.choices[0].message, "reasoning_content", None)
    assert off.choices[0].message.content
