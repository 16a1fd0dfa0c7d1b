"""Reasoning models on the remote engines: the thinking read apart from the answer on every
provider's wire, live and streamed, and from its batch API; the bounds sent in each provider's
own field or refused in one line; an earlier turn's thinking sent back to Anthropic whole and to
no OpenAI-compatible server. The official SDKs drive the loopback server, which plays each
provider (`tests/servers/reasoning_replies.py`) and checks its rules."""

from __future__ import annotations

import asyncio
import io
import json
import time

import pytest

from lmpress.batch.provider.apis import batch_api
from lmpress.configs import load_config
from lmpress.engines.registry import create_engine
from lmpress.engines.remote.presets import BY_NAME
from lmpress.vocabulary.errors import UnsupportedParamError
from lmpress.vocabulary.types import Delta, GenerationParams, Message, Request, Result
from tests.conftest import run_lmpress
from tests.engines.remote.test_anthropic import run
from tests.servers.llm_server import BatchFaults, Faults, LLMServer, reply_text
from tests.servers.reasoning_replies import redacted_data, signature, thinking_text

pytestmark = pytest.mark.timeout(120)

QUESTION = "Why is the sky blue on a clear day"
THOUGHT = thinking_text(QUESTION)
ANSWER = reply_text(QUESTION)
THOUGHT_WORDS = len(THOUGHT.split())
ANSWER_WORDS = len(ANSWER.split())


@pytest.fixture(autouse=True)
def keys(monkeypatch):
    for name in ("OPENAI_API_KEY", "GEMINI_API_KEY", "DEEPSEEK_API_KEY", "ANTHROPIC_API_KEY"):
        monkeypatch.setenv(name, "test-key")
    for name in ("OPENAI_ADMIN_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_BASE_URL"):
        monkeypatch.delenv(name, raising=False)


def make_engine(server: LLMServer, engine: str, **overrides):
    values = {
        "engine": engine,
        "model.model_name": "test-model",
        "remote_params.api_url": server.anthropic_url
        if engine == "ANTHROPIC"
        else server.openai_url,
        "remote_params.retry_backoff_base": 0.01,
        "remote_params.max_retries": 0,
        "remote_params.connection_timeout": 5.0,
    }
    values.update(overrides)
    return create_engine(load_config(None, values))


def ask(*messages: Message, **params) -> Request:
    messages = messages or (Message("user", QUESTION),)
    return Request("r", list(messages), GenerationParams(**params))


def last_body(server: LLMServer) -> dict:
    return server.stats.bodies[-1][1]


def assert_streamed(deltas: list[Delta], result: Result) -> None:
    """The stream's thinking pieces come first, then the answer's, and add up to the result."""
    kinds = [d.reasoning for d in deltas]
    assert kinds == sorted(kinds, reverse=True)  # every True before every False
    sample = result.samples[0]
    assert "".join(d.text for d in deltas if d.reasoning) == (sample.reasoning or "")
    assert "".join(d.text for d in deltas if not d.reasoning) == sample.text


# --- which provider takes which bound ------------------------------------------------------

BOUNDS = {"reasoning_effort", "max_reasoning_tokens"}


@pytest.mark.parametrize(
    ("engine", "taken"),
    [("OPENAI", {"reasoning_effort"}), ("REMOTE", {"reasoning_effort"}),
     ("REMOTE_VLLM", {"reasoning_effort"}), ("GEMINI", BOUNDS), ("GOOGLE_VERTEX", BOUNDS),
     ("ANTHROPIC", BOUNDS), ("DEEPSEEK", set()), ("BEDROCK", set())],
)  # fmt: skip
def test_each_provider_lists_the_bounds_it_takes(engine, taken):
    assert BY_NAME[engine].params & BOUNDS == taken


def test_a_provider_without_effort_refuses_it_before_the_first_request():
    with LLMServer() as server, pytest.raises(UnsupportedParamError) as caught:
        make_engine(server, "DEEPSEEK", **{"generation.reasoning_effort": "low"})
    assert "DEEPSEEK does not support generation.reasoning_effort" in str(caught.value)


# --- OpenAI-compatible servers -----------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["complete", "stream"])
@pytest.mark.parametrize("style", ["reasoning_content", "reasoning"])
def test_vllm_and_deepseek_style_thinking_comes_apart_from_the_answer(style, stream):
    with LLMServer(Faults(reasoning=style)) as server:
        deltas, result = run(make_engine(server, "REMOTE"), ask(), stream)
    assert result.error is None, result.error
    sample = result.samples[0]
    assert (sample.reasoning, sample.text) == (THOUGHT, ANSWER)
    assert sample.reasoning_tokens == result.usage.reasoning_tokens == THOUGHT_WORDS
    assert result.usage.completion_tokens == THOUGHT_WORDS + ANSWER_WORDS
    if stream:
        assert any(d.reasoning for d in deltas)
        assert_streamed(deltas, result)


@pytest.mark.parametrize("stream", [False, True], ids=["complete", "stream"])
def test_openai_counts_its_hidden_thinking_and_takes_reasoning_effort(stream):
    with LLMServer(Faults(reasoning="hidden")) as server:
        engine = make_engine(server, "OPENAI")
        deltas, result = run(engine, ask(reasoning_effort="high"), stream)
        body = last_body(server)
    assert result.error is None, result.error
    assert body["reasoning_effort"] == "high"
    sample = result.samples[0]
    assert (sample.reasoning, sample.text) == (None, ANSWER)  # OpenAI returns no thinking text
    assert sample.reasoning_tokens == result.usage.reasoning_tokens == THOUGHT_WORDS
    assert not any(d.reasoning for d in deltas)


def test_reasoning_effort_none_reaches_the_server_and_turns_thinking_off():
    with LLMServer(Faults(reasoning="reasoning_content")) as server:
        _, result = run(make_engine(server, "REMOTE_VLLM"), ask(reasoning_effort="none"), False)
        assert last_body(server)["reasoning_effort"] == "none"
    assert (result.samples[0].reasoning, result.usage.reasoning_tokens) == (None, 0)


def test_openai_refuses_a_token_budget_in_one_line_naming_reasoning_effort():
    with LLMServer() as server, pytest.raises(UnsupportedParamError) as caught:
        make_engine(server, "OPENAI", **{"generation.max_reasoning_tokens": 512})
    message = str(caught.value)
    assert "\n" not in message
    assert "generation.max_reasoning_tokens" in message and "reasoning_effort" in message


def test_deepseek_gets_no_reasoning_content_back_from_an_earlier_turn():
    """DeepSeek answers 400 to `reasoning_content` in an input message; the server refuses it
    too (the SDK's message type has no such field), so the second turn passing proves it."""
    earlier = Message("assistant", "Rayleigh scattering.", reasoning="Short waves scatter more.")
    conversation = (Message("user", QUESTION), earlier, Message("user", "And at sunset?"))
    with LLMServer(Faults(reasoning="reasoning_content")) as server:
        _, result = run(make_engine(server, "DEEPSEEK"), ask(*conversation), False)
        body = last_body(server)
    assert result.error is None, result.error
    assert [m.get("reasoning_content") for m in body["messages"]] == [None, None, None]
    assert body["messages"][1]["content"] == "Rayleigh scattering."
    assert result.samples[0].reasoning == thinking_text("And at sunset?")


# --- Gemini's OpenAI compatibility ---------------------------------------------------------

GEMINI = Faults(reasoning="gemini", extensions=frozenset({"extra_body"}))


@pytest.mark.parametrize("stream", [False, True], ids=["complete", "stream"])
def test_gemini_thinking_budget_brings_back_its_thoughts_apart_from_the_answer(stream):
    with LLMServer(GEMINI) as server:
        engine = make_engine(server, "GEMINI")
        deltas, result = run(engine, ask(max_reasoning_tokens=5), stream)
        body = last_body(server)
    assert result.error is None, result.error
    assert body["extra_body"] == {
        "google": {"thinking_config": {"thinking_budget": 5, "include_thoughts": True}}
    }
    assert "reasoning_effort" not in body
    sample = result.samples[0]
    assert (sample.reasoning, sample.text) == (" ".join(THOUGHT.split()[:5]), ANSWER)
    assert sample.reasoning_tokens == 5
    if stream:  # the tags arrived split across chunks
        assert_streamed(deltas, result)


def test_gemini_budget_zero_turns_thinking_off():
    with LLMServer(GEMINI) as server:
        _, result = run(make_engine(server, "GEMINI"), ask(max_reasoning_tokens=0), False)
        assert last_body(server)["extra_body"]["google"]["thinking_config"] == {
            "thinking_budget": 0
        }
    assert (result.samples[0].reasoning, result.samples[0].text) == (None, ANSWER)
    assert result.usage.reasoning_tokens == 0


def test_gemini_takes_reasoning_effort_as_openai_spells_it():
    token = {"remote_params.api_key_env_varname": "GEMINI_API_KEY"}  # Vertex: a bearer token
    with LLMServer(GEMINI) as server:
        engine = make_engine(server, "GOOGLE_VERTEX", **token)
        _, result = run(engine, ask(reasoning_effort="low"), False)
        body = last_body(server)
    assert body["reasoning_effort"] == "low" and "extra_body" not in body
    assert result.samples[0].text == ANSWER
    assert result.usage.reasoning_tokens == THOUGHT_WORDS  # counted; its text was not asked for


def test_gemini_refuses_effort_and_budget_together_in_one_line():
    with LLMServer(GEMINI) as server:
        _, result = run(
            make_engine(server, "GEMINI"), ask(reasoning_effort="low", max_reasoning_tokens=64),
            False,
        )  # fmt: skip
        assert server.stats.requests == 0  # refused before sending
        with pytest.raises(UnsupportedParamError) as caught:
            make_engine(server, "GEMINI", **{"generation.reasoning_effort": "low",
                                             "generation.max_reasoning_tokens": 64})  # fmt: skip
    assert result.error is not None and "\n" not in result.error.message
    assert "not both" in result.error.message
    assert "not both" in str(caught.value) and "\n" not in str(caught.value)


# --- Anthropic -----------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["complete", "stream"])
def test_anthropic_thinking_blocks_come_apart_from_the_answer_with_their_signature(stream):
    with LLMServer() as server:
        engine = make_engine(server, "ANTHROPIC")
        request = ask(max_reasoning_tokens=1024, max_new_tokens=2048)
        deltas, result = run(engine, request, stream)
        body = last_body(server)
    assert result.error is None, result.error
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 1024}
    assert "temperature" not in body and "top_k" not in body  # the API's rule with thinking
    sample = result.samples[0]
    assert (sample.reasoning, sample.text) == (THOUGHT, ANSWER)
    assert sample.reasoning_details == [
        {"type": "thinking", "thinking": THOUGHT, "signature": signature(THOUGHT)}
    ]
    assert sample.reasoning_tokens == result.usage.reasoning_tokens == THOUGHT_WORDS
    assert result.usage.completion_tokens == THOUGHT_WORDS + ANSWER_WORDS
    if stream:
        assert_streamed(deltas, result)


@pytest.mark.parametrize("stream", [False, True], ids=["complete", "stream"])
def test_anthropic_redacted_thinking_is_kept_whole_but_has_no_text(stream):
    question = "Think about this redacted question"
    with LLMServer() as server:
        engine = make_engine(server, "ANTHROPIC")
        request = ask(Message("user", question), max_reasoning_tokens=1024, max_new_tokens=4096)
        _, result = run(engine, request, stream)
    thought = thinking_text(question)
    assert result.samples[0].reasoning == thought
    assert result.samples[0].reasoning_details == [
        {"type": "thinking", "thinking": thought, "signature": signature(thought)},
        {"type": "redacted_thinking", "data": redacted_data(thought)},
    ]


def test_anthropic_reasoning_effort_is_adaptive_thinking_at_that_effort():
    with LLMServer() as server:
        _, result = run(make_engine(server, "ANTHROPIC"), ask(reasoning_effort="medium"), False)
        body = last_body(server)
    assert body["thinking"] == {"type": "adaptive"}
    assert body["output_config"] == {"effort": "medium"}
    assert result.samples[0].reasoning == THOUGHT


@pytest.mark.parametrize("params", [{"reasoning_effort": "none"}, {"max_reasoning_tokens": 0}])
def test_anthropic_none_or_a_zero_budget_turns_thinking_off(params):
    with LLMServer() as server:
        _, result = run(make_engine(server, "ANTHROPIC"), ask(**params), False)
        assert last_body(server)["thinking"] == {"type": "disabled"}
    sample = result.samples[0]
    assert (sample.reasoning, sample.reasoning_details, sample.text) == (None, None, ANSWER)


@pytest.mark.parametrize(
    ("params", "rule"),
    [
        ({"max_reasoning_tokens": 512, "max_new_tokens": 2048}, "at least 1024"),
        ({"max_reasoning_tokens": 2048, "max_new_tokens": 2048}, "less than max_new_tokens"),
        ({"reasoning_effort": "minimal"}, "no effort level 'minimal'"),
        ({"reasoning_effort": "high", "tool_choice": "required"}, "tool_choice auto or none"),
    ],
    ids=["budget-too-small", "budget-not-below-max", "minimal", "forced-tool"],
)
def test_anthropic_refuses_what_its_api_would_in_one_line(params, rule):
    with LLMServer() as server:
        _, result = run(make_engine(server, "ANTHROPIC"), ask(**params), False)
        assert server.stats.requests == 0  # refused before sending
    assert result.error is not None
    assert rule in result.error.message and "\n" not in result.error.message


def test_a_recipe_anthropic_would_refuse_stops_before_the_first_request():
    with LLMServer() as server, pytest.raises(UnsupportedParamError) as caught:
        make_engine(server, "ANTHROPIC", **{"generation.max_reasoning_tokens": 2000})
    message = str(caught.value)
    assert message.startswith("engine ANTHROPIC takes a thinking budget")
    assert "max_new_tokens (256)" in message and "\n" not in message
    assert message.count("ANTHROPIC") == 1


def test_the_anthropic_server_itself_refuses_a_budget_below_its_minimum():
    """The loopback server enforces the rules lmpress refuses ahead of it, so the tests above
    would catch a body that broke them."""
    import anthropic

    with LLMServer() as server:
        client = anthropic.Anthropic(api_key="k", base_url=server.anthropic_url, max_retries=0)
        with pytest.raises(anthropic.BadRequestError, match="1024"):
            client.messages.create(model="m", max_tokens=2048,
                                   messages=[{"role": "user", "content": "hi"}],
                                   thinking={"type": "enabled", "budget_tokens": 512})  # fmt: skip


def test_anthropic_gets_an_earlier_turns_thinking_blocks_back_first_with_their_signature():
    with LLMServer() as server:
        params = {"max_reasoning_tokens": 1024, "max_new_tokens": 2048}
        _, first = run(make_engine(server, "ANTHROPIC"), ask(**params), False)
        sample = first.samples[0]
        earlier = Message("assistant", sample.text, reasoning=sample.reasoning,
                          reasoning_details=sample.reasoning_details)  # fmt: skip
        follow_up = ask(Message("user", QUESTION), earlier, Message("user", "And at sunset?"),
                        **params)  # fmt: skip
        _, second = run(make_engine(server, "ANTHROPIC"), follow_up, False)
        sent = last_body(server)["messages"][1]["content"]
        # A block whose signature does not match is refused: the server checks it.
        earlier.reasoning_details = [{**sample.reasoning_details[0], "signature": "sig-forged"}]
        _, forged = run(make_engine(server, "ANTHROPIC"), follow_up, False)
    assert sent == [
        {"type": "thinking", "thinking": THOUGHT, "signature": signature(THOUGHT)},
        {"type": "text", "text": ANSWER},
    ]
    assert second.error is None and second.samples[0].text == reply_text("And at sunset?")
    assert forged.error is not None and "signature" in forged.error.message


def test_anthropic_drops_thinking_that_has_no_signature():
    earlier = Message("assistant", "Rayleigh scattering.", reasoning="from another model")
    with LLMServer() as server:
        _, result = run(
            make_engine(server, "ANTHROPIC"),
            ask(Message("user", QUESTION), earlier, Message("user", "And at sunset?")), False,
        )  # fmt: skip
        sent = last_body(server)["messages"][1]["content"]
    assert result.error is None
    assert sent == "Rayleigh scattering."


# --- provider batches ------------------------------------------------------------------------


async def _wait(api, batch_id: str) -> None:
    deadline = time.monotonic() + 30
    while not (await api.progress(batch_id)).ended:
        assert time.monotonic() < deadline, "the batch did not end"
        await asyncio.sleep(0.05)


def test_an_openai_batch_row_carries_its_thinking_like_a_live_row():
    faults = Faults(reasoning="reasoning_content", batch=BatchFaults(step_s=0.02))
    with LLMServer(faults) as server:
        engine = make_engine(server, "REMOTE", **{"generation.reasoning_effort": "low"})

        async def go():
            api = batch_api(engine, "24h")
            line = await api.line("row-1", ask(reasoning_effort="low"))
            file = await api.client.files.create(
                file=("in.jsonl", io.BytesIO(line.encode())), purpose="batch"
            )
            batch = await api.client.batches.create(
                input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"
            )
            await _wait(api, batch.id)
            out = [item async for item in api.results(batch.id)]
            await engine.aclose()
            return line, out

        line, out = asyncio.run(go())
    assert json.loads(line)["body"]["reasoning_effort"] == "low"
    [(cid, outcome)] = out
    sample = outcome.reply.samples[0]
    assert (cid, sample.reasoning, sample.text) == ("row-1", THOUGHT, ANSWER)
    assert outcome.reply.usage.reasoning_tokens == THOUGHT_WORDS


def test_an_anthropic_batch_row_carries_its_thinking_blocks_like_a_live_row():
    with LLMServer(Faults(batch=BatchFaults(step_s=0.02))) as server:
        engine = make_engine(server, "ANTHROPIC")

        async def go():
            api = batch_api(engine, "24h")
            line = await api.line("row-1", ask(max_reasoning_tokens=1024, max_new_tokens=2048))
            batch = await api.client.messages.batches.create(requests=[json.loads(line)])
            await _wait(api, batch.id)
            out = [item async for item in api.results(batch.id)]
            await engine.aclose()
            return out

        [(cid, outcome)] = asyncio.run(go())
    sample = outcome.reply.samples[0]
    assert (cid, sample.reasoning, sample.text) == ("row-1", THOUGHT, ANSWER)
    assert sample.reasoning_details == [
        {"type": "thinking", "thinking": THOUGHT, "signature": signature(THOUGHT)}
    ]
    assert sample.reasoning_tokens == THOUGHT_WORDS


# --- the CLI -----------------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ["ANTHROPIC", "REMOTE"])
def test_lmpress_batch_sends_the_bound_and_writes_the_answer_without_the_thinking(engine, tmp_path):
    """`lmpress batch` end to end: the recipe's bound reaches every request in the provider's
    field, and each row's text is its answer alone (its thinking is the Result's `reasoning`,
    which the row writers put in `response.reasoning`)."""
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    questions = [f"Question {i} about the sky?" for i in range(4)]
    source.write_text("".join(json.dumps({"id": f"row-{i}", "prompt": q}) + "\n"
                              for i, q in enumerate(questions)))  # fmt: skip
    if engine == "ANTHROPIC":
        bound = ["--generation.max_reasoning_tokens", "1024", "--generation.max_new_tokens", "2048"]
    else:
        bound = ["--generation.reasoning_effort", "low"]
    with LLMServer(Faults(reasoning="reasoning_content")) as server:
        url = server.anthropic_url if engine == "ANTHROPIC" else server.openai_url
        run = run_lmpress(
            "batch", "--engine", engine, "--remote_params.api_url", url,
            "--model.model_name", "test-model", "-i", str(source), "-o", str(out), *bound,
        )  # fmt: skip
        bodies = [body for _, body in server.stats.bodies]
    assert run.returncode == 0, run.stderr[-2000:]
    if engine == "ANTHROPIC":
        assert [b["thinking"] for b in bodies] == [{"type": "enabled", "budget_tokens": 1024}] * 4
    else:
        assert [b["reasoning_effort"] for b in bodies] == ["low"] * 4
    rows = {row["id"]: row for row in map(json.loads, out.read_text().splitlines())}
    for i, question in enumerate(questions):
        response = rows[f"row-{i}"]["response"]
        assert response["text"] == reply_text(question)
        if "reasoning" in response:  # once the row writers carry it
            assert response["reasoning"] == thinking_text(question)
