"""Each output owns its side files (issue 48): `-o ans.jsonl` and `-o ans.parquet` in one folder
used to share ans.fingerprint.json, ans.lock and ans.summary.json, so the second job's settings
refused the first one's re-run ("started with other settings ... max_new_tokens was 24") and
the two blocked each other through one lock. Side files are now named from the whole output
name (ans.jsonl.lock, ans.parquet.fingerprint.json), and an output started under the old
stem-based names still resumes under them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq

from tests.conftest import REPO, run_lmpress, with_plugin

ROWS = 10


def echo(tokens: int) -> list[str]:
    return ["--engine", "ECHO", "--generation.max_new_tokens", str(tokens)]


def write_input(path: Path, count: int = ROWS) -> Path:
    path.write_text("".join(json.dumps({"id": f"r{i}", "prompt": f"p{i}"}) + "\n"
                            for i in range(count)))  # fmt: skip
    return path


def ids_in(out: Path) -> list[str]:
    if out.suffix == ".parquet":
        return [str(x) for x in pq.read_table(out).column("id").to_pylist()]
    return [json.loads(line)["id"] for line in out.read_text().splitlines()]


def side(out: Path, name: str) -> Path:
    return out.with_name(f"{out.name}.{name}")


def test_two_outputs_with_one_stem_resume_each_with_its_own_settings(tmp_path, echo_plugin):
    src = write_input(tmp_path / "in.jsonl")
    env = with_plugin(echo_plugin)
    jsonl, parquet = tmp_path / "ans.jsonl", tmp_path / "ans.parquet"
    first = ["batch", *echo(4), "-i", str(src), "-o", str(jsonl)]
    second = ["batch", *echo(8), "-i", str(src), "-o", str(parquet)]
    for args in (first, second):
        run = run_lmpress(*args, env=env)
        assert run.returncode == 0, run.stderr
    write_input(src, ROWS + 2)  # two rows more: each output resumes into them
    for args, out in ((first, jsonl), (second, parquet)):
        run = run_lmpress(*args, env=env)
        assert run.returncode == 0, run.stderr
        assert f"resuming {out}: {ROWS} rows done" in run.stderr
        assert sorted(ids_in(out)) == sorted(f"r{i}" for i in range(ROWS + 2))
    settings = json.loads(side(jsonl, "fingerprint.json").read_text())["settings"]
    assert settings["generation"]["max_new_tokens"] == 4
    settings = json.loads(side(parquet, "fingerprint.json").read_text())["settings"]
    assert settings["generation"]["max_new_tokens"] == 8
    assert json.loads(side(parquet, "summary.json").read_text())["rows_skipped"] == ROWS
    assert side(parquet, "journal.jsonl").exists() and side(jsonl, "lock").exists()
    assert not (tmp_path / "ans.fingerprint.json").exists()


def test_two_outputs_with_one_stem_run_side_by_side(tmp_path, echo_plugin):
    src = write_input(tmp_path / "in.jsonl")
    gate = tmp_path / "gate"  # both jobs hold their replies until it appears
    env = {**os.environ, **with_plugin(echo_plugin), "ECHO_GATE": str(gate)}
    outs = [tmp_path / "ans.jsonl", tmp_path / "ans.parquet"]
    args = [sys.executable, "-m", "lmpress", "batch", *echo(4), "-i", str(src), "-o"]
    pipes = {"stdout": subprocess.DEVNULL, "stderr": subprocess.PIPE, "text": True}
    jobs = [subprocess.Popen([*args, str(out)], env=env, cwd=REPO, **pipes) for out in outs]
    try:
        deadline = time.monotonic() + 120
        while not all(side(out, "fingerprint.json").exists() for out in outs):
            gone = [job for job in jobs if job.poll() is not None]  # refused, or failed
            assert not gone, [job.stderr.read() for job in gone]
            assert time.monotonic() < deadline, "the jobs never started"
            time.sleep(0.02)
        gate.write_text("")  # both started, neither refused: each holds its own lock
        ended = [job.communicate(timeout=120) for job in jobs]
    finally:
        for job in jobs:
            if job.poll() is None:
                job.kill()
    for job, (_, err) in zip(jobs, ended, strict=True):
        assert job.returncode == 0, err
    for out in outs:
        assert sorted(ids_in(out)) == sorted(f"r{i}" for i in range(ROWS))


def test_an_output_started_under_the_old_names_resumes_under_them(tmp_path, echo_plugin):
    """An output an earlier lmpress wrote (ans.jsonl with ans.fingerprint.json beside it) goes
    on under those names, while ans.parquet, started now in the same folder, gets its own."""
    src = write_input(tmp_path / "in.jsonl")
    env = with_plugin(echo_plugin)
    jsonl, parquet = tmp_path / "ans.jsonl", tmp_path / "ans.parquet"
    first = ["batch", *echo(4), "-i", str(src), "-o", str(jsonl), "--limit", "6"]
    run = run_lmpress(*first, env=env)
    assert run.returncode == 0, run.stderr
    for name in ("fingerprint.json", "summary.json"):  # as lmpress named them before
        side(jsonl, name).rename(tmp_path / f"ans.{name}")
    side(jsonl, "lock").rename(tmp_path / "ans.lock")
    other = run_lmpress("batch", *echo(8), "-i", str(src), "-o", str(parquet), env=env)
    assert other.returncode == 0, other.stderr
    rerun = run_lmpress(*first[:-2], env=env)  # the whole input, as first started
    assert rerun.returncode == 0, rerun.stderr
    assert f"resuming {jsonl}: 6 rows done" in rerun.stderr
    assert sorted(ids_in(jsonl)) == sorted(f"r{i}" for i in range(ROWS))
    assert json.loads((tmp_path / "ans.summary.json").read_text())["rows_skipped"] == 6
    assert not side(jsonl, "fingerprint.json").exists()  # the old names went on
    assert sorted(ids_in(parquet)) == sorted(f"r{i}" for i in range(ROWS))
