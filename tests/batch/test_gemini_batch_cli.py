"""Gemini's batch mode from the command line (issue 37): `lmpress batch --engine GEMINI
--provider-batch` through the real google-genai SDK against the loopback server's Gemini batch
endpoints (`tests/servers/gemini_batches.py`), compared with a live run of the same rows through
Google's OpenAI-compatible endpoint on the same server, killed at random moments, split at the
limit, and through each way a batch ends other than succeeding."""

from __future__ import annotations

import base64
import io
import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.batch.test_provider_batch_cli import by_id, kill_at_random_moments
from tests.conftest import REPO, lmpress_process, run_lmpress
from tests.servers.llm_server import BatchFaults, Faults, LLMServer

pytest.importorskip("google.genai")

KEYS = {"GEMINI_API_KEY": "gemini-test-key"}
MODEL = "gemini-2.5-flash"
# --cache off: these runs compare a batch with a live run of the same rows, each generated
# (tests/cache/ has the response cache's own provider-batch test).
FAST = ["--cache", "off", "--remote_params.batch_poll_max_s", "0.1", "--remote_params.max_retries", "3",
        "--remote_params.retry_backoff_base", "0.05", "--generation.max_new_tokens", "16"]  # fmt: skip
# Gemini's compatibility layer plays a thinking model, and takes its extra_body.
GEMINI = {"reasoning": "gemini", "extensions": frozenset({"extra_body"})}


def server(step_s: float = 0.1, permanent: dict[str, int] | None = None, **faults) -> LLMServer:
    return LLMServer(Faults(permanent=permanent or {}, required_key=KEYS["GEMINI_API_KEY"],
                            batch=BatchFaults(step_s=step_s, **faults), **GEMINI))  # fmt: skip


def args_for(srv: LLMServer, rows: Path, out: Path, *extra: str) -> list[str]:
    return ["batch", "--engine", "GEMINI", "--remote_params.api_url", srv.openai_url,
            "--model.model_name", MODEL, "-i", str(rows), "-o", str(out), *FAST, *extra]  # fmt: skip


def write_rows(path: Path, count: int, marker: dict[int, str] | None = None) -> Path:
    marker = marker or {}
    rows = [{"id": f"row-{i}", "prompt": f"Question {i}: why? {marker.get(i, '')}".strip()}
            for i in range(count)]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def png_data_url() -> str:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (2, 2), (200, 30, 30)).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}  # fmt: skip
ASKED = {"role": "assistant", "content": "", "tool_calls": [
    {"id": "call_1", "type": "function",
     "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]}  # fmt: skip


def varied_rows(path: Path, plain: int) -> Path:
    """Plain rows, and a row of each shape the translation to Gemini's own wire must carry."""
    user = {"role": "user", "content": "What is the weather in Paris?"}
    special = [
        {"id": "system", "messages": [{"role": "system", "content": "You are terse."},
                                      {"role": "user", "content": "Name a colour."}]},
        {"id": "turns", "messages": [{"role": "user", "content": "Hi there"},
                                     {"role": "assistant", "content": "Hello."},
                                     {"role": "user", "content": "Count to three please"}]},
        {"id": "image", "messages": [{"role": "user", "content": [
            {"type": "text", "text": "What colour is this square?"},
            {"type": "image_url", "image_url": {"url": png_data_url()}}]}]},
        {"id": "schema", "prompt": "Give me JSON about cats",
         "generation": {"guided_decoding": {"json": {
             "type": "object", "properties": {"name": {"type": "string"}}}}}},
        {"id": "json-object", "prompt": "Any JSON object",
         "generation": {"guided_decoding": {"json_object": True}}},
        {"id": "two", "prompt": "Two answers to this", "generation": {"n": 2}},
        {"id": "sampled", "prompt": "Sample with care",
         "generation": {"temperature": 0.7, "top_p": 0.9, "seed": 7}},
        {"id": "thinks", "prompt": "Think about the sea", "generation": {"max_reasoning_tokens": 4}},
        {"id": "no-thinking", "prompt": "Do not think", "generation": {"max_reasoning_tokens": 0}},
        {"id": "effort", "prompt": "Think a little", "generation": {"reasoning_effort": "low"}},
        {"id": "calls", "messages": [user], "tools": [WEATHER]},
        {"id": "forced", "messages": [user], "tools": [WEATHER],
         "generation": {"tool_choice": {"type": "function", "function": {"name": "get_weather"}}}},
        {"id": "result", "messages": [user, ASKED, {"role": "tool", "tool_call_id": "call_1",
                                                    "content": "sunny and warm"}],
         "tools": [WEATHER]},
        {"id": "short", "prompt": "A long answer to this question please now",
         "generation": {"max_new_tokens": 3}},
    ]  # fmt: skip
    rows = special + [{"id": f"row-{i}", "prompt": f"Question {i}: why?"} for i in range(plain)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def without_call_ids(value):
    """A row with its tool calls' ids left out: Gemini's Developer API gives none, so lmpress
    makes its own, and the compatibility layer makes others."""
    if isinstance(value, dict):
        drop = "function" in value and "type" in value
        return {k: without_call_ids(v) for k, v in value.items() if not (drop and k == "id")}
    if isinstance(value, list):
        return [without_call_ids(v) for v in value]
    return value


def comparable(row: dict) -> dict:
    response = {k: v for k, v in row["response"].items() if k not in ("latency_s", "cost_usd")}
    return without_call_ids({**row, "response": response})


def test_rows_by_batch_equal_a_live_run_shape_by_shape_and_split_at_the_limit(tmp_path):
    rows = varied_rows(tmp_path / "in.jsonl", plain=46)  # 60 rows
    with server(step_s=0.3) as srv:
        # The server answers in words, so the two rows that ask for JSON fail their check,
        # live and by batch alike.
        live = run_lmpress(*args_for(srv, rows, tmp_path / "live.jsonl"), env=KEYS)
        assert live.returncode == 1, live.stderr[-2000:]
        batch = run_lmpress(*args_for(srv, rows, tmp_path / "batch.jsonl", "--provider-batch",
                                      "--remote_params.batch_max_requests", "25"), env=KEYS)  # fmt: skip
        assert batch.returncode == 1, batch.stderr[-2000:]
        stats = srv.stats
    assert stats.batches_created == 3  # 60 rows at 25 a batch
    assert stats.files_uploaded == 3
    assert len(stats.batch_submissions) == 60 and set(stats.batch_submissions.values()) == {1}
    live_rows, batch_rows = by_id(tmp_path / "live.jsonl"), by_id(tmp_path / "batch.jsonl")
    assert sorted(batch_rows) == sorted(live_rows) and len(batch_rows) == 58
    for key, row in live_rows.items():
        assert comparable(batch_rows[key]) == comparable(row), key
    live_errors, batch_errors = (
        by_id(tmp_path / "live.jsonl.errors.jsonl"),
        by_id(tmp_path / "batch.jsonl.errors.jsonl"),
    )
    assert sorted(batch_errors) == sorted(live_errors) == ["json-object", "schema"]
    for key, row in live_errors.items():
        assert batch_errors[key]["error"] == row["error"], key
    # The shapes did what they ask for, so equality above is not two empty answers.
    assert batch_rows["calls"]["response"]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert batch_rows["thinks"]["response"]["reasoning"]
    assert batch_rows["short"]["response"]["finish_reason"] == "length"
    assert "submitted 25 rows as batch batches/" in batch.stderr
    assert "running" in batch.stderr and "succeeded" in batch.stderr
    summary = json.loads((tmp_path / "batch.jsonl.summary.json").read_text())
    assert summary["rows_ok"] == 58
    assert summary["cost_usd"] == pytest.approx(summary["cost_live_usd"] / 2, rel=1e-3)


def test_sigkill_at_random_moments_writes_every_row_once_and_submits_none_twice(tmp_path):
    rows = write_rows(tmp_path / "in.jsonl", 80, marker={7: "REJECT-400", 50: "REJECT-400"})
    out = tmp_path / "out.jsonl"
    rng = random.Random(20261124)
    with server(step_s=0.3, permanent={"REJECT-400": 400}) as srv:
        args = args_for(srv, rows, out, "--provider-batch", "--remote_params.batch_max_requests",
                        "10", "--no-retry-failed")  # fmt: skip
        log = tmp_path / "out.jsonl.batches" / "state.jsonl"
        kills, seen = kill_at_random_moments(args, KEYS, log, out, rng)
        assert kills >= 5, seen
        assert ("state.jsonl", False) in seen and ("out.jsonl", True) in seen  # early and late
        finish = run_lmpress(*args, env=KEYS)
        failed_now = json.loads((tmp_path / "out.jsonl.summary.json").read_text())["rows_failed"]
        assert finish.returncode == (1 if failed_now else 0), finish.stderr[-2000:]
        submissions = srv.stats.batch_submissions
    ids = [json.loads(line)["id"] for line in out.read_text().splitlines()]
    assert len(ids) == len(set(ids)) == 78
    failed = [json.loads(line) for line in (tmp_path / "out.jsonl.errors.jsonl").open()]
    assert sorted(f["id"] for f in failed) == ["row-50", "row-7"]
    assert all("HTTP 400" in f["error"]["message"] for f in failed)
    assert len(submissions) == 80 and max(submissions.values()) == 1


def started_until_submitted(args: list[str], log: Path) -> subprocess.Popen:
    """`lmpress ARGS` in a process of its own, once its state log says a batch was submitted."""
    env = {**os.environ, **KEYS, "PYTHONPATH": str(REPO)}
    proc = lmpress_process(*args, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline = time.time() + 60
    while b'"submitted"' not in (log.read_bytes() if log.exists() else b""):
        assert proc.poll() is None and time.time() < deadline, proc.communicate()[1]
        time.sleep(0.01)
    return proc


def test_sigint_while_batches_wait_keeps_their_state_and_the_rerun_collects_them(tmp_path):
    rows = write_rows(tmp_path / "in.jsonl", 30)
    out = tmp_path / "out.jsonl"
    with server(step_s=0.5) as srv:
        args = args_for(srv, rows, out, "--provider-batch", "--remote_params.batch_max_requests",
                        "10")  # fmt: skip
        proc = started_until_submitted(args, tmp_path / "out.jsonl.batches" / "state.jsonl")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 130, err[-2000:]
        assert "Traceback" not in err and "not collected yet, their state kept in" in err
        assert srv.stats.batch_calls[("POST", "/v1beta/batches/{id}:cancel")] == 0  # left running
        finish = run_lmpress(*args, env=KEYS)
        assert finish.returncode == 0, finish.stderr[-2000:]
        submissions = srv.stats.batch_submissions
    ids = [json.loads(line)["id"] for line in out.read_text().splitlines()]
    assert sorted(ids) == sorted(f"row-{i}" for i in range(30))
    assert len(submissions) == 30 and max(submissions.values()) == 1


def test_a_lost_create_answer_is_found_by_name_instead_of_submitted_again(tmp_path):
    rows = write_rows(tmp_path / "in.jsonl", 30)
    out = tmp_path / "out.jsonl"
    with server(lost_creates=[1], upload_failures=1) as srv:
        run = run_lmpress(*args_for(srv, rows, out, "--provider-batch"), env=KEYS)
        assert run.returncode == 0, run.stderr[-2000:]
        assert srv.stats.batches_created == 1 and srv.stats.upload_attempts == 2
        assert srv.stats.batch_calls[("GET", "/v1beta/batches")] >= 1  # searched, found
        assert set(srv.stats.batch_submissions.values()) == {1}
    assert len(by_id(out)) == 30


@pytest.mark.parametrize("policy", ["resubmit", "live", "fail"])
def test_rows_an_expired_batch_did_not_run(tmp_path, policy):
    rows = write_rows(tmp_path / "in.jsonl", 20)
    out = tmp_path / "out.jsonl"
    with server(expire=[1]) as srv:
        run = run_lmpress(*args_for(srv, rows, out, "--provider-batch", "--on-expired", policy),
                          env=KEYS)  # fmt: skip
        stats = srv.stats
    assert "expired" in run.stderr
    done = by_id(out) if out.exists() else {}
    if policy == "fail":
        assert run.returncode == 1
        errors = [json.loads(line) for line in (tmp_path / "out.jsonl.errors.jsonl").open()]
        # Google keeps no results of an expired batch: every row of it failed, none written.
        assert not done and len(errors) == 20
        assert all(e["error"]["kind"] == "batch_expired" for e in errors)
        return
    assert run.returncode == 0, run.stderr[-2000:]
    assert sorted(done) == sorted(f"row-{i}" for i in range(20))
    if policy == "resubmit":
        assert stats.batches_created == 2 and set(stats.batch_submissions.values()) == {2}
        assert "resubmitting 20 rows" in run.stderr
    else:
        assert stats.batches_created == 1 and stats.completed == 20  # live requests
        assert "running 20 rows live" in run.stderr


def test_a_failed_batch_fails_its_rows_and_the_next_run_retries_them(tmp_path):
    rows = write_rows(tmp_path / "in.jsonl", 12)
    out = tmp_path / "out.jsonl"
    with server(invalid=[1]) as srv:
        args = args_for(srv, rows, out, "--provider-batch", "--remote_params.batch_max_requests",
                        "6")  # fmt: skip
        run = run_lmpress(*args, env=KEYS)
        assert run.returncode == 1
        assert "failed validation: Gemini ended the batch as failed" in run.stderr
        assert len(by_id(out)) == 6  # the other batch
        again = run_lmpress(*args, env=KEYS)
        assert again.returncode == 0, again.stderr[-2000:]
    assert len(by_id(out)) == 12


def test_status_and_cancel_name_a_stuck_batch(tmp_path):
    rows = write_rows(tmp_path / "in.jsonl", 10)
    out = tmp_path / "out.jsonl"
    with server(stuck_finalizing=[1]) as srv:
        # Gemini ends a batch within 48 hours; this margin makes the stuck one overdue now.
        args = args_for(srv, rows, out, "--provider-batch",
                        "--remote_params.batch_stuck_margin_s", str(3 - 48 * 3600))  # fmt: skip
        run = run_lmpress(*args, env=KEYS)
        assert run.returncode == 2, run.stderr[-2000:]
        assert "batches/" in run.stderr and "past its completion window" in run.stderr
        status = run_lmpress("batch", *args[1:], "--status", str(out), env=KEYS)
        assert status.returncode == 0 and "running" in status.stderr, status.stderr[-2000:]
        cancel = run_lmpress("batch", *args[1:], "--cancel", str(out), env=KEYS)
        assert cancel.returncode == 0, cancel.stderr[-2000:]
        assert srv.stats.batch_calls[("POST", "/v1beta/batches/{id}:cancel")] == 1
        finish = run_lmpress(*args[:-2], "--remote_params.batch_stuck_margin_s", "3600",
                             env=KEYS)  # fmt: skip
        assert finish.returncode == 0, finish.stderr[-2000:]
        # It had run every row before it was cancelled: its results are written, none resent.
        assert "cancelled" in finish.stderr and srv.stats.batches_created == 1
    assert len(by_id(out)) == 10


def test_a_wrong_key_ends_the_job_in_one_line(tmp_path):
    rows = write_rows(tmp_path / "in.jsonl", 3)
    with server() as srv:
        run = run_lmpress(*args_for(srv, rows, tmp_path / "o.jsonl", "--provider-batch"),
                          env={"GEMINI_API_KEY": "wrong"})  # fmt: skip
    assert run.returncode == 2 and "Traceback" not in run.stderr
    line = [x for x in run.stderr.splitlines() if "GEMINI batch API" in x]
    assert line and "API key not valid" in line[0] and "wrong" not in line[0]


@pytest.mark.parametrize(
    "engine, extra, says",
    [("GOOGLE_VERTEX", ["--remote_params.api_url", "http://127.0.0.1:9/v1",
                        "--remote_params.api_key_env_varname", "GEMINI_API_KEY"],
      "Cloud Storage bucket or a BigQuery table"),
     # The dry run refuses what the run would, rather than price a batch it cannot send.
     ("GOOGLE_VERTEX", ["--remote_params.api_url", "http://127.0.0.1:9/v1",
                        "--remote_params.api_key_env_varname", "GEMINI_API_KEY", "--dry-run"],
      "Cloud Storage bucket or a BigQuery table"),
     ("GEMINI", ["--task", "embed", "--dry-run"], "Gemini's batch mode takes no embed run"),
     ("GEMINI", ["--remote_params.batch_completion_window", "12h"], "set 24h or 48h")],
    ids=["vertex", "vertex-dry-run", "embed-dry-run", "window"],
)  # fmt: skip
def test_what_gemini_batch_mode_cannot_do_is_refused_in_one_line(tmp_path, engine, extra, says):
    rows = write_rows(tmp_path / "in.jsonl", 2)
    run = run_lmpress("batch", "--engine", engine, "--model.model_name", MODEL, "-i", str(rows),
                      "-o", str(tmp_path / "o.jsonl"), "--provider-batch", *extra, env=KEYS)  # fmt: skip
    assert run.returncode == 2, run.stderr[-2000:]
    assert "Traceback" not in run.stderr
    assert [line for line in run.stderr.splitlines() if says in line]
