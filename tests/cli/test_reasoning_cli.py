"""A reasoning model through the CLI fronts, on the ECHO engine thinking (ECHO_THINK): `infer`
prints the answer on stdout and the thinking on stderr, `batch` writes the thinking apart
from the answer in every output shape, and `chat` shows it before the answer and keeps it in
the history."""

from __future__ import annotations

import json
import os
import sys

import pexpect
import pyarrow.parquet as pq
import pytest

from tests.conftest import REPO, run_lmpress, with_plugin

THINKING = "let me think about it"
REASONING_PAGE = REPO / "docs" / "reasoning.md"


@pytest.fixture
def thinking_echo(echo_plugin) -> dict[str, str]:
    return {**with_plugin(echo_plugin), "ECHO_THINK": THINKING}


def test_infer_prints_the_answer_on_stdout_and_the_thinking_on_stderr(thinking_echo):
    run = run_lmpress("infer", "--engine", "ECHO", "hi", env=thinking_echo)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout[len("ECHO ") :]) == [{"role": "user", "content": "hi"}]
    assert THINKING + "\n" in run.stderr and "\x1b[" not in run.stderr  # dimmed on a terminal only
    assert THINKING not in run.stdout

    budget = run_lmpress(
        "infer", "--engine", "ECHO", "--generation.max_reasoning_tokens=2", "hi", env=thinking_echo
    )
    assert "let me\n" in budget.stderr and "think" not in budget.stderr

    two = run_lmpress("infer", "--engine", "ECHO", "--generation.n=2", "hi", env=thinking_echo)
    assert two.returncode == 0, two.stderr
    assert two.stdout.count("ECHO [") == 2 and "--- sample 2 ---\n" in two.stdout
    assert two.stderr.count(THINKING + "\n") == 2  # each sample's thinking, on stderr


def test_on_a_terminal_infers_thinking_is_dimmed_before_the_answer(thinking_echo):
    env = {
        **os.environ,
        **thinking_echo,
        "PYTHONPATH": thinking_echo["PYTHONPATH"],
        "TERM": "xterm",
    }
    env.pop("NO_COLOR", None)
    child = pexpect.spawn(
        sys.executable, ["-m", "lmpress", "infer", "--engine", "ECHO", "hi"], env=env,
        encoding="utf-8", timeout=120,
    )  # fmt: skip
    child.expect(pexpect.EOF)
    shown = child.before.replace("\r\n", "\n")
    assert shown.index(f"\x1b[2m{THINKING}\x1b[0m\n") < shown.index("ECHO [")


def test_batch_writes_the_thinking_apart_in_every_output_shape(thinking_echo, tmp_path):
    rows = tmp_path / "in.jsonl"
    rows.write_text(
        json.dumps({"id": "a", "prompt": "hi"}) + "\n"
        + json.dumps({"id": "b", "prompt": "yo", "generation": {"max_reasoning_tokens": 1}})
        + "\n"
    )  # fmt: skip
    out = tmp_path / "out.jsonl"
    run = run_lmpress(
        "batch", "--engine", "ECHO", "-i", str(rows), "-o", str(out), env=thinking_echo
    )
    assert run.returncode == 0, run.stderr
    lines = {line["id"]: line for line in map(json.loads, out.read_text().splitlines())}
    assert lines["a"]["response"]["reasoning"] == THINKING
    assert lines["a"]["response"]["usage"]["reasoning_tokens"] == 5
    assert lines["b"]["response"]["reasoning"] == "let"
    assert lines["a"]["messages"][-1]["content"].startswith("ECHO ")
    assert "of out, thinking" in run.stderr  # the summary counts the thinking
    summary = json.loads((tmp_path / "out.jsonl.summary.json").read_text())
    assert summary["reasoning_tokens"] == 6 and summary["completion_tokens"] > 6

    openai = tmp_path / "openai.jsonl"
    run = run_lmpress(
        "batch", "--engine", "ECHO", "-i", str(rows), "-o", str(openai),
        "--output-format", "openai", env=thinking_echo,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    by_id = {line["custom_id"]: line for line in map(json.loads, openai.read_text().splitlines())}
    body = by_id["a"]["response"]["body"]  # rows are written as they finish: found by id
    message = body["choices"][0]["message"]
    assert message["reasoning_content"] == message["reasoning"] == THINKING
    assert message["content"] == lines["a"]["response"]["text"]  # the answer alone
    assert body["usage"]["completion_tokens_details"] == {"reasoning_tokens": 5}
    b_usage = by_id["b"]["response"]["body"]["usage"]  # a row's own budget, in this shape too
    assert b_usage["completion_tokens_details"] == {"reasoning_tokens": 1}

    parquet = tmp_path / "out.parquet"
    run = run_lmpress(
        "batch", "--engine", "ECHO", "-i", str(rows), "-o", str(parquet), env=thinking_echo
    )
    assert run.returncode == 0, run.stderr
    table = {r["id"]: r for r in pq.read_table(parquet).to_pylist()}
    assert (table["a"]["reasoning"], table["a"]["reasoning_tokens"]) == (THINKING, 5)
    assert table["a"]["response"] == lines["a"]["response"]["text"]
    assert table["b"]["reasoning_tokens"] == 1


def test_chat_shows_the_thinking_before_the_answer_and_keeps_it(thinking_echo, tmp_path):
    saved = tmp_path / "chat.jsonl"
    script = f"first\nsecond\n/think off\nthird\n/think maybe\n/save {saved}\n"
    run = run_lmpress("chat", "--engine", "ECHO", input=script, env=thinking_echo)
    assert run.returncode == 1  # /think maybe failed, and the chat went on
    assert "usage: /think on|off" in run.stderr
    replies = run.stdout.splitlines()
    assert len(replies) == 3 and all(r.startswith("ECHO [") for r in replies)  # answers alone
    assert run.stderr.count(THINKING + "\n") == 2  # shown for the first two, hidden after
    assert run.stderr.count("· thinking 5 of the ") == 3  # counted in each status line
    # The history keeps the answer as the turn's content and the thinking apart.
    assert json.loads(replies[1][len("ECHO ") :])[1] == {
        "role": "assistant", "content": replies[0], "reasoning": THINKING,
    }  # fmt: skip
    row = json.loads(saved.read_text())
    assert row["messages"][-1] == {
        "role": "assistant", "content": replies[2], "reasoning_content": THINKING,
    }  # fmt: skip


def test_a_bad_reasoning_setting_is_one_line_in_a_recipe_and_in_chat(thinking_echo):
    run = run_lmpress(
        "infer", "--engine", "ECHO", "--generation.reasoning_effort=bogus", "hi", env=thinking_echo
    )
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert "generation.reasoning_effort: 'bogus' must be one of none" in run.stderr
    chat = run_lmpress(
        "chat", "--engine", "ECHO", input="/set reasoning_effort=bogus\n/help\n", env=thinking_echo
    )
    assert "error: generation.reasoning_effort: 'bogus' must be one of" in chat.stderr
    assert "/think [on|off]" in chat.stderr and "Traceback" not in chat.stderr


# --- a real reasoning model's shape: NATIVE on tiny:think -------------------------------------

THINK = ["--engine", "NATIVE", "--model.model_name", "tiny:think",
         "--generation.max_new_tokens", "12", "--generation.max_reasoning_tokens", "4"]  # fmt: skip


def reasoning_page_run() -> tuple[str, list[str], dict]:
    """The example of docs/reasoning.md: the row it writes to q.jsonl, the command's
    arguments after `lmpress`, and the line it shows."""
    section = REASONING_PAGE.read_text().split("# Reasoning models\n", 1)[1]
    command = section.split("```sh\n", 1)[1].split("```", 1)[0]
    shown = json.loads(section.split("```json\n", 1)[1].split("```", 1)[0])
    row = command.splitlines()[0].split("'")[1]
    args = " ".join(command.splitlines()[1:3]).replace("\\", "").split()
    assert args[0] == "lmpress"
    return row, args[1:], shown


@pytest.fixture(scope="module")
def tiny_think_rows(tmp_path_factory) -> dict[str, dict]:
    """The reasoning page's command, run as it is written, on its row and the rows the tests
    below read (one NATIVE job: each start costs seconds of CPU): two within the budgets, one with
    its own thinking budget, one structured. Each row's line, by id."""
    tmp = tmp_path_factory.mktemp("tiny-think")
    row, args, _ = reasoning_page_run()
    assert args == ["batch", *THINK, "-i", "q.jsonl", "-o", "out.jsonl"]  # infer's, below
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}  # fmt: skip
    rows = [
        {"id": "a", "prompt": "hi"},
        {"id": "b", "prompt": "hi", "generation": {"max_reasoning_tokens": 2}},
        {"id": "s", "prompt": "hi",
         "generation": {"max_new_tokens": 40, "guided_decoding": {"json": schema}}},
    ]  # fmt: skip
    (tmp / "q.jsonl").write_text(row + "\n" + "".join(json.dumps(r) + "\n" for r in rows))
    run = run_lmpress(*args, cwd=tmp)
    assert run.returncode == 0, run.stderr
    return {
        line["id"]: line for line in map(json.loads, (tmp / "out.jsonl").read_text().splitlines())
    }


def test_tiny_think_writes_the_same_thinking_and_answer_in_batch_and_infer(tiny_think_rows):
    """Greedy, so infer's stdout and stderr are the batch row's answer and thinking; the
    thinking stops at the budget and the answer follows it. (The other output shapes are
    written from the same result on every engine: the ECHO test above reads them.)"""
    a, b = tiny_think_rows["a"]["response"], tiny_think_rows["b"]["response"]
    assert (a["usage"]["reasoning_tokens"], b["usage"]["reasoning_tokens"]) == (4, 2)
    assert a["reasoning"] and a["text"] and a["usage"]["completion_tokens"] == 12
    assert b["reasoning"] != a["reasoning"]

    infer = run_lmpress("infer", *THINK, "hi")
    assert infer.returncode == 0, infer.stderr
    assert infer.stdout == a["text"] + "\n"
    assert a["reasoning"] + "\n" in infer.stderr


def test_tiny_think_a_structured_rows_answer_validates_with_the_thinking_apart(tiny_think_rows):
    response = tiny_think_rows["s"]["response"]
    assert response["structured"] == {"valid": True, "parsed": json.loads(response["text"])}
    assert response["reasoning"] and response["usage"]["reasoning_tokens"] == 4


def test_the_reasoning_pages_run_writes_what_it_shows(tiny_think_rows):
    *_, shown = reasoning_page_run()
    written = tiny_think_rows[shown["id"]]
    latency = {"latency_s": shown["response"]["latency_s"]}
    assert {**written, "response": {**written["response"], **latency}} == shown
