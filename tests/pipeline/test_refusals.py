"""A pipeline that cannot run is refused in one line naming the step and what is wrong, before
any work: exit 2, no traceback, no request to the model."""

from __future__ import annotations

import pytest

from tests.pipeline.helpers import DATA, remote_model, run, write
from tests.servers.llm_server import LLMServer


@pytest.fixture(scope="module")
def server():
    with LLMServer() as server:
        yield server


def refused(tmp_path, server, steps: str, rows=({"topic": "cats"},)) -> str:
    write(tmp_path, f"models:\n  m: {remote_model(server)}\nsteps:\n{steps}", list(rows))
    before = server.stats.requests
    result = run(tmp_path, "out")
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("lmpress: error")]
    assert len(lines) == 1, result.stderr
    assert server.stats.requests == before
    assert not (tmp_path / "out" / DATA).exists()
    return lines[0]


def test_a_column_no_step_makes(tmp_path, server):
    line = refused(
        tmp_path, server,
        "  - {name: ask, kind: generate, model: m, prompt: 'About {topic}', output: q}\n"
        "  - {name: answer, kind: generate, model: m, prompt: 'Answer {question}'}\n",
    )  # fmt: skip
    assert "step 'answer'" in line and "column 'question'" in line
    assert "q, topic" in line  # what there is to choose from


def test_a_filter_reaching_for_builtins(tmp_path, server):
    for expr in ("().__class__.__bases__", "__import__('os')", "topic.__class__"):
        line = refused(tmp_path, server, f'  - {{name: f, kind: filter, expr: "{expr}"}}\n')
        assert "step 'f'" in line and "not allowed" in line, line


def test_a_filter_has_no_globals(tmp_path, server):
    line = refused(tmp_path, server, "  - {name: f, kind: filter, expr: 'range(3)'}\n")
    assert "step 'f'" in line and "column 'range'" in line


def test_an_unknown_kind(tmp_path, server):
    line = refused(tmp_path, server, "  - {name: s, kind: summarize, model: m}\n")
    assert "step 's'" in line and "unknown kind 'summarize'" in line


def test_an_unknown_key_and_an_undefined_model(tmp_path, server):
    line = refused(tmp_path, server, "  - {name: g, kind: generate, model: m, prompt: x, nn: 2}\n")
    assert "step 'g'" in line and "nn: unknown key" in line
    line = refused(tmp_path, server, "  - {name: g, kind: generate, model: w, prompt: x}\n")
    assert "step 'g'" in line and "model 'w' is not defined" in line


def test_a_generation_setting_the_engine_does_not_honour(tmp_path, server):
    line = refused(
        tmp_path, server,
        "  - {name: g, kind: generate, model: m, prompt: x, generation: {min_p: 0.1}}\n",
    )  # fmt: skip
    assert "step 'g'" in line and "generation.min_p" in line
