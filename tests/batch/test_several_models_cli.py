"""`lmpress batch --models A,B` (issue 54): every row through every model, killed with SIGKILL
mid-job and resumed with every (row, model) pair once; lines that name a model routed to it;
the summary per model; `--compare`'s report; and in a one-model job, the count of lines naming
another model and `--strict-model`'s 404 lines. The mechanics run on ECHO, two recipes that
differ in how many words they reply with, so their replies differ where a prompt is long."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.conftest import REPO, lmpress_process, run_lmpress, with_plugin
from tests.growing_files import whole_lines

ROWS = 24


@pytest.fixture
def env(echo_plugin) -> dict[str, str]:
    return with_plugin(echo_plugin)


@pytest.fixture
def recipes(tmp_path) -> tuple[str, str]:
    """Two ECHO models: `long` replies with 8 words, `short` with 3, a row at a time (so a
    kill lands between rows)."""
    made = []
    for name, words in (("long", 8), ("short", 3)):
        path = tmp_path / f"{name}.yaml"
        path.write_text(
            f"engine: ECHO\nmodel:\n  model_name: echo-{name}\n"
            f"generation:\n  max_new_tokens: {words}\n  batch_size: 1\n"
        )
        made.append(str(path))
    return made[0], made[1]


def batch_line(cid: str, text: str, model: str | None = None) -> dict:
    body: dict = {"messages": [{"role": "user", "content": text}]}
    if model is not None:
        body["model"] = model
    return {"custom_id": cid, "method": "POST", "url": "/v1/chat/completions", "body": body}


def write_input(path: Path, lines: list[dict]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def lines_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_models_killed_mid_job_resume_with_every_pair_once(tmp_path, env, recipes):
    long, short = recipes
    rows = [batch_line(f"r{i}", f"say {i} " + "word " * (i % 4)) for i in range(ROWS)]
    rows.append(batch_line("only-short", "just one model", model="echo-short"))
    rows.append(batch_line("nobody", "no such model", model="gpt-9"))
    source = write_input(tmp_path / "in.jsonl", rows)
    out = tmp_path / "out.jsonl"
    args = ["batch", "-i", str(source), "-o", str(out), "--models", f"{long},{short}"]
    parts = [out.with_name("out.jsonl.models") / f"0{i}-{n}.jsonl" for i, n in ((1, "long"),
             (2, "short"))]  # fmt: skip
    kills = 0
    full_env = {**os.environ, **env, "ECHO_DELAY_S": "0.01"}
    for target in (5, 14, 30):  # whole lines across the parts: kills in one part or both
        proc = lmpress_process(*args, env=full_env, cwd=REPO,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.time() + 60
        while proc.poll() is None and time.time() < deadline:
            if sum(len(whole_lines(p)) for p in parts) >= target:
                break
            time.sleep(0.005)
        if proc.poll() is not None:
            break
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        kills += 1
    assert kills >= 2
    done = run_lmpress(*args, "--compare", env=env)
    assert done.returncode == 1, done.stderr  # the line naming gpt-9 failed
    got = lines_of(out)
    pairs = [(line["custom_id"], line["response"]["body"]["model"]) for line in got]
    want = [(f"r{i}", label) for label in (long, short) for i in range(ROWS)]
    assert sorted(pairs) == sorted([*want, ("only-short", short)])  # each pair once
    replies = {pair: line["response"]["body"]["choices"][0]["message"]["content"]
               for pair, line in zip(pairs, got, strict=True)}  # fmt: skip
    assert replies[("r3", long)].startswith(replies[("r3", short)])
    assert replies[("r3", long)] != replies[("r3", short)]
    errors = lines_of(tmp_path / "out.jsonl.errors.jsonl")
    assert [(e["custom_id"], e["model"]) for e in errors] == [("nobody", long)]
    assert errors[0]["response"]["status_code"] == 404
    assert "gpt-9" in errors[0]["error"]["message"]
    summary = json.loads((tmp_path / "out.jsonl.summary.json").read_text())
    assert [m["model"] for m in summary["models"]] == [long, short]
    per_model = {m["model"]: m for m in summary["models"]}
    assert per_model[short]["rows_ok"] + per_model[short]["rows_skipped"] == ROWS + 1
    assert per_model[long]["rows_elsewhere"] == 1  # the line naming the short model
    assert summary["rows_failed"] == 1
    report = (tmp_path / "out.jsonl.compare.md").read_text()
    assert report in done.stdout
    agree = sum(1 for i in range(ROWS) if replies[(f"r{i}", long)] == replies[(f"r{i}", short)])
    assert f"{agree} of {ROWS} rows answered by every model" in report
    assert f"| {long} | {ROWS} |" in report and f"| {short} | {ROWS + 1} |" in report


def test_models_to_parquet_summary_per_model_and_bad_names(tmp_path, env, recipes):
    long, short = recipes
    source = write_input(tmp_path / "in.jsonl", [{"id": f"q{i}", "prompt": f"hi {i}"}
                                                  for i in range(4)])  # fmt: skip
    out = tmp_path / "out.parquet"
    done = run_lmpress("batch", "-i", str(source), "-o", str(out), "--models",
                       f"{long},{short}", env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    table = pq.read_table(out).to_pylist()
    assert sorted((r["id"], r["model"]) for r in table) == sorted(
        (f"q{i}", m) for m in (long, short) for i in range(4)
    )
    assert {r["completion_tokens"] for r in table if r["model"] == short} == {3}
    assert "lmpress batch --models" in done.stderr  # the table of models
    summary = json.loads((tmp_path / "out.parquet.summary.json").read_text())
    assert [(m["model"], m["rows_ok"]) for m in summary["models"]] == [(long, 4), (short, 4)]
    dry = run_lmpress("batch", "-i", str(source), "-o", str(tmp_path / "d.jsonl"), "--models",
                      f"{long},{short}", "--dry-run", env=env)  # fmt: skip
    assert dry.returncode == 0, dry.stderr
    assert f"model {long}" in dry.stderr and f"model {short}" in dry.stderr
    assert dry.stderr.count("lmpress batch --dry-run") == 2  # a table per model
    bad = run_lmpress("batch", "-i", str(source), "-o", str(tmp_path / "x.jsonl"), "--models",
                      f"{long},no-such-recipe", env=env)  # fmt: skip
    assert bad.returncode == 2
    assert bad.stderr.count("\n") == 1 and "model 'no-such-recipe'" in bad.stderr


def test_one_model_job_counts_lines_naming_another_and_strict_fails_them(tmp_path, env):
    lines = [batch_line("a", "hello", model="echo"), batch_line("b", "hi", model="gpt-4o"),
             batch_line("c", "hey", model="gpt-4o"), batch_line("d", "yo")]  # fmt: skip
    source = write_input(tmp_path / "in.jsonl", lines)
    echo = ["--engine", "ECHO", "--model.model_name", "echo", "--generation.max_new_tokens", "4"]
    out = tmp_path / "out.jsonl"
    done = run_lmpress("batch", "-i", str(source), "-o", str(out), *echo, env=env)
    assert done.returncode == 0, done.stderr
    assert sorted(line["custom_id"] for line in lines_of(out)) == ["a", "b", "c", "d"]
    summary = json.loads((tmp_path / "out.jsonl.summary.json").read_text())
    assert summary["rows_naming_other_model"] == 2
    assert "lines naming another model" in done.stderr
    strict = tmp_path / "strict.jsonl"
    refused = run_lmpress("batch", "-i", str(source), "-o", str(strict), "--strict-model",
                          *echo, env=env)  # fmt: skip
    assert refused.returncode == 1
    assert sorted(line["custom_id"] for line in lines_of(strict)) == ["a", "d"]
    errors = lines_of(tmp_path / "strict.jsonl.errors.jsonl")
    assert sorted(e["custom_id"] for e in errors) == ["b", "c"]
    for error in errors:  # vLLM's run-batch line for a model it does not serve
        assert error["response"]["status_code"] == 404 and "gpt-4o" in error["error"]["message"]


def test_remote_models_run_side_by_side_within_one_budget(tmp_path):
    """Two models on one loopback OpenAI server, one request at a time each: the server holds
    its replies until two requests are in flight together, which only models side by side
    reach; --max-tokens counts both models' tokens against one cap."""
    from tests.servers.llm_server import Faults, LLMServer

    rows = [{"id": f"q{i}", "prompt": f"Question {i}?"} for i in range(40)]
    source = write_input(tmp_path / "in.jsonl", rows)
    with LLMServer(Faults(gather=2)) as server:
        labels = []
        for name in ("first", "second"):
            recipe = tmp_path / f"{name}.yaml"
            recipe.write_text(
                f"engine: REMOTE\nmodel:\n  model_name: {name}-model\nremote_params:\n"
                f"  api_url: {server.openai_url}\n  num_workers: 1\n"
            )
            labels.append(str(recipe))
        out = tmp_path / "out.jsonl"
        done = run_lmpress("batch", "-i", str(source), "-o", str(out), "--models",
                           ",".join(labels), "--max-tokens", "200")  # fmt: skip
        assert server.gathered.is_set()
    assert done.returncode == 1, done.stderr  # stopped by the budget: resumable
    summary = json.loads((tmp_path / "out.jsonl.summary.json").read_text())
    used = summary["prompt_tokens"] + summary["completion_tokens"]
    per_model = [m["prompt_tokens"] + m["completion_tokens"] for m in summary["models"]]
    assert all(tokens > 0 for tokens in per_model) and sum(per_model) == used
    # Rows in flight when the cap is reached still finish; two caps of their own would have
    # let each model reach 200.
    assert 200 <= used < 400
    assert "--max-tokens 200" in summary["stopped_because"]
