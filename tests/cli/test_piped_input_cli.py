"""Every input is read once, as a stream (issue 48): a pipe, a FIFO, `<(cmd)` and `-i -` give
every row once, for JSONL, gzip'd JSONL and CSV, where lmpress used to read the input twice (a
counting pass, then the run), find the pipe empty the second time, and exit 0 with an empty
output. A piped job that is killed resumes when the same rows are piped again, and a job's
summary always adds up: rows_total = ok + failed + skipped + left."""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, with_plugin
from tests.growing_files import whole_lines

ROWS = 12
ECHO = ["--engine", "ECHO", "--generation.max_new_tokens", "4"]


def rows_as(kind: str, count: int = ROWS) -> bytes:
    """`count` rows of that kind, as the bytes a pipe would carry."""
    rows = [{"id": f"r{i}", "prompt": f"say {i}"} for i in range(count)]
    if kind == "csv":
        text = io.StringIO()
        writer = csv.DictWriter(text, ["id", "prompt"])
        writer.writeheader()
        writer.writerows(rows)
        return text.getvalue().encode()
    data = "".join(json.dumps(row) + "\n" for row in rows).encode()
    return gzip.compress(data) if kind == "jsonl.gz" else data


def batch(
    args: list[str],
    env: dict[str, str],
    stdin: bytes | None = None,
    shell: bool = False,
    cwd: Path = REPO,
):
    """`lmpress batch ARGS` with `stdin` piped in; `shell`: ARGS is one bash command line."""
    full_env = {**os.environ, **env}
    command = (
        ["bash", "-c", f"{sys.executable} -m lmpress batch {' '.join(args)}"]
        if shell
        else [sys.executable, "-m", "lmpress", "batch", *args]
    )
    return subprocess.run(
        command, input=stdin or b"", capture_output=True, env=full_env, cwd=cwd, timeout=300
    )


def ids_in(out: Path) -> list[str]:
    return [json.loads(line)["id"] for line in out.read_text().splitlines()]


def summary_of(out: Path) -> dict:
    return json.loads(out.with_name(f"{out.name}.summary.json").read_text())


def check_every_row_once(run, out: Path, count: int = ROWS) -> None:
    stderr = run.stderr.decode()
    assert run.returncode == 0, stderr
    assert "Traceback" not in stderr
    assert sorted(ids_in(out)) == sorted(f"r{i}" for i in range(count))
    summary = summary_of(out)
    assert (summary["rows_total"], summary["rows_ok"], summary["rows_left"]) == (count, count, 0)
    # The input's copy is gone: only the output and its own side files are left.
    left = sorted(p.name for p in out.parent.iterdir() if p.name.startswith((out.name, ".")))
    assert all(name.startswith(f"{out.name}") for name in left), left


FORMAT = {"jsonl": [], "jsonl.gz": [], "csv": ["--input-format", "csv"]}


@pytest.mark.parametrize("kind", ["jsonl", "jsonl.gz", "csv"])
@pytest.mark.parametrize("how", ["-", "/dev/stdin"])
def test_rows_piped_to_stdin_are_each_run_once(tmp_path, echo_plugin, kind, how):
    out = tmp_path / "out.jsonl"
    run = batch([*ECHO, "-i", how, *FORMAT[kind], "-o", str(out)], with_plugin(echo_plugin),
                stdin=rows_as(kind))  # fmt: skip
    check_every_row_once(run, out)


def test_a_pipe_into_an_output_named_from_the_current_folder(tmp_path, echo_plugin):
    # `-o out.jsonl`, as a person types it: the copy of the input sits beside the output under
    # a relative folder, and the job must not take it for one a killed job left behind.
    run = batch([*ECHO, "-i", "-", "-o", "out.jsonl"], with_plugin(echo_plugin),
                stdin=rows_as("jsonl"), cwd=tmp_path)  # fmt: skip
    check_every_row_once(run, tmp_path / "out.jsonl")


@pytest.mark.parametrize("kind", ["jsonl", "jsonl.gz", "csv"])
def test_rows_from_a_fifo_are_each_run_once(tmp_path, echo_plugin, kind):
    fifo = tmp_path / f"rows.{kind}"  # the FIFO's name says the format
    os.mkfifo(fifo)
    data = rows_as(kind)
    writer = threading.Thread(target=fifo.write_bytes, args=(data,))
    writer.start()
    out = tmp_path / "out.jsonl"
    try:
        run = batch([*ECHO, "-i", str(fifo), "-o", str(out)], with_plugin(echo_plugin))
    finally:
        if writer.is_alive():  # the job never opened it: let the writer go
            os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))
        writer.join(timeout=30)
    check_every_row_once(run, out)


def test_rows_from_process_substitution_are_each_run_once(tmp_path, echo_plugin):
    src = tmp_path / "rows.jsonl.gz"
    src.write_bytes(rows_as("jsonl.gz"))
    out = tmp_path / "out.jsonl"
    run = batch([*ECHO, "-i", f"<(cat {src})", "-o", str(out)], with_plugin(echo_plugin),
                shell=True)  # fmt: skip
    check_every_row_once(run, out)


def test_a_piped_parquet_input_is_refused_in_one_line(tmp_path, echo_plugin):
    out = tmp_path / "out.jsonl"
    args = [*ECHO, "-i", "-", "--input-format", "parquet", "-o", str(out)]
    run = batch(args, with_plugin(echo_plugin), stdin=b"PAR1")
    stderr = run.stderr.decode()
    assert run.returncode == 2, stderr
    (line,) = stderr.splitlines()
    assert "parquet input is read from a file, not a stream" in line
    assert list(tmp_path.iterdir()) == []


def test_a_killed_piped_job_resumes_when_the_same_rows_are_piped_again(tmp_path, echo_plugin):
    count = 30
    data = rows_as("jsonl", count)
    out = tmp_path / "out.jsonl"
    args = [*ECHO, "-i", "-", "-o", str(out), "--generation.batch_size", "1"]
    env = {**os.environ, **with_plugin(echo_plugin), "ECHO_DELAY_S": "0.05"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "lmpress", "batch", *args], stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=REPO,
    )  # fmt: skip
    try:
        proc.stdin.write(data)
        proc.stdin.close()
        deadline = time.monotonic() + 120
        while len(whole_lines(out)) < 3:
            assert proc.poll() is None and time.monotonic() < deadline, "no rows were written"
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    done = len(ids_in(out))
    assert done < count  # killed part-way
    assert list(tmp_path.glob(".out.jsonl.input-*"))  # kill -9 left its copy of the input
    rerun = batch(args, with_plugin(echo_plugin), stdin=data)
    stderr = rerun.stderr.decode()
    assert rerun.returncode == 0, stderr
    assert f"resuming {out}: {done} rows done" in stderr
    assert sorted(ids_in(out)) == sorted(f"r{i}" for i in range(count))  # each row once
    summary = summary_of(out)
    assert (summary["rows_total"], summary["rows_skipped"]) == (count, done)
    assert summary["rows_ok"] == count - done
    assert not list(tmp_path.glob(".*"))  # the next job on the output removed it


def test_a_stopped_jobs_summary_adds_up(tmp_path, echo_plugin):
    """A job stopped by --on-error fail leaves rows unread: they are counted as left."""
    lines = [json.dumps({"id": f"r{i}", "prompt": f"say {i}"}) for i in range(ROWS)]
    lines[3] = "{not json"
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out.jsonl"
    args = [*ECHO, "-i", str(src), "-o", str(out), "--on-error", "fail",
            "--generation.batch_size", "1"]  # fmt: skip
    run = batch(args, with_plugin(echo_plugin))
    assert run.returncode == 1, run.stderr.decode()
    summary = summary_of(out)
    parts = summary["rows_ok"] + summary["rows_failed"] + summary["rows_skipped"]
    assert summary["rows_left"] > 0 and summary["rows_total"] == parts + summary["rows_left"]
