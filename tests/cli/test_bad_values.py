"""Rows with values at and past the edges, through the real `lmpress batch` on the NATIVE and
LLAMACPP engines: each bad row is refused or fails alone, with one line naming the key, and
every other row is written. Run under a timeout: before the worker guard, a row that raised on
the worker thread (a huge seed) left the job waiting forever."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from tests.conftest import CliRun, run_lmpress

RECIPES = ["tiny-native", "tiny-llamacpp"]
TIMEOUT_S = 240  # a hang fails the test instead of the suite

# (row id, row's generation overrides or content, what the error line must name)
BAD_ROWS = [
    ("temp-inf", {"temperature": float("inf")}, "generation.temperature"),
    ("temp-nan", {"temperature": float("nan")}, "generation.temperature"),
    ("temp-neg", {"temperature": -0.5}, "generation.temperature"),
    ("top-p-nan", {"top_p": float("nan")}, "generation.top_p"),
    ("rep-inf", {"repetition_penalty": float("inf")}, "generation.repetition_penalty"),
    ("rep-neg", {"repetition_penalty": -1.0}, "generation.repetition_penalty"),
    ("min-p-neg", {"min_p": -0.1}, "generation.min_p"),
    ("tokens-neg", {"max_new_tokens": -3}, "generation.max_new_tokens"),
    ("seed-huge", {"seed": 18446744073709551617, "temperature": 0.7}, "generation.seed"),
    ("seed-2-64", {"seed": 2**64}, "generation.seed"),
    ("seed-neg", {"seed": -1, "temperature": 0.7}, "generation.seed"),
    ("top-k-vocab", {"top_k": 10**9, "temperature": 0.7}, "generation.top_k"),
    ("top-k-zero", {"top_k": 0}, "generation.top_k"),
    ("stop-empty", {"stop_strings": ["", "x"]}, "generation.stop_strings"),
    ("stop-id-neg", {"stop_token_ids": [-1]}, "generation.stop_token_ids"),
    ("stop-id-vocab", {"stop_token_ids": [10**9]}, "generation.stop_token_ids"),
]


def _row(rid: str, generation: dict | None = None, content: str = "Say something.") -> dict:
    row = {"id": rid, "messages": [{"role": "user", "content": content}]}
    if generation is not None:
        row["generation"] = generation
    return row


# One job a recipe carries the bad values and the rows whose replies are compared: starting
# NATIVE costs seconds of CPU a run. The compared rows come first, together (8, the recipes'
# batch_size), so that each pair decodes side by side as it did in a job of its own. (The lone
# surrogate below has a job of its own: it fails on the engine's worker, after the bad values
# fail as they are read, and only the first few failures are said on stderr.)
PROMPTS = ["Why is the sky blue?", "Name three colours.", "Count to five."]
COMPARED = [
    _row("plain"),
    _row("huge-stop", {"stop_strings": ["ab" * (5 * 1024 * 1024)]}),
    *(_row(f"greedy-{i}", {"temperature": 0.0}, p) for i, p in enumerate(PROMPTS)),
    *(_row(f"tiny-{i}", {"temperature": 1e-40, "seed": 7}, p) for i, p in enumerate(PROMPTS)),
]


# json.dumps writes inf and nan as Infinity and NaN, which Python's JSON reader (and so
# lmpress's) accepts: exactly what a careless producer emits.
def _lines() -> list[str]:
    return [
        *map(json.dumps, COMPARED),
        json.dumps(_row("first")),
        *(
            json.dumps(row)
            for rid, gen, _ in BAD_ROWS
            for row in (_row(rid, gen), _row(f"after-{rid}"))
        ),
    ]


@dataclass
class Job:
    run: CliRun
    written: dict[str, dict]
    errors: dict[str, dict]


@pytest.fixture(scope="module", params=RECIPES)
def job(request, tmp_path_factory) -> Job:
    tmp = tmp_path_factory.mktemp(request.param)
    src = tmp / "in.jsonl"
    src.write_text("\n".join(_lines()) + "\n", encoding="utf-8")
    out = tmp / "out.jsonl"
    run = run_lmpress(
        "batch", "-c", request.param, "-i", str(src), "-o", str(out),
        "--generation.max_new_tokens", "6", timeout=TIMEOUT_S,
    )  # fmt: skip
    written = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    errors_path = tmp / "out.jsonl.errors.jsonl"
    errors = (
        [json.loads(line) for line in errors_path.read_text(encoding="utf-8").splitlines()]
        if errors_path.exists()
        else []
    )
    return Job(run, {r["id"]: r for r in written}, {e["id"]: e for e in errors})


@pytest.mark.timeout(TIMEOUT_S + 60)
def test_each_bad_value_fails_its_row_alone(job):
    run, written, errors = job.run, job.written, job.errors
    assert run.returncode == 1, run.stderr  # some rows failed; the job finished
    assert set(errors) == {rid for rid, _, _ in BAD_ROWS}, run.stderr
    assert set(written) == {row["id"] for row in COMPARED} | {"first"} | {
        f"after-{rid}" for rid, _, _ in BAD_ROWS
    }
    assert all(r["response"]["text"] for r in written.values())
    for rid, _, key in BAD_ROWS:
        message = errors[rid]["error"]["message"]
        assert key in message, (rid, message)
        assert "\n" not in message and "Traceback" not in message
    assert "Traceback" not in run.stderr and "internal error" not in run.stderr


@pytest.mark.timeout(TIMEOUT_S + 60)
def test_a_tiny_temperature_decodes_greedily(job):
    """1e-40 once turned NATIVE's logits into inf and its softmax into NaN, which sampled the
    last token of the vocabulary every step; below 0.01 both CPU engines decode greedily."""
    for i in range(len(PROMPTS)):
        assert f"greedy-{i}" not in job.errors and f"tiny-{i}" not in job.errors
        assert (
            job.written[f"tiny-{i}"]["response"]["text"]
            == job.written[f"greedy-{i}"]["response"]["text"]
        )


@pytest.mark.timeout(TIMEOUT_S + 60)
def test_a_10_mb_stop_string_is_honoured_and_the_job_finishes(job):
    assert "plain" not in job.errors and "huge-stop" not in job.errors
    # A stop string longer than any reply can never match: the reply is the plain one.
    text = job.written["huge-stop"]["response"]["text"]
    assert text == job.written["plain"]["response"]["text"]
    assert "first" in job.written  # rows after it were run


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("--generation.temperature=.inf", "generation.temperature"),
        ("--generation.temperature=.nan", "generation.temperature"),
        ("--generation.repetition_penalty=.inf", "generation.repetition_penalty"),
        ("--generation.seed=18446744073709551617", "generation.seed"),
        ("--generation.seed=-5", "generation.seed"),
        ("--generation.logit_bias={'5': .inf}", "generation.logit_bias"),
    ],
)
def test_a_bad_value_in_the_config_is_refused_at_load(override, key):
    run = run_lmpress("config", "show", "-c", "tiny-native", override)
    assert run.returncode == 2, run.stdout
    [line] = run.stderr.strip().splitlines()
    assert key in line and "Traceback" not in line


# --- text with no UTF-8 form ---------------------------------------------------------------


SURROGATE_LINE = '{"id": "bad", "messages": [{"role": "user", "content": "bad \\ud800 x"}]}'


@pytest.mark.timeout(TIMEOUT_S + 60)
def test_a_lone_surrogate_fails_its_row_alone(tmp_path):
    """On LLAMACPP: both CPU engines check a row's text on the one local worker
    (engines/local/worker.py) before their tokenizer sees it, so NATIVE, which costs seconds
    more to start, would take the same path."""
    src = tmp_path / "in.jsonl"
    lines = [
        json.dumps(_row("before")),
        SURROGATE_LINE,
        # Carried in metadata only, the surrogate reaches the output file: escaped, not fatal.
        '{"id": "meta", "messages": [{"role": "user", "content": "hi"}], "metadata": {"x": "\\udc80"}}',
        json.dumps(_row("after")),
    ]
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    run = run_lmpress(
        "batch", "-c", "tiny-llamacpp", "-i", str(src), "-o", str(out), timeout=TIMEOUT_S
    )
    assert run.returncode == 1, run.stderr
    assert "internal error" not in run.stderr
    written = {r["id"]: r for r in map(json.loads, out.read_text(encoding="utf-8").splitlines())}
    assert set(written) == {"before", "meta", "after"}
    assert written["meta"]["metadata"] == {"x": "\udc80"}
    error_lines = [line for line in run.stderr.splitlines() if ":2: " in line]
    assert len(error_lines) == 1
    assert "message 1 content" in error_lines[0] and "\\ud800" in error_lines[0]


def test_infer_refuses_a_prompt_with_no_utf8_form():
    # An argument that is not UTF-8 reaches Python as a lone surrogate (surrogateescape).
    # LLAMACPP only: both CPU engines check rows on the one local worker (the job above);
    # this is infer's front saying it.
    run = run_lmpress("infer", "-c", "tiny-llamacpp", "bad \udcff x", timeout=TIMEOUT_S)
    assert run.returncode != 0
    assert "internal error" not in run.stderr and "Traceback" not in run.stderr
    assert "not valid Unicode text" in run.stderr
