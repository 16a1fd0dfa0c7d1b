"""`lmpress batch` stopped by SIGTERM, as Slurm, Kubernetes, systemd and `timeout` stop it: the
real CLI in a subprocess against the loopback server, slowed so that the job is mid-run. It
stops taking rows, lets those in flight finish, writes the output, the errors file and the
summary, and exits 143; the same command then finishes the job with every row once."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, lmpress_process, run_lmpress
from tests.growing_files import whole_lines
from tests.servers.llm_server import Faults, LLMServer, reply_text

pytestmark = pytest.mark.timeout(300)

FAST = ["--remote_params.retry_backoff_base", "0.05", "--remote_params.retry_backoff_max", "1"]


def write_rows(path: Path, count: int) -> dict[str, str]:
    """`count` rows, one of them refused by the server; each id's prompt."""
    prompts = {f"row-{i}": f"Question {i}: what is {i} squared?" for i in range(count)}
    prompts["row-3"] = "Question 3 REJECT-400"
    path.write_text("".join(json.dumps({"id": k, "prompt": v}) + "\n" for k, v in prompts.items()))
    return prompts


def batch_args(server: LLMServer, rows: Path, out: Path, *extra: str) -> list[str]:
    return ["batch", "--engine", "REMOTE", "--remote_params.api_url", server.openai_url,
            "--model.model_name", "test-model", "--remote_params.num_workers", "4", *FAST,
            "-i", str(rows), "-o", str(out), *extra]  # fmt: skip


def spawn(args: list[str]) -> subprocess.Popen:
    return lmpress_process(*args, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip


def wait_for(done, proc: subprocess.Popen, limit_s: float = 120) -> None:
    deadline = time.monotonic() + limit_s
    while not done():
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the job never got that far"
        time.sleep(0.01)


def output_rows(out: Path) -> list[dict]:
    if out.suffix == ".parquet":
        import pyarrow.parquet as pq

        table = pq.read_table(out).to_pylist()
        return [{"id": r["id"], "text": r["response"]} for r in table if r["error_kind"] is None]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    return [{"id": r["id"], "text": r["response"]["text"]} for r in rows]


def summary_of(out: Path) -> dict:
    return json.loads(out.with_name(f"{out.name}.summary.json").read_text())


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_sigterm_finishes_rows_in_flight_writes_everything_exits_143_and_resumes(tmp_path, suffix):
    prompts = write_rows(tmp_path / "in.jsonl", 80)
    out = tmp_path / f"out{suffix}"
    record = tmp_path / ("out.parquet.journal.jsonl" if suffix == ".parquet" else "out.jsonl")
    with LLMServer(Faults(latency_s=0.2, permanent={"REJECT-400": 400})) as server:
        args = batch_args(server, tmp_path / "in.jsonl", out, "--remote_params.max_retries", "1")
        proc = spawn(args)
        wait_for(
            lambda: (
                len(whole_lines(record)) >= 6
                and len(whole_lines(out.with_name(f"{out.name}.errors.jsonl")))
            ),
            proc,
        )
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 143, err[-3000:]
        assert "Traceback" not in err
        assert "stopped by SIGTERM: finishing rows in flight" in err
        summary = summary_of(out)
        assert summary["interrupted"] is True and summary["signal"] == "SIGTERM"
        assert summary["stopped_because"] == "stopped by SIGTERM"
        written = output_rows(out)  # the Parquet output too, written from the journal
        assert 6 <= summary["rows_ok"] == len(written) < 79
        # Rows in flight were let finish, not abandoned: every reply sent was written.
        assert server.stats.completed == summary["rows_ok"]
        errors = [
            json.loads(x)
            for x in (out.with_name(f"{out.name}.errors.jsonl")).read_text().splitlines()
        ]
        assert [e["id"] for e in errors] == ["row-3"] and summary["rows_failed"] == 1

        finish = run_lmpress(*args)
    assert finish.returncode == 1, finish.stderr[-3000:]  # row-3 is refused again
    final = output_rows(out)
    assert sorted(r["id"] for r in final) == sorted(k for k in prompts if k != "row-3")
    assert all(r["text"] == reply_text(prompts[r["id"]]) for r in final)
    assert summary_of(out)["interrupted"] is False and summary_of(out)["signal"] is None


def test_the_grace_period_ending_abandons_rows_in_flight_and_still_writes_the_summary(tmp_path):
    write_rows(tmp_path / "in.jsonl", 12)
    out = tmp_path / "out.jsonl"
    with LLMServer(Faults(latency_s=30)) as server:  # no row finishes before the grace ends
        proc = spawn(batch_args(server, tmp_path / "in.jsonl", out, "--stop-grace", "0.5"))
        wait_for(lambda: server.stats.in_flight >= 4, proc)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err[-3000:]
    assert "finishing rows in flight for up to 0.5s" in err
    assert re.search(r"^lmpress: left \d+ unfinished rows for the next run$", err, re.M)
    assert "Traceback" not in err and "exception was never retrieved" not in err
    summary = summary_of(out)
    assert (summary["rows_ok"], summary["signal"]) == (0, "SIGTERM")
    assert len(whole_lines(out)) == 0


def test_a_second_sigterm_or_ctrl_c_stops_at_once(tmp_path):
    write_rows(tmp_path / "in.jsonl", 12)
    out = tmp_path / "out.jsonl"
    with LLMServer(Faults(latency_s=30)) as server:
        for second in (signal.SIGTERM, signal.SIGINT):
            proc = spawn(batch_args(server, tmp_path / "in.jsonl", out))
            wait_for(lambda: server.stats.in_flight >= 4, proc)
            proc.send_signal(signal.SIGTERM)
            notice = ""
            assert proc.stderr is not None
            for line in proc.stderr:  # the second signal once the first one's notice is out
                notice += line
                if "again to stop at once" in line:
                    break
            proc.send_signal(second)
            _, err = proc.communicate(timeout=30)
            assert proc.returncode == 143, notice + err
            assert "Ctrl-C or SIGTERM again to stop at once" in notice
            assert "stopped at once; re-run the same command to resume" in err
            server.reset()
