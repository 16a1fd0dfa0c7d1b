"""Provider batch APIs from the command line (issue 18): `lmpress batch --provider-batch` through
the real openai and anthropic SDKs against the loopback server's Files, Batches and Message
Batches endpoints, compared with a live run against the same server, killed at random moments,
split at the limits, and through each way a batch goes wrong."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.batch.test_pooling import from_base64
from tests.conftest import REPO, run_lmpress
from tests.servers.embeddings import vector
from tests.servers.llm_server import BatchFaults, Faults, LLMServer

KEYS = {"OPENAI_API_KEY": "sk-test-openai", "ANTHROPIC_API_KEY": "sk-ant-test"}
# --cache off: these runs compare a batch with a live run of the same rows, each generated
# (tests/cache/ has the response cache's own provider-batch test).
FAST = ["--cache", "off", "--remote_params.batch_poll_max_s", "0.1", "--remote_params.max_retries", "3",
        "--remote_params.retry_backoff_base", "0.05", "--generation.max_new_tokens", "16"]  # fmt: skip


def server(step_s: float = 0.1, permanent: dict[str, int] | None = None, **faults) -> LLMServer:
    return LLMServer(Faults(permanent=permanent or {}, batch=BatchFaults(step_s=step_s, **faults)))


def write_rows(path: Path, count: int, marker: dict[int, str] | None = None) -> Path:
    marker = marker or {}
    rows = [{"id": f"row-{i}", "prompt": f"Question {i}: why? {marker.get(i, '')}".strip()}
            for i in range(count)]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def args_for(engine: str, srv: LLMServer, rows: Path, out: Path, *extra: str) -> list[str]:
    url = srv.anthropic_url if engine == "ANTHROPIC" else srv.openai_url
    model = "claude-haiku-4-5" if engine == "ANTHROPIC" else "gpt-4o-mini"
    return ["batch", "--engine", engine, "--remote_params.api_url", url, "--model.model_name",
            model, "-i", str(rows), "-o", str(out), *FAST, *extra]  # fmt: skip


def lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def by_id(path: Path) -> dict[str, dict]:
    return {row["id"]: row for row in map(json.loads, path.read_text().splitlines())}


def by_key(path: Path) -> dict[str, dict]:
    """Written rows by their id, or by custom_id for OpenAI Batch output lines."""
    rows = map(json.loads, path.read_text().splitlines())
    return {row.get("id") if "custom_id" not in row else row["custom_id"]: row for row in rows}


def comparable(row: dict) -> dict:
    response = {k: row["response"][k] for k in ("text", "finish_reason", "usage", "model")}
    return {"messages": row["messages"], "response": response}


@pytest.mark.parametrize("engine", ["OPENAI", "ANTHROPIC"])
def test_a_thousand_rows_by_batch_equal_a_live_run_and_split_at_the_limit(tmp_path, engine):
    rows = write_rows(tmp_path / "in.jsonl", 1000)
    # Each batch stays in_progress for half a second, five polls: on a loaded machine a poll
    # round over four batches took longer than the 0.1 s the other tests give each step.
    with server(step_s=0.5) as srv:
        live = run_lmpress(*args_for(engine, srv, rows, tmp_path / "live.jsonl"), env=KEYS)
        assert live.returncode == 0, live.stderr[-2000:]
        batch = run_lmpress(*args_for(engine, srv, rows, tmp_path / "batch.jsonl",
                                      "--provider-batch", "--remote_params.batch_max_requests",
                                      "300"), env=KEYS)  # fmt: skip
        assert batch.returncode == 0, batch.stderr[-2000:]
        stats = srv.stats
    assert stats.batches_created == 4  # 1,000 rows at 300 a batch
    assert set(stats.batch_submissions.values()) == {1} and len(stats.batch_submissions) == 1000
    live_rows, batch_rows = by_id(tmp_path / "live.jsonl"), by_id(tmp_path / "batch.jsonl")
    assert len(batch_rows) == 1000
    assert {k: comparable(v) for k, v in batch_rows.items()} == {
        k: comparable(v) for k, v in live_rows.items()
    }
    assert "submitted 300 rows as batch" in batch.stderr
    assert "in_progress" in batch.stderr and " done, " in batch.stderr  # progress while waiting
    summary = json.loads((tmp_path / "batch.jsonl.summary.json").read_text())
    assert summary["rows_ok"] == 1000
    assert summary["cost_usd"] == pytest.approx(summary["cost_live_usd"] / 2, rel=1e-3)


def test_sigkill_at_random_moments_writes_every_row_once_and_submits_none_twice(tmp_path):
    rows = write_rows(tmp_path / "in.jsonl", 120, marker={7: "REJECT-400", 50: "REJECT-400"})
    out = tmp_path / "out.jsonl"
    rng = random.Random(20261123)
    with server(step_s=0.3, permanent={"REJECT-400": 400}) as srv:
        args = args_for("OPENAI", srv, rows, out, "--provider-batch",
                        "--remote_params.batch_max_requests", "10", "--no-retry-failed")  # fmt: skip
        log = tmp_path / "out.jsonl.batches" / "state.jsonl"
        kills, seen = kill_at_random_moments(args, KEYS, log, out, rng)
        assert kills >= 6, seen
        assert ("state.jsonl", False) in seen and ("out.jsonl", True) in seen  # early and late
        finish = run_lmpress(*args, env=KEYS)
        # It fails if it recorded a refused row itself; the kills may have left none to it.
        failed_now = json.loads((tmp_path / "out.jsonl.summary.json").read_text())["rows_failed"]
        assert finish.returncode == (1 if failed_now else 0), finish.stderr[-2000:]
        submissions = srv.stats.batch_submissions
    written = [json.loads(line) for line in out.read_text().splitlines()]
    ids = [row["id"] for row in written]
    assert len(ids) == len(set(ids)) == 118
    failed = [
        json.loads(line)["id"]
        for line in (tmp_path / "out.jsonl.errors.jsonl").read_text().splitlines()
    ]
    assert sorted(failed) == ["row-50", "row-7"]
    assert len(submissions) == 120 and max(submissions.values()) == 1


def kill_at_random_moments(
    args: list[str], keys: dict[str, str], log: Path, out: Path, rng: random.Random, tries: int = 8
) -> tuple[int, set[tuple[str, bool]]]:
    """Start `lmpress ARGS` up to `tries` times, each killed (SIGKILL) on a random step of the
    lifecycle: after a few more steps of the state log (sealing, uploading, creating,
    collecting a batch) or a few more rows written. How many kills, and (the file watched,
    whether rows were written yet) for each."""
    env = {**os.environ, **keys, "PYTHONPATH": str(REPO)}
    kills, seen = 0, set()
    for attempt in range(tries):
        proc = subprocess.Popen([sys.executable, "-m", "lmpress", *args], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        watched = log if attempt % 2 == 0 else out
        target = lines(watched) + rng.randint(1, 5)
        deadline = time.time() + 30
        while proc.poll() is None and lines(watched) < target and time.time() < deadline:
            time.sleep(0.002)
        if proc.poll() is not None:
            break
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        kills += 1
        seen.add((watched.name, lines(out) > 0))
    return kills, seen


def started_until_submitted(args: list[str], log) -> subprocess.Popen:
    """`lmpress ARGS` in a process of its own, once its state log says a batch was submitted."""
    env = {**os.environ, **KEYS, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "lmpress", *args], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline = time.time() + 60
    while b'"submitted"' not in (log.read_bytes() if log.exists() else b""):
        assert proc.poll() is None and time.time() < deadline, proc.communicate()[1]
        time.sleep(0.01)
    return proc


def test_sigterm_while_batches_wait_keeps_their_state_exits_143_and_the_rerun_collects_them(
    tmp_path,
):
    rows = write_rows(tmp_path / "in.jsonl", 40)
    out = tmp_path / "out.jsonl"
    log = tmp_path / "out.jsonl.batches" / "state.jsonl"
    with server(step_s=0.5) as srv:
        args = args_for("OPENAI", srv, rows, out, "--provider-batch",
                        "--remote_params.batch_max_requests", "10")  # fmt: skip
        proc = started_until_submitted(args, log)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 143, err[-2000:]
        assert "Traceback" not in err
        assert "not collected yet, their state kept in" in err
        summary = json.loads((tmp_path / "out.jsonl.summary.json").read_text())
        assert (summary["signal"], summary["stopped_because"]) == ("SIGTERM", "stopped by SIGTERM")
        assert summary["rows_ok"] < 40
        finish = run_lmpress(*args, env=KEYS)
        assert finish.returncode == 0, finish.stderr[-2000:]
        submissions = srv.stats.batch_submissions
    ids = [json.loads(line)["id"] for line in out.read_text().splitlines()]
    assert sorted(ids) == sorted(f"row-{i}" for i in range(40))  # each row once
    assert len(submissions) == 40 and max(submissions.values()) == 1  # none submitted twice


@pytest.mark.parametrize("retry", [[], ["--no-retry-failed"]], ids=["retried", "left-aside"])
def test_a_kill_between_writing_a_batch_and_logging_it_collected_writes_no_row_twice(
    tmp_path, retry
):
    """The moment the random kills above hit only now and then: a batch's rows and its
    refused row are written, but the log does not yet say the batch was collected. The next
    run collects it again and must record neither kind of row a second time."""
    rows = write_rows(tmp_path / "in.jsonl", 12, marker={3: "REJECT-400"})
    out = tmp_path / "out.jsonl"
    with server(step_s=0.05, permanent={"REJECT-400": 400}) as srv:
        args = args_for("OPENAI", srv, rows, out, "--provider-batch",
                        "--remote_params.batch_max_requests", "10", *retry)  # fmt: skip
        first = run_lmpress(*args, env=KEYS)
        assert first.returncode == 1, first.stderr[-2000:]
        log = tmp_path / "out.jsonl.batches" / "state.jsonl"
        steps = log.read_text().splitlines()
        assert sum('"collected"' in step for step in steps) == 2
        log.write_text("".join(f"{s}\n" for s in steps if '"collected"' not in s))
        again = run_lmpress(*args, env=KEYS)
        # Retried, the refused row fails again; left aside, nothing is left to run.
        assert again.returncode == (0 if retry else 1), again.stderr[-2000:]
        assert srv.stats.batches_created == 2  # collected again, not submitted again
    ids = [json.loads(line)["id"] for line in out.read_text().splitlines()]
    assert sorted(ids) == sorted(f"row-{i}" for i in range(12) if i != 3)
    failed = [json.loads(line)["id"] for line in (tmp_path / "out.jsonl.errors.jsonl").open()]
    assert failed == ["row-3"]


def test_a_lost_create_answer_is_found_instead_of_submitted_again(tmp_path):
    rows = write_rows(tmp_path / "in.jsonl", 30)
    for engine in ("OPENAI", "ANTHROPIC"):
        with server(lost_creates=[1], upload_failures=1) as srv:
            out = tmp_path / f"{engine}.jsonl"
            run = run_lmpress(*args_for(engine, srv, rows, out, "--provider-batch"), env=KEYS)
            assert run.returncode == 0, run.stderr[-2000:]
            assert srv.stats.batches_created == 1
            assert set(srv.stats.batch_submissions.values()) == {1}
        assert len(by_id(out)) == 30


@pytest.mark.parametrize("policy", ["resubmit", "live", "fail"])
def test_rows_an_expired_batch_did_not_run(tmp_path, policy):
    rows = write_rows(tmp_path / "in.jsonl", 40)
    out = tmp_path / "out.jsonl"
    with server(expire=[1]) as srv:
        run = run_lmpress(*args_for("OPENAI", srv, rows, out, "--provider-batch",
                                    "--on-expired", policy), env=KEYS)  # fmt: skip
        stats = srv.stats
    done = by_id(out) if out.exists() else {}
    if policy == "fail":
        assert run.returncode == 1
        errors = [
            json.loads(line)
            for line in (tmp_path / "out.jsonl.errors.jsonl").read_text().splitlines()
        ]
        assert errors and all(e["error"]["kind"] == "batch_expired" for e in errors)
        assert len(done) + len(errors) == 40
        return
    assert run.returncode == 0, run.stderr[-2000:]
    assert len(done) == 40
    redone = [cid for cid, times in stats.batch_submissions.items() if times == 2]
    if policy == "resubmit":
        assert redone and stats.batches_created == 2
        assert "resubmitting" in run.stderr
    else:
        assert not redone and stats.completed >= 1  # the live endpoint answered the rest
        assert "running" in run.stderr and "live" in run.stderr


def test_a_batch_stuck_in_finalizing_is_named_and_the_job_resumes_later(tmp_path):
    rows = write_rows(tmp_path / "in.jsonl", 10)
    out = tmp_path / "out.jsonl"
    with server(stuck_finalizing=[1]) as srv:
        args = args_for("OPENAI", srv, rows, out, "--provider-batch",
                        "--remote_params.batch_stuck_margin_s", str(3 - 24 * 3600))  # fmt: skip
        run = run_lmpress(*args, env=KEYS)
        assert run.returncode == 2
        line = [x for x in run.stderr.splitlines() if "past its completion window" in x]
        assert line and "is still " in line[0] and "batch_" in line[0]
        status = run_lmpress("batch", *args[1:], "--status", str(out), env=KEYS)
        assert status.returncode == 0 and "finalizing" in status.stderr
        cancel = run_lmpress("batch", *args[1:], "--cancel", str(out), env=KEYS)
        assert cancel.returncode == 0 and "cancel" in cancel.stderr
        assert srv.stats.batches_created == 1


def test_a_batch_that_fails_validation_fails_its_rows_and_the_next_run_retries_them(tmp_path):
    rows = write_rows(tmp_path / "in.jsonl", 12)
    out = tmp_path / "out.jsonl"
    with server(invalid=[1]) as srv:
        args = args_for("OPENAI", srv, rows, out, "--provider-batch",
                        "--remote_params.batch_max_requests", "6")  # fmt: skip
        run = run_lmpress(*args, env=KEYS)
        assert run.returncode == 1
        assert "failed validation: token_limit_exceeded" in run.stderr
        assert len(by_id(out)) == 6  # the other batch
        again = run_lmpress(*args, env=KEYS)
        assert again.returncode == 0, again.stderr[-2000:]
        assert len(by_id(out)) == 12


def test_provider_batch_writes_parquet_like_a_live_run(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    rows = write_rows(tmp_path / "in.jsonl", 20)
    with server() as srv:
        run = run_lmpress(*args_for("ANTHROPIC", srv, rows, tmp_path / "out.parquet",
                                    "--provider-batch"), env=KEYS)  # fmt: skip
        assert run.returncode == 0, run.stderr[-2000:]
    table = pq.read_table(tmp_path / "out.parquet").to_pylist()
    assert sorted(r["id"] for r in table) == sorted(f"row-{i}" for i in range(20))
    assert all(r["response"] and r["error_kind"] is None for r in table)


def test_an_engine_without_a_batch_api_is_refused(tmp_path):
    rows = write_rows(tmp_path / "in.jsonl", 2)
    run = run_lmpress("batch", "--engine", "TOGETHER", "--model.model_name", "m", "-i", str(rows),
                      "-o", str(tmp_path / "o.jsonl"), "--provider-batch",
                      env={"TOGETHER_API_KEY": "k"})  # fmt: skip
    assert run.returncode == 2
    assert "has no batch API lmpress can drive" in run.stderr


# --- embed runs: /v1/embeddings lines through OpenAI's Batch API ------------------------------

EMBED = ["--task", "embed", "--model.model_name", "text-embedding-3-small"]


def embed_args(srv: LLMServer, rows: Path, out: Path, *extra: str) -> list[str]:
    return ["batch", "--engine", "OPENAI", "--remote_params.api_url", srv.openai_url, *EMBED,
            "-i", str(rows), "-o", str(out), *FAST[:6], *extra]  # fmt: skip


def embed_rows(path: Path, count: int, marker: dict[int, str] | None = None) -> Path:
    """Plain embed rows: mostly one text, every third a list of two; `marker` texts refused."""
    marker = marker or {}
    rows = []
    for i in range(count):
        text = f"document {i} {marker.get(i, '')}".strip()
        rows.append({"id": f"row-{i}", "input": [text, f"title {i}"] if i % 3 == 2 else text})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def embedding_lines(path: Path, count: int, marker: dict[int, str]) -> Path:
    """OpenAI Batch lines to /v1/embeddings: plain, cut to 4 dimensions in base64, token ids."""
    lines = []
    for i in range(count):
        body: dict = {"model": "text-embedding-3-small", "input": f"line {i} {marker.get(i, '')}"}
        if i % 3 == 1:
            body.update(dimensions=4, encoding_format="base64")
        elif i % 3 == 2:
            body["input"] = [[i, i + 1, i + 2], [7]]
        lines.append({"custom_id": f"line-{i}", "method": "POST", "url": "/v1/embeddings",
                      "body": body})  # fmt: skip
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def without_timing(row: dict) -> dict:
    """A written row less what a batch changes by design: its latency and (half) its cost."""
    response = {k: v for k, v in row["response"].items() if k not in ("latency_s", "cost_usd")}
    return {**row, "response": response}


def error_ids(path: Path) -> list[str]:
    return [json.loads(line).get("id") for line in path.read_text().splitlines()]


@pytest.mark.parametrize("shape", ["jsonl", "openai", "parquet"])
def test_an_embed_run_by_batch_writes_what_the_live_run_writes_and_a_refused_row_alone(
    tmp_path, shape
):
    marker = {4: "REJECT-400"}
    suffix = ".parquet" if shape == "parquet" else ".jsonl"
    if shape == "openai":
        rows = embedding_lines(tmp_path / "in.jsonl", 12, marker)
    else:
        rows = embed_rows(tmp_path / "in.jsonl", 12, marker)
    with server(permanent={"REJECT-400": 400}) as srv:
        live = run_lmpress(*embed_args(srv, rows, tmp_path / f"live{suffix}"), env=KEYS)
        batch = run_lmpress(*embed_args(srv, rows, tmp_path / f"batch{suffix}",
                                        "--provider-batch"), env=KEYS)  # fmt: skip
        stats = srv.stats
    assert live.returncode == batch.returncode == 1, batch.stderr[-2000:]  # the refused row
    assert stats.batches_created == 1 and set(stats.batch_submissions.values()) == {1}
    (endpoint,) = {path for path, _ in stats.bodies if "embeddings" in path}  # the live run's
    assert endpoint == "/v1/embeddings"
    assert "submitted 12 rows as batch" in batch.stderr
    said = [line for line in batch.stderr.splitlines() if ":5:" in line]
    assert said == [f"lmpress: {rows}:5: OPENAI batch: HTTP 400: this conversation is refused "
                    f"(injected 400)"]  # fmt: skip
    if shape == "parquet":
        pq = pytest.importorskip("pyarrow.parquet")
        tables = [pq.read_table(tmp_path / f"{n}.parquet").sort_by("id") for n in ("live", "batch")]
        # A batch's failure says it came from the batch; the rest of each row is the same.
        kept = [c for c in tables[0].column_names
                if c not in ("latency_s", "cost_usd", "error_message")]  # fmt: skip
        assert tables[1].select(kept).to_pylist() == tables[0].select(kept).to_pylist()
        got = {r["id"]: r for r in tables[1].to_pylist()}
        assert got["row-0"]["embedding"] == vector("document 0")
        assert got["row-2"]["embeddings"] == [vector("document 2"), vector("title 2")]
        assert got["row-4"]["error_kind"] == "bad_request" and got["row-4"]["embedding"] is None
        assert got["row-4"]["error_message"].startswith("OPENAI batch: HTTP 400: ")
        return
    live_rows, batch_rows = by_key(tmp_path / "live.jsonl"), by_key(tmp_path / "batch.jsonl")
    if shape == "jsonl":
        assert {k: without_timing(v) for k, v in batch_rows.items()} == {
            k: without_timing(v) for k, v in live_rows.items()
        }
        assert batch_rows["row-0"]["embedding"] == vector("document 0")
        assert batch_rows["row-2"]["embeddings"] == [vector("document 2"), vector("title 2")]
        assert error_ids(tmp_path / "batch.jsonl.errors.jsonl") == ["row-4"]
        cost = [rows["row-2"]["response"]["cost_usd"] for rows in (batch_rows, live_rows)]
        assert cost[0] == pytest.approx(cost[1] / 2)  # at the batch price
        return
    assert {k: v["response"]["body"] for k, v in batch_rows.items()} == {
        k: v["response"]["body"] for k, v in live_rows.items()
    }
    assert len(batch_rows) == 11
    first = batch_rows["line-0"]["response"]["body"]["data"][0]["embedding"]
    cut = batch_rows["line-1"]["response"]["body"]["data"][0]["embedding"]
    ids = batch_rows["line-2"]["response"]["body"]["data"]
    assert first == vector("line 0 ") and from_base64(cut) == vector("line 1 ", 4)
    assert [item["embedding"] for item in ids] == [vector([2, 3, 4]), vector([7])]
    (error,) = [
        json.loads(x) for x in (tmp_path / "batch.jsonl.errors.jsonl").read_text().splitlines()
    ]
    assert error["custom_id"] == "line-4" and error["response"]["status_code"] == 400


def test_an_embed_job_killed_after_submitting_resumes_with_every_row_once(tmp_path):
    rows = embed_rows(tmp_path / "in.jsonl", 30)
    out = tmp_path / "out.jsonl"
    log = tmp_path / "out.jsonl.batches" / "state.jsonl"
    with server(step_s=0.5) as srv:
        args = embed_args(srv, rows, out, "--provider-batch",
                          "--remote_params.batch_max_requests", "10")  # fmt: skip
        proc = started_until_submitted(args, log)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert lines(out) < 30  # killed mid-job, with batches waiting at the provider
        finish = run_lmpress(*args, env=KEYS)
        assert finish.returncode == 0, finish.stderr[-2000:]
        assert "resuming" in finish.stderr
        submissions = srv.stats.batch_submissions
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(row["id"] for row in written) == sorted(f"row-{i}" for i in range(30))
    assert len(submissions) == 30 and max(submissions.values()) == 1  # none submitted twice
    for row in written:
        i = int(row["id"].split("-")[1])
        texts = [f"document {i}", f"title {i}"] if i % 3 == 2 else [f"document {i}"]
        assert row.get("embeddings", [row.get("embedding")]) == [vector(t) for t in texts]


def test_embed_rows_an_expired_batch_did_not_run_go_live(tmp_path):
    rows = embed_rows(tmp_path / "in.jsonl", 20)
    out = tmp_path / "out.jsonl"
    with server(expire=[1]) as srv:
        run = run_lmpress(*embed_args(srv, rows, out, "--provider-batch", "--on-expired", "live"),
                          env=KEYS)  # fmt: skip
        live_bodies = [body for path, body in srv.stats.bodies if path.endswith("/embeddings")]
    assert run.returncode == 0, run.stderr[-2000:]
    assert "live" in run.stderr and live_bodies  # the rows the batch left undone went live
    written = by_key(out)
    assert len(written) == 20 and written["row-0"]["embedding"] == vector("document 0")
