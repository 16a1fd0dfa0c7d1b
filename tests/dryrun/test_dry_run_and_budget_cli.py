"""`lmpress batch --dry-run` (rows, bad rows, duplicates, tokens and cost, nothing generated) and
the budget guardrails `--max-cost` and `--max-tokens`, as a user sees them from the shell."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from lmpress.builtin_models.tiny_gguf import tiny_gguf
from tests.conftest import run_lmpress, with_plugin
from tests.servers.llm_server import LLMServer

ECHO = ["--engine", "ECHO", "--model.model_name", "echo", "--generation.max_new_tokens", "4"]


def table(stderr: str) -> dict[str, str]:
    """The dry run's table as {label: value}, rich's wrapped cells joined."""
    rows: dict[str, str] = {}
    label = None
    for line in stderr.splitlines():
        cells = [c.strip() for c in line.strip().split("│")[1:-1]]
        if len(cells) != 2:
            continue
        if cells[0]:
            label = cells[0]
            rows[label] = cells[1]
        elif label:
            rows[label] += " " + cells[1]
    return rows


def number(text: str) -> int:
    return int(re.sub(r"[^\d]", "", text.split("(")[0]))


def write(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


@pytest.mark.slow
def test_dry_run_prompt_tokens_equal_what_the_real_model_then_reports(tmp_path):
    rows = write(tmp_path / "in.jsonl", [
        {"id": "a", "prompt": "What is the capital of France?"},
        {"id": "b", "prompt": "Name a colour.", "system": "Answer in one word."},
        {"id": "c", "messages": [{"role": "user", "content": "Hi"},
                                 {"role": "assistant", "content": "Hello!"},
                                 {"role": "user", "content": "Count to three, très vite."}]},
        {"id": "d", "text": "Once upon a time"},
        {"id": "e", "prompt": "Why is the sky blue?", "system": "You are a physicist."},
    ])  # fmt: skip
    # A tiny quantized Qwen2 GGUF with its chat template: one file both CPU engines read, each
    # with its own tokenizer and template code, as SmolLM2's would be at seconds more a start.
    model = str(tiny_gguf("qwen2-q4k"))
    args = ["batch", "--model.model_name", model, "-i", str(rows),
            "--generation.max_new_tokens", "2", "--system", "Be brief."]  # fmt: skip
    for engine in ("LLAMACPP", "NATIVE"):
        dry = run_lmpress(*args, "--engine", engine, "--dry-run")
        assert dry.returncode == 0, dry.stderr
        shown = table(dry.stderr)
        assert number(shown["rows"]) == 5 and number(shown["bad rows"]) == 0
        assert "~" not in shown["prompt tokens"]
        assert number(shown["output tokens, at most"]) == 10
        assert not list(tmp_path.glob(f"out-{engine}*"))  # a dry run writes nothing
        out = tmp_path / f"out-{engine}.jsonl"
        run = run_lmpress(*args, "--engine", engine, "-o", str(out))
        assert run.returncode == 0, run.stderr
        summary = json.loads((tmp_path / f"out-{engine}.jsonl.summary.json").read_text())
        assert number(shown["prompt tokens"]) == summary["prompt_tokens"], engine
        assert summary["completion_tokens"] <= 10


def test_dry_run_counts_bad_rows_and_duplicates_and_writes_nothing(tmp_path, echo_plugin):
    rows = write(tmp_path / "in.jsonl", [
        {"id": "a", "prompt": "one"}, "{not json", {"id": "a", "prompt": "again"},
        {"id": "c", "nothing": 1}, {"id": "d", "prompt": "four"},
    ])  # fmt: skip
    run = run_lmpress("batch", "-i", str(rows), *ECHO, "--dry-run", env=with_plugin(echo_plugin),
                      cwd=tmp_path)  # fmt: skip
    assert run.returncode == 0, run.stderr
    shown = table(run.stderr)
    assert number(shown["rows"]) == 5
    assert shown["bad rows"].startswith("2")
    assert number(shown["duplicate ids"]) == 1
    assert shown["prompt tokens"].startswith("~")  # ECHO has no tokenizer: an estimate
    assert "estimate" in shown["tokenizer"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]


def test_dry_run_prices_a_hosted_model_live_and_with_the_batch_api(tmp_path):
    rows = write(tmp_path / "in.jsonl", [{"id": str(i), "prompt": "x" * 400} for i in range(10)])
    args = ["batch", "--engine", "OPENAI", "--model.model_name", "gpt-4o-mini", "-i", str(rows),
            "--generation.max_new_tokens", "100", "--dry-run"]  # fmt: skip
    shown = table(run_lmpress(*args, env={"OPENAI_API_KEY": "sk-test"}).stderr)
    assert "gpt-4o-mini" in shown["price per million tokens"]
    live = float(shown["cost live, at most"].lstrip("~$"))
    batch = float(shown["cost with the batch API, at most"].lstrip("~$"))
    assert batch == pytest.approx(live / 2, rel=0.02)
    override = run_lmpress(*args, "--remote_params.input_price_per_million", "1000",
                           "--remote_params.output_price_per_million", "0",
                           env={"OPENAI_API_KEY": "sk-test"})  # fmt: skip
    shown = table(override.stderr)
    prompt = number(shown["prompt tokens"])
    assert float(shown["cost live, at most"].lstrip("~$")) == pytest.approx(prompt / 1000, rel=0.01)


def test_max_tokens_stops_the_job_and_the_next_run_resumes(tmp_path, echo_plugin):
    rows = write(tmp_path / "in.jsonl", [{"id": f"r{i}", "prompt": f"p {i}"} for i in range(40)])
    out = tmp_path / "out.jsonl"
    args = ["batch", "-i", str(rows), "-o", str(out), *ECHO, "--generation.batch_size", "1"]
    env = with_plugin(echo_plugin)
    run = run_lmpress(*args, "--max-tokens", "30", env=env)
    assert run.returncode == 1
    assert "stopping: used" in run.stderr and "of --max-tokens 30" in run.stderr
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert 0 < len(written) < 40
    spent = sum(r["response"]["usage"]["total_tokens"] for r in written)
    assert 30 <= spent <= 30 + 8  # the row that crossed the cap finishes; nothing after it
    rest = run_lmpress(*args, env=env)
    assert rest.returncode == 0 and f"{len(written)} rows done" in rest.stderr
    assert len(out.read_text().splitlines()) == 40


def test_max_cost_stops_a_priced_job_and_every_row_records_its_cost(tmp_path):
    rows = write(tmp_path / "in.jsonl", [{"id": f"r{i}", "prompt": f"q {i}"} for i in range(60)])
    out = tmp_path / "out.jsonl"
    with LLMServer() as server:
        args = ["batch", "--engine", "REMOTE", "--remote_params.api_url", server.openai_url,
                "--model.model_name", "m", "--remote_params.num_workers", "1", "-i", str(rows),
                "-o", str(out), "--remote_params.input_price_per_million", "10000",
                "--remote_params.output_price_per_million", "10000"]  # fmt: skip
        run = run_lmpress(*args, "--max-cost", "1.5")
        assert run.returncode == 1, run.stderr
        assert "of --max-cost $1.5" in run.stderr
        written = [json.loads(line) for line in out.read_text().splitlines()]
        costs = [row["response"]["cost_usd"] for row in written]
        for row, cost in zip(written, costs, strict=True):
            assert cost == pytest.approx(row["response"]["usage"]["total_tokens"] / 100)
        # Rows already sent when the cap was reached finish (they are being paid for); no
        # row is sent after it.
        assert 1.5 <= sum(costs) < 1.5 + 4 * max(costs)
        summary = json.loads((tmp_path / "out.jsonl.summary.json").read_text())
        assert summary["cost_usd"] == pytest.approx(sum(costs), rel=1e-4)
        rest = run_lmpress(*args)
        assert rest.returncode == 0, rest.stderr
    assert len(out.read_text().splitlines()) == 60


def test_max_cost_without_a_price_is_refused_before_any_work(tmp_path, echo_plugin):
    rows = write(tmp_path / "in.jsonl", [{"id": "a", "prompt": "hi"}])
    run = run_lmpress("batch", "-i", str(rows), "-o", str(tmp_path / "out.jsonl"), *ECHO,
                      "--max-cost", "2", env=with_plugin(echo_plugin))  # fmt: skip
    assert run.returncode == 2
    assert "--max-cost needs a price" in run.stderr and "input_price_per_million" in run.stderr
    assert "loading" not in run.stderr
