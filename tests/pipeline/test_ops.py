"""`lmpress run`'s operations, on the loopback server: the dry run's per-step estimate (set in
the steps, then measured from a `--limit` run), `--max-cost` over the whole pipeline, the
one-writer lock, and `--ray` refused in one line."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import REPO
from tests.pipeline.helpers import DATA, KEY_ENV, read_jsonl, run, write
from tests.servers.llm_server import Faults, LLMServer

TOPICS = [{"topic": f"topic {i}"} for i in range(40)]


def priced(server, dollars: float = 1000.0) -> str:
    """The loopback model at a price per million tokens, in and out."""
    overrides = (
        f"{{remote_params.input_price_per_million: {dollars}, "
        f"remote_params.output_price_per_million: {dollars}}}"
    )
    return (
        f"{{engine: OPENAI, model: test-model, api_url: '{server.openai_url}', "
        f"overrides: {overrides}}}"
    )


def pipeline(model: str) -> str:
    return f"""models:
  m: {model}
steps:
  - {{name: answer, kind: generate, model: m, prompt: "Tell me about {{topic}}", n: 2,
     generation: {{max_new_tokens: 50}}, concurrency: 2}}
  - {{name: keep, kind: filter, expr: "'#1' not in answer", estimate: {{keep: 0.25}}}}
  - {{name: verdict, kind: generate, model: m, prompt: "Judge {{answer}}"}}
"""


def table(stdout: str) -> dict[str, list[str]]:
    """The dry run's rows by step name: its cells split on runs of spaces."""
    rows = {}
    for line in stdout.splitlines()[2:]:
        cells = line.split()
        if cells and cells[0] in ("answer", "keep", "verdict"):
            rows[cells[0]] = cells
    return rows


def test_dry_run_estimates_each_step_then_measures_a_limited_run(tmp_path):
    with LLMServer() as server:
        write(tmp_path, pipeline(priced(server)), TOPICS)
        dry = run(tmp_path, "out", "--dry-run")
        assert dry.returncode == 0, dry.stderr
        assert server.stats.requests == 0  # nothing sent
        assert not (tmp_path / "out" / DATA).exists()
        steps = table(dry.stdout)
        # answer: 40 in, n=2 -> 80 out, completions bounded by 50 tokens x 2 samples x 40 rows.
        assert steps["answer"][2:4] == ["40", "80"]
        assert steps["answer"][5] == "4,000"
        assert int(steps["answer"][4].replace(",", "")) > 40  # prompts counted
        assert steps["answer"][7] == "default"
        assert steps["keep"][2:4] + steps["keep"][-1:] == ["80", "20", "estimate"]
        # verdict reads a column the run makes: its prompt cannot be counted before a run.
        assert steps["verdict"][2] == "20" and steps["verdict"][4] == "?"
        assert "run with --limit N first" in dry.stderr

        limited = run(tmp_path, "out", "--limit", "4")
        assert limited.returncode == 0, limited.stderr
        measured = table(run(tmp_path, "out", "--dry-run").stdout)
    # Measured from the journal where the step sets no estimate (the filter's own wins), and
    # verdict's prompts, unknowable before, are now counted.
    assert measured["answer"][-1] == "measured"
    assert measured["answer"][5] != "4,000"  # real completions, not the bound
    assert measured["keep"][-1] == "estimate"
    assert measured["verdict"][4] != "?" and measured["verdict"][-1] == "measured"


def test_max_cost_stops_the_pipeline_and_the_same_command_resumes(tmp_path):
    with LLMServer() as server:
        write(tmp_path, pipeline(priced(server)), TOPICS)
        whole = run(tmp_path, "whole", "--cache", "off")
        assert whole.returncode == 0, whole.stderr
        stopped = run(tmp_path, "out", "--cache", "off", "--max-cost", "0.5")
        assert stopped.returncode == 1, stopped.stderr
        assert "lmpress: stopping: spent $" in stopped.stderr
        assert "of --max-cost $0.5; rows in flight finish first" in stopped.stderr
        assert "re-run the same command to resume" in stopped.stderr
        partial = read_jsonl(tmp_path / "out" / DATA)
        full = read_jsonl(tmp_path / "whole" / DATA)
        assert 0 < len(partial) < len(full)
        assert all(row in full for row in partial)
        rejects = read_jsonl(tmp_path / "out" / "rejects.jsonl")
        assert any("not run: spent $" in r.get("failed", "") for r in rejects)
        resumed = run(tmp_path, "out", "--cache", "off")
        assert resumed.returncode == 0, resumed.stderr
        assert read_jsonl(tmp_path / "out" / DATA) == full
        # Answers from the response cache cost nothing, so they spend none of the budget.
        assert run(tmp_path, "warm", "--cache", "all").returncode == 0
        cached = run(tmp_path, "cached", "--cache", "all", "--max-cost", "0.5")
    assert cached.returncode == 0, cached.stderr
    assert read_jsonl(tmp_path / "cached" / DATA) == full


def test_max_cost_without_a_price_is_refused_naming_the_step(tmp_path):
    with LLMServer() as server:
        model = f"{{engine: OPENAI, model: test-model, api_url: '{server.openai_url}'}}"
        write(tmp_path, pipeline(model), TOPICS)
        result = run(tmp_path, "out", "--max-cost", "1")
    assert result.returncode != 0
    [line] = result.stderr.strip().splitlines()
    assert "step 'answer': --max-cost needs a price for this model" in line


def test_ray_is_refused_in_one_line(tmp_path):
    write(tmp_path, "models: {}\nsteps: []\n", TOPICS)
    result = run(tmp_path, "out", "--ray")
    assert result.returncode != 0
    [line] = result.stderr.strip().splitlines()
    assert "--ray: a pipeline's steps cannot run on Ray replicas yet" in line


def test_a_second_run_on_the_same_output_is_refused_while_one_runs(tmp_path):
    with LLMServer(Faults(hold_after=2)) as server:
        write(tmp_path, pipeline(priced(server)), TOPICS)
        args = ["run", "pipe.yaml", "-i", "in.jsonl", "-o", "out", "--cache", "off"]
        env = {**os.environ, **KEY_ENV, "PYTHONPATH": str(REPO)}
        first = subprocess.Popen([sys.executable, "-m", "lmpress", *args], cwd=tmp_path, env=env,
                                 stderr=subprocess.PIPE, text=True)  # fmt: skip
        try:
            assert server.holding.wait(120)
            second = run(tmp_path, "out")
        finally:
            server.release()
            _, stderr = first.communicate(timeout=120)
    assert second.returncode != 0
    [line] = second.stderr.strip().splitlines()
    assert "is writing this output" in line
    assert first.returncode == 0, stderr
