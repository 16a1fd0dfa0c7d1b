"""One job per output (issue 31): a second `lmpress batch` on an output a job is writing is
refused at once, naming the first job, whatever its flags; the first job writes every row once.
A job killed with SIGKILL leaves no lock behind, and shards of one job run side by side.

The first job runs on the ECHO engine (tests/plugins) with ECHO_GATE: every reply waits until
the gate file exists, so the job is surely still running while the test starts the second
one, and no test waits on a clock. The fingerprint beside the output is written after the
lock is taken, so once it exists the first job holds the lock."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from lmpress.data.output_lock import OutputLock
from lmpress.data.resume import JobFiles
from tests.conftest import REPO, lmpress_process, run_lmpress, with_plugin

ROWS = 30
ECHO = ["--engine", "ECHO", "--generation.max_new_tokens", "4", "--generation.batch_size", "4"]


def write_input(path: Path) -> Path:
    path.write_text("".join(json.dumps({"id": f"r{i}", "prompt": f"p{i}"}) + "\n"
                            for i in range(ROWS)))  # fmt: skip
    return path


def ids_in(out: Path) -> list[str]:
    if out.suffix == ".parquet":
        return [str(x) for x in pq.read_table(out).column("id").to_pylist()]
    return [json.loads(line)["id"] for line in out.read_text().splitlines()]


class Gated:
    """A `lmpress batch` subprocess whose replies wait for a gate file."""

    def __init__(self, tmp: Path, args: list[str], env: dict[str, str]):
        self.gate = tmp / f"gate-{id(self)}"  # appears when the gate opens
        self.proc = lmpress_process("batch", *args,
            env={**os.environ, **env, "ECHO_GATE": str(self.gate)}, cwd=REPO,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_started(self, fingerprint: Path) -> None:
        deadline = time.monotonic() + 120
        while not fingerprint.exists() and self.proc.poll() is None:
            assert time.monotonic() < deadline, "the job never started"
            time.sleep(0.02)
        assert self.proc.poll() is None, self.proc.stderr.read()

    def wait_said(self, text: str) -> None:
        said = ""
        while text not in said:
            line = self.proc.stderr.readline()
            assert line, f"the job ended without saying {text!r}:\n{said}"
            said += line

    def finish(self) -> tuple[int, str]:
        self.gate.write_text("")
        _, err = self.proc.communicate(timeout=120)
        return self.proc.returncode, err

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


def refusal(run, out: Path) -> str:
    assert run.returncode == 2, run.stderr
    lines = [x for x in run.stderr.splitlines() if "is writing this output" in x]
    assert len(lines) == 1 and "Traceback" not in run.stderr, run.stderr
    assert str(out) in lines[0]
    return lines[0]


@pytest.mark.parametrize("suffix", ["jsonl", "parquet"])
def test_a_second_job_on_one_output_is_refused_and_the_first_writes_every_row_once(
    tmp_path, echo_plugin, suffix
):
    src = write_input(tmp_path / "in.jsonl")
    out = tmp_path / f"out.{suffix}"
    env = with_plugin(echo_plugin)
    args = [*ECHO, "-i", str(src), "-o", str(out)]
    first = Gated(tmp_path, args, env)
    try:
        first.wait_started(out.with_name(f"{out.name}.fingerprint.json"))
        second = run_lmpress("batch", *args, env=env)
        overwrite = run_lmpress("batch", *args, "--overwrite", env=env)
        assert first.proc.poll() is None  # refused while the first job still runs
        for run in (second, overwrite):
            line = refusal(run, out)
            assert f"pid {first.pid} on " in line and "run this command again" in line
        code, err = first.finish()
    finally:
        first.stop()
    assert code == 0, err
    assert sorted(ids_in(out)) == sorted(f"r{i}" for i in range(ROWS))  # each row once
    assert json.loads(out.with_name(f"{out.name}.summary.json").read_text())["rows_ok"] == ROWS


def test_a_job_killed_with_sigkill_leaves_no_lock_that_blocks_the_next_run(tmp_path, echo_plugin):
    src = write_input(tmp_path / "in.jsonl")
    out = tmp_path / "out.jsonl"
    env = with_plugin(echo_plugin)
    args = [*ECHO, "-i", str(src), "-o", str(out)]
    begun = run_lmpress("batch", *args, "--limit", "10", env=env)  # some rows done before
    assert begun.returncode == 0, begun.stderr
    killed = Gated(tmp_path, args, env)
    try:
        killed.wait_said("10 rows done")  # resumed: it holds the lock
        assert refusal(run_lmpress("batch", *args, env=env), out)  # it holds the lock
        killed.proc.send_signal(signal.SIGKILL)
        killed.proc.communicate(timeout=60)
    finally:
        killed.stop()
    assert (tmp_path / "out.jsonl.lock").exists()  # the file stays; the lock went with the process
    rerun = run_lmpress("batch", *args, env=env)
    assert rerun.returncode == 0, rerun.stderr
    assert "resuming" in rerun.stderr and "10 rows done" in rerun.stderr  # none lost
    assert sorted(ids_in(out)) == sorted(f"r{i}" for i in range(ROWS))


def test_shards_of_one_job_run_side_by_side_and_each_is_one_job(tmp_path, echo_plugin):
    src = write_input(tmp_path / "in.jsonl")
    env = with_plugin(echo_plugin)
    shards = {}
    try:
        for i in range(2):
            args = [*ECHO, "-i", str(src), "-o", str(tmp_path / f"out{i}.jsonl"),
                    "--shard", f"{i}/2"]  # fmt: skip
            shards[i] = (Gated(tmp_path, args, env), args)
        for i, (job, _) in shards.items():
            job.wait_started(tmp_path / f"out{i}.jsonl.fingerprint.json")  # both hold their locks
        again = run_lmpress("batch", *shards[0][1], env=env)
        assert f"pid {shards[0][0].pid} on " in refusal(again, tmp_path / "out0.jsonl")
        for job, _ in shards.values():
            code, err = job.finish()
            assert code == 0, err
    finally:
        for job, _ in shards.values():
            job.stop()
    got = ids_in(tmp_path / "out0.jsonl") + ids_in(tmp_path / "out1.jsonl")
    assert sorted(got) == sorted(f"r{i}" for i in range(ROWS))
    assert set(ids_in(tmp_path / "out0.jsonl")) == {f"r{i}" for i in range(0, ROWS, 2)}


def test_stdout_output_takes_no_lock(tmp_path, echo_plugin):
    src = write_input(tmp_path / "in.jsonl")
    held = OutputLock.take(JobFiles.beside(tmp_path / "-").lock, "-")  # a file named "-.lock"
    with held:
        run = run_lmpress("batch", *ECHO, "-i", str(src), "-o", "-",
                          env=with_plugin(echo_plugin), cwd=tmp_path)  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert len(run.stdout.splitlines()) == ROWS


def test_a_ray_job_on_an_output_a_job_is_writing_is_refused_before_ray_starts(
    tmp_path, echo_plugin
):
    src = write_input(tmp_path / "in.jsonl")
    out = tmp_path / "out.jsonl"
    with OutputLock.take(JobFiles.beside(out).lock, out):  # a live job: this test process
        run = run_lmpress("batch", *ECHO, "--ray", "-i", str(src), "-o", str(out),
                          env=with_plugin(echo_plugin))  # fmt: skip
    assert f"pid {os.getpid()} on " in refusal(run, out)
    assert "Ray" not in run.stderr and not out.exists()


def test_provider_batch_status_reads_beside_a_live_job_and_cancel_waits_for_it(tmp_path):
    from tests.batch.test_provider_batch_cli import KEYS, args_for, server
    from tests.batch.test_provider_batch_cli import write_rows as provider_rows

    rows = provider_rows(tmp_path / "in.jsonl", 10)
    out = tmp_path / "out.jsonl"
    with server(stuck_finalizing=[1]) as srv:
        args = args_for("OPENAI", srv, rows, out, "--provider-batch",
                        "--remote_params.batch_stuck_margin_s", str(3 - 24 * 3600))  # fmt: skip
        stuck = run_lmpress(*args, env=KEYS)  # leaves a batch out, waiting
        assert stuck.returncode == 2 and "past its completion window" in stuck.stderr
        with OutputLock.take(JobFiles.beside(out).lock, out):  # a live job: this test process
            status = run_lmpress("batch", *args[1:], "--status", str(out), env=KEYS)
            cancel = run_lmpress("batch", *args[1:], "--cancel", str(out), env=KEYS)
            rerun = run_lmpress(*args, env=KEYS)
        assert status.returncode == 0 and "finalizing" in status.stderr, status.stderr
        for refused in (cancel, rerun):
            assert f"pid {os.getpid()} on " in refusal(refused, out)
        assert "then --cancel" in cancel.stderr
        assert srv.stats.batch_calls.get(("POST", "/v1/batches/{id}/cancel"), 0) == 0
        after = run_lmpress("batch", *args[1:], "--cancel", str(out), env=KEYS)
        assert after.returncode == 0 and "cancel" in after.stderr, after.stderr
        assert srv.stats.batch_calls[("POST", "/v1/batches/{id}/cancel")] == 1
