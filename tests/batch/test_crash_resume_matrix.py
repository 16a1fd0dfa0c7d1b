"""Killed with SIGKILL and resumed, in every output format, ordered or not, sharded or not,
with rows that fail: every ok row is written exactly once, every failing row is in
OUT.errors.jsonl exactly once, and no row is in both. A crash can also leave a half-written
last line in the errors file; the resume must not read or keep it as a row.

The ECHO engine (tests/plugins) replies with what it was sent, so each written row can be
checked against its own prompt, and ECHO_DELAY_S keeps a job running long enough to be
killed in the middle."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import lmpress_process, with_plugin
from tests.growing_files import whole_lines

ROWS = 48
FAILING = {i for i in range(ROWS) if i % 7 == 3}  # a temperature no engine takes: fails alone
TIMEOUT_S = 120


def source_rows(shape: str) -> list[dict]:
    rows = []
    for i in range(ROWS):
        text = f"question {i}"
        if shape == "oumi":
            row = {"conversation_id": f"c{i}", "messages": [{"role": "user", "content": text}]}
        else:
            row = {"id": f"r{i}", "prompt": text}
        if i in FAILING:
            row["generation"] = {"temperature": -1}
        rows.append(row)
    return rows


def row_id(row: dict) -> str:
    return row.get("custom_id") or row.get("conversation_id") or row["id"]


def number(ident: str) -> int:
    return int(ident.lstrip("rc"))


def reply_text(row: dict, fmt: str) -> str:
    if fmt == "openai":
        return row["response"]["body"]["choices"][0]["message"]["content"]
    if fmt == "oumi":
        return row["messages"][-1]["content"]
    return row["response"]["text"]


def read_lines(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


class Job:
    """One `lmpress batch` output (one shard of it, when sharded), killed and resumed."""

    def __init__(self, tmp: Path, src: Path, fmt: str, ordered: bool, shard: str | None, env):
        suffix = f"-{shard.replace('/', 'of')}" if shard else ""
        self.out = tmp / f"out{suffix}.jsonl"
        self.errors = tmp / f"out{suffix}.jsonl.errors.jsonl"
        self.env = env
        self.args = ["batch", "--engine", "ECHO", "-i", str(src), "-o", str(self.out)]
        # --cache off: each run generates what it writes, so a resumed run is as slow as the
        # first and the kills land mid-job (rows kept in the response cache would finish it).
        self.args += ["--generation.batch_size", "3", "--cache", "off"]
        if fmt in ("lmpress", "openai"):
            self.args += ["--output-format", fmt]
        if ordered:
            self.args.append("--ordered")
        if shard:
            self.args += ["--shard", shard]

    def start(self) -> subprocess.Popen:
        return lmpress_process(*self.args,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=self.env,
        )  # fmt: skip

    def progress(self) -> int:
        """Rows written or failed so far."""
        return len(whole_lines(self.out)) + len(whole_lines(self.errors))

    def tear_errors(self) -> None:
        """Leave half a line at the end of the errors file, as a crash mid-write would."""
        with self.errors.open("a", encoding="utf-8") as errors:
            errors.write('{"line": 999, "id": "half-writ')


@pytest.fixture(scope="module")
def env(echo_plugin):
    return {**os.environ, **with_plugin(echo_plugin), "ECHO_DELAY_S": "0.03"}


# (ordered, sharded) by format: every pair of the three choices is met (each format ordered and
# not, sharded and not; each ordered/sharded combination in some format). Whether the output is
# ordered or sharded does not depend on its format, nor the other way round: the full product
# would run each of those paths again.
VARIANTS = {
    "lmpress": [(False, False), (True, True)],
    "openai": [(False, True), (True, False)],
    "oumi": [(False, False), (True, True)],
}


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["lmpress", "openai", "oumi"])
def test_sigkill_and_resume_keeps_every_row_exactly_once(tmp_path, env, fmt):
    """One format's cases (`VARIANTS`) run side by side, each in a directory of its own: their
    jobs mostly wait on ECHO, so together they take about the time of one."""
    shape = "oumi" if fmt == "oumi" else "lmpress"
    rng = random.Random(fmt)
    cases = {}
    for ordered, sharded in VARIANTS[fmt]:
        tmp = (
            tmp_path
            / f"{'ordered' if ordered else 'unordered'}-{'sharded' if sharded else 'whole'}"
        )
        tmp.mkdir()
        src = tmp / "in.jsonl"
        src.write_text("".join(json.dumps(r) + "\n" for r in source_rows(shape)), encoding="utf-8")
        shards = ["0/2", "1/2"] if sharded else [None]
        cases[ordered, sharded] = [Job(tmp, src, fmt, ordered, shard, env) for shard in shards]
    jobs = [job for case in cases.values() for job in case]

    # Every job (a sharded job's shards side by side, as they would run) is killed once it has
    # written a random few rows.
    running = {job: (job.start(), rng.randint(4, 12)) for job in jobs}
    deadline = time.monotonic() + TIMEOUT_S
    while running and time.monotonic() < deadline:
        for job, (proc, target) in list(running.items()):
            assert proc.poll() is None, "the job ended before the kill"
            if job.progress() >= target:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                del running[job]
                if job.errors.exists():
                    job.tear_errors()
        time.sleep(0.005)
    assert not running

    finishing = [(job, job.start()) for job in jobs]
    for _job, proc in finishing:
        _, err = proc.communicate(timeout=TIMEOUT_S)
        assert proc.returncode == 1, err  # 1: some rows failed, as they must

    for (ordered, _sharded), case in cases.items():
        check_case(case, fmt, ordered)


def check_case(jobs: list[Job], fmt: str, ordered: bool) -> None:
    written = [row for job in jobs for row in read_lines(job.out)]
    failed = [row for job in jobs for row in read_lines(job.errors)]
    ok_ids = [row_id(row) for row in written]
    failed_ids = [row_id(row) for row in failed]
    assert len(ok_ids) == len(set(ok_ids)), "a row was written twice"
    assert len(failed_ids) == len(set(failed_ids)), "a failed row was recorded twice"
    assert {number(i) for i in ok_ids} == set(range(ROWS)) - FAILING
    assert {number(i) for i in failed_ids} == FAILING
    for row in written:
        assert f"question {number(row_id(row))}" in reply_text(row, fmt)
    for row in failed:
        message = row["error"]["message"]
        assert "generation.temperature" in message, message
    if ordered:
        for job in jobs:
            got = [number(row_id(row)) for row in read_lines(job.out)]
            assert got == sorted(got)
