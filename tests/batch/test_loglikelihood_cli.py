"""`lmpress batch --task loglikelihood` and `--task perplexity` through the real command, on the
tiny Llama via NATIVE: every number checked against transformers' own forward pass on the same
weights and the same tokens, in JSONL and Parquet, from the response cache, after kill -9 and
resume, in the dry run, and bad rows failing alone in one line each."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from lmpress.vocabulary.likelihood import encode_pair, rolling_windows
from tests.conftest import REPO, lmpress_process, run_lmpress

pytestmark = pytest.mark.timeout(300)

CONTEXT = 512  # the tiny models' context (builtin_models/tiny.py)
QUESTIONS = [
    {"id": "q1", "context": "The sky is", "choices": [" blue", " green", " made of cheese"],
     "gold": 0},
    {"id": "q2", "context": "Two and two make ", "choices": ["four", "five"], "gold": 1},
    {"id": "q3", "context": "", "choices": ["Hello", "A longer opening line"]},
    {"id": "q4", "context": "Once upon a time", "continuation": " there was a cat"},
]  # fmt: skip
BAD = [
    {"id": "b1", "context": "no continuation"},
    {"id": "b2", "context": "x", "choices": [" a", " b"], "gold": 2},
    {"id": "b3", "context": "x", "choices": [" a", 7]},
    {"id": "b4", "prompt": "a chat row"},
]
TEXTS = [
    {"id": "t1", "text": "The cat sat on the mat."},
    {"id": "t2", "text": " ".join(f"word{i} and more" for i in range(300))},  # several windows
]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def batch(tiny: str, src: Path, out: Path, task: str, *more: str, **kw) -> object:
    return run_lmpress(
        "batch", "-i", str(src), "-o", str(out), "--engine", "NATIVE",
        "--model.model_name", tiny, "--task", task, *more, **kw,
    )  # fmt: skip


class Reference:
    """transformers' float32 forward pass on the tiny model: each token's logprob after the
    ones before it, and whether it was the likeliest."""

    def __init__(self, path: str):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
        tok = self.tokenizer
        self.prefix = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def tokens(self, ids: list[int], start: int) -> tuple[list[float], list[bool]]:
        with self.torch.no_grad():
            logits = self.model(self.torch.tensor([ids])).logits[0].float()
        logprobs = logits.log_softmax(-1)
        picked = [float(logprobs[i - 1, ids[i]]) for i in range(start, len(ids))]
        greedy = [int(logprobs[i - 1].argmax()) == ids[i] for i in range(start, len(ids))]
        return picked, greedy

    def choice(self, context: str, continuation: str) -> tuple[float, bool, int]:
        own, tail = encode_pair(self.encode, context, continuation, self.prefix)
        own = own or [self.prefix]
        picked, greedy = self.tokens(own + tail, len(own))
        return math.fsum(picked), all(greedy), len(tail)

    def text(self, text: str) -> tuple[float, int]:
        ids = self.encode(text)
        total = []
        for context, continuation in rolling_windows(ids, self.prefix, CONTEXT):
            total += self.tokens(context + continuation, len(context))[0]
        return math.fsum(total), len(ids)


@pytest.fixture(scope="module")
def reference(tiny_llama) -> Reference:
    return Reference(tiny_llama)


@pytest.fixture(scope="module")
def scored(tiny_llama, tmp_path_factory):
    """One loglikelihood run over good and bad rows, its output read back."""
    folder = tmp_path_factory.mktemp("ll")
    src = write_jsonl(folder / "in.jsonl", QUESTIONS + BAD)
    out = folder / "out.jsonl"
    run = batch(tiny_llama, src, out, "loglikelihood", "--cache-dir", str(folder / "cache"))
    return folder, src, run, {row["id"]: row for row in read_jsonl(out)}


def test_each_choice_scores_as_transformers_does_on_the_same_tokens(scored, reference):
    _, _, run, rows = scored
    assert run.returncode == 1, run.stderr  # the bad rows failed
    assert sorted(rows) == ["q1", "q2", "q3", "q4"]
    for question in QUESTIONS[:3]:
        row = rows[question["id"]]
        expected = [reference.choice(question["context"], c) for c in question["choices"]]
        assert row["choice_logprobs"] == pytest.approx([e[0] for e in expected], abs=1e-4)
        assert row["choice_is_greedy"] == [e[1] for e in expected]
        assert row["choice_tokens"] == [e[2] for e in expected]
        best = max(range(len(expected)), key=lambda i: expected[i][0])
        assert row["best"] == best
        assert row.get("correct") == (best == question["gold"] if "gold" in question else None)
        assert row["choices"] == question["choices"]  # the input row, as it was
        assert row["response"]["engine"] == "NATIVE"
        assert row["response"]["usage"]["prompt_tokens"] > 0
    single = rows["q4"]
    logprob, greedy, tokens = reference.choice("Once upon a time", " there was a cat")
    assert single["logprob"] == pytest.approx(logprob, abs=1e-4)
    assert (single["is_greedy"], single["tokens"]) == (greedy, tokens)
    assert "choice_logprobs" not in single


def test_bad_rows_fail_alone_each_in_one_line_naming_what_to_give(scored):
    folder, _, run, _ = scored
    errors = {e["id"]: e["error"] for e in read_jsonl(folder / "out.jsonl.errors.jsonl")}
    assert sorted(errors) == ["b1", "b2", "b3", "b4"]
    assert "give 'continuation' (one text) or 'choices'" in errors["b1"]["message"]
    assert "'gold' must be the index of the right choice, 0 to 1, got 2" in errors["b2"]["message"]
    assert "'choices[1]' must be text, got a number" in errors["b3"]["message"]
    assert "a prompt row in a loglikelihood run" in errors["b4"]["message"]
    assert "Traceback" not in run.stderr
    assert "in.jsonl:6: 'gold' must be the index" in run.stderr  # the row's line, named


def test_the_response_cache_answers_a_second_run_and_parquet_holds_the_same(scored, tiny_llama):
    import pyarrow.parquet as pq

    folder, _, _, rows = scored
    src = write_jsonl(folder / "good.jsonl", QUESTIONS)
    out = folder / "again.parquet"
    run = batch(tiny_llama, src, out, "loglikelihood", "--cache-dir", str(folder / "cache"))
    assert run.returncode == 0, run.stderr
    table = pq.read_table(out).to_pylist()
    assert {row["id"] for row in table} == {"q1", "q2", "q3", "q4"}
    for row in table:
        assert row["cached"] is True  # every row kept by the first run
        for name in ("choice_logprobs", "choice_is_greedy", "choice_tokens", "best", "logprob"):
            assert row[name] == rows[row["id"]].get(name)
    types = {f.name: str(f.type) for f in pq.read_schema(out)}
    assert types["choice_logprobs"] == "list<element: double>"
    assert (types["best"], types["correct"], types["logprob"]) == ("int64", "bool", "double")


def test_perplexity_rows_score_every_token_once_in_windows_of_the_context(
    tiny_llama, reference, tmp_path
):
    src = write_jsonl(tmp_path / "texts.jsonl", [*TEXTS, {"id": "t3", "text": ""}])
    out = tmp_path / "ppl.jsonl"
    run = batch(tiny_llama, src, out, "perplexity")
    assert run.returncode == 1, run.stderr  # the empty text failed
    rows = {row["id"]: row for row in read_jsonl(out)}
    assert sorted(rows) == ["t1", "t2"]
    for text in TEXTS:
        logprob, tokens = reference.text(text["text"])
        row = rows[text["id"]]
        assert row["tokens"] == tokens
        assert row["logprob"] == pytest.approx(logprob, rel=1e-5, abs=1e-3)
        assert row["perplexity"] == pytest.approx(math.exp(-logprob / tokens), rel=1e-4)
    assert rows["t2"]["tokens"] > CONTEXT  # it took more than one window
    assert "'text' is empty; give it some text" in run.stderr


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_a_killed_job_resumes_with_every_row_exactly_once(tiny_llama, tmp_path, fmt):
    import pyarrow.parquet as pq

    rows = [
        {"id": f"r{i}", "context": f"Question {i}: which is right?", "choices": [" yes", " no"]}
        for i in range(200)
    ]
    src = write_jsonl(tmp_path / "many.jsonl", rows)
    out = tmp_path / f"scored.{fmt}"
    record = out if fmt == "jsonl" else Path(f"{out}.journal.jsonl")  # the rows done so far
    args = ["batch", "-i", str(src), "-o", str(out), "--engine", "NATIVE",
            "--model.model_name", tiny_llama, "--task", "loglikelihood", "--cache", "off",
            "--generation.batch_size", "8"]  # fmt: skip
    proc = lmpress_process(*args, env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if record.exists() and record.read_text().count("\n") >= 5:
                break
            time.sleep(0.05)
        assert proc.poll() is None, "the job ended before the kill"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
    done_before = record.read_text().count("\n")
    assert 0 < done_before < len(rows)
    run = run_lmpress(*args)
    assert run.returncode == 0, run.stderr
    written = read_jsonl(out) if fmt == "jsonl" else pq.read_table(out).to_pylist()
    ids = [row["id"] for row in written]
    assert sorted(ids) == sorted(row["id"] for row in rows)  # each once, none lost
    assert all(len(row["choice_logprobs"]) == 2 for row in written)
    summary = json.loads(Path(f"{out}.summary.json").read_text())
    assert summary["rows_skipped"] >= done_before - 1  # a torn last line is redone


def test_the_dry_run_reads_the_rows_and_loads_no_weights(tiny_llama, tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", QUESTIONS + BAD)
    run = batch(tiny_llama, src, tmp_path / "out.jsonl", "loglikelihood", "--dry-run")
    assert run.returncode == 0, run.stderr
    table = {
        cells[0]: cells[1]
        for line in run.stderr.splitlines()
        if len(cells := [c.strip() for c in line.strip("│ ").split("│")]) == 2
    }
    assert (table["rows"], table["bad rows"]) == ("8", "4 (invalid_row 4)")
    assert int(table["prompt tokens"]) > 0 and table["output tokens, at most"] == "0"
    assert not (tmp_path / "out.jsonl").exists()


def test_a_likelihood_task_on_an_engine_that_cannot_score_is_refused_before_any_work(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", QUESTIONS)
    run = run_lmpress(
        "batch", "-i", str(src), "-o", str(tmp_path / "out.jsonl"), "--engine", "ANTHROPIC",
        "--model.model_name", "claude-haiku-4-5", "--task", "loglikelihood",
        env={"ANTHROPIC_API_KEY": "sk-test"},
    )  # fmt: skip
    assert run.returncode != 0
    assert "task: engine ANTHROPIC cannot loglikelihood" in run.stderr
    assert "Traceback" not in run.stderr and not (tmp_path / "out.jsonl").exists()


def test_infer_points_a_likelihood_task_to_batch_and_python():
    run = run_lmpress(
        "infer", "--engine", "NATIVE", "--model.model_name", "tiny:llama", "--task", "perplexity",
        "hello",
    )  # fmt: skip
    assert run.returncode == 2
    assert "--task perplexity scores rows of text: run it with lmpress batch" in run.stderr
