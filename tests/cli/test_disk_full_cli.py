"""`lmpress batch` when the output's disk fills up: one line naming the file, exit 1, no empty
summary, and the rows already written kept for the run that follows once there is room.

Two ways to run out of room without touching the machine's disks: a file-size limit on the
child (`ulimit -f`, which fails writes past it with EFBIG and sends SIGXFSZ, which lmpress
ignores), and a 300 KB tmpfs where mounting one is allowed (ENOSPC, the real thing)."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, run_lmpress
from tests.servers.llm_server import LLMServer, reply_text

pytestmark = pytest.mark.timeout(300)


def write_rows(path: Path, count: int) -> dict[str, str]:
    prompts = {
        f"row-{i}": f"Question {i}: what is {i} squared? " + "pad " * 20 for i in range(count)
    }
    path.write_text("".join(json.dumps({"id": k, "prompt": v}) + "\n" for k, v in prompts.items()))
    return prompts


def batch_args(server: LLMServer, rows: Path, out: Path) -> list[str]:
    return ["batch", "--engine", "REMOTE", "--remote_params.api_url", server.openai_url,
            "--model.model_name", "test-model", "-i", str(rows), "-o", str(out)]  # fmt: skip


def run_limited(args: list[str], max_file_bytes: int) -> subprocess.CompletedProcess:
    """The CLI with every file it writes limited to `max_file_bytes` (`ulimit -f`). SIGXFSZ
    keeps its default action here (death): lmpress must ignore it itself. No bytecode is
    written, so that nothing but lmpress's own files meets the limit."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (max_file_bytes, max_file_bytes))

    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run(
        [sys.executable, "-m", "lmpress", *args], capture_output=True, text=True, env=env,
        preexec_fn=limit, timeout=240,
    )  # fmt: skip


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("lmpress: error:")]


def assert_resumes_with_every_row_once(args: list[str], out: Path, prompts: dict[str, str]):
    whole = out.read_bytes().split(b"\n")[:-1]  # the last piece: b"" or a torn line
    before = [json.loads(line) for line in whole]
    finish = run_lmpress(*args)
    assert finish.returncode == 0, finish.stderr[-3000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["id"] for r in rows) == sorted(prompts)  # none lost, none twice
    assert all(r["response"]["text"] == reply_text(prompts[r["id"]]) for r in rows)
    assert rows[: len(before)] == before  # what the first run wrote was kept as it was


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_a_file_size_limit_is_one_line_naming_the_file_and_the_job_resumes(tmp_path, suffix):
    prompts = write_rows(tmp_path / "in.jsonl", 60)
    out = tmp_path / f"out{suffix}"
    record = tmp_path / ("out.parquet.journal.jsonl" if suffix == ".parquet" else "out.jsonl")
    with LLMServer() as server:
        args = batch_args(server, tmp_path / "in.jsonl", out)
        run = run_limited(args, 8000)  # room for some rows, not for 60
        assert run.returncode == 1, run.stderr[-3000:]
        assert "Traceback" not in run.stderr and "internal error" not in run.stderr
        assert error_lines(run.stderr) == [
            f"lmpress: error: {record}: cannot write: the file is at the size limit "
            f"(ulimit -f); rows already written are kept: raise the limit and re-run the "
            f"same command to resume"
        ]
        # The summary is small enough to be written; it says why the job stopped.
        summary = json.loads(out.with_name(f"{out.name}.summary.json").read_text())
        assert str(record) in summary["stopped_because"]
        assert 0 < summary["rows_ok"] < 60
        assert not list(tmp_path.glob(".*.tmp"))
        if suffix == ".parquet":
            finish = run_lmpress(*args)
            assert finish.returncode == 0, finish.stderr[-3000:]
            import pyarrow.parquet as pq

            ids = pq.read_table(out, columns=["id"]).column("id").to_pylist()
            assert sorted(ids) == sorted(prompts)
        else:
            assert_resumes_with_every_row_once(args, out, prompts)


@pytest.fixture
def small_disk(tmp_path):
    """A 300 KB tmpfs, or a skip where this machine does not let the tests mount one."""
    mount = tmp_path / "disk"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=300k", "tmpfs", str(mount)],
                          capture_output=True, text=True)  # fmt: skip
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_is_one_line_leaves_no_empty_summary_and_resumes_once_there_is_room(
    tmp_path, small_disk
):
    prompts = write_rows(tmp_path / "in.jsonl", 1500)  # about 900 KB of output rows
    out = small_disk / "out.jsonl"
    with LLMServer() as server:
        args = batch_args(server, tmp_path / "in.jsonl", out)
        run = run_lmpress(*args, "--remote_params.num_workers", "16")
        assert run.returncode == 1, run.stderr[-3000:]
        assert "Traceback" not in run.stderr and "internal error" not in run.stderr
        assert error_lines(run.stderr) == [
            f"lmpress: error: {out}: cannot write: no space left on the device; rows already "
            f"written are kept: free some space and re-run the same command to resume"
        ]
        summary = small_disk / "out.jsonl.summary.json"
        if summary.exists():  # written whole, or not at all
            assert json.loads(summary.read_text())["rows_ok"] > 0
        assert not list(small_disk.glob(".*.tmp"))
        subprocess.run(["mount", "-o", "remount,size=10m", str(small_disk)], check=True)
        assert_resumes_with_every_row_once(args, out, prompts)
