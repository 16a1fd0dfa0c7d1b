"""A running job, followed (lmpress/view/sources.py, stats.live_state): a real `lmpress batch`
on ECHO writes its rows slowly while the viewer is open on its output. Each row is in /api/live
and /api/rows at the first look after its line is on disk (the page looks every second, so a
row shows within about a second of being written); the job's total comes from its lock's
record, its rate and time left from what the viewer saw; and the job's output is byte for byte
what the same job writes with no viewer, no file of the job's touched."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from pathlib import Path

from tests.conftest import REPO, lmpress_process, run_lmpress, with_plugin
from tests.view.conftest import client, write_rows

ROWS = 8


def job_args(source: Path, out: Path) -> list[str]:
    return [
        "batch", "--engine", "ECHO", "-i", str(source), "-o", str(out), "--ordered",
        "--generation.batch_size", "1", "--generation.max_new_tokens", "6", "--cache", "off",
    ]  # fmt: skip


def whole_lines(path: Path) -> list[bytes]:
    data = path.read_bytes() if path.exists() else b""
    return data.split(b"\n")[:-1]


def wait_for(condition, what: str, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"waited {seconds:g} s for {what}"
        time.sleep(0.02)


def job_files(folder: Path, name: str) -> dict[str, str]:
    """The job's files beside its output (the viewer's index left out), by digest."""
    return {
        path.name.replace(name, "OUT"): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in folder.iterdir()
        if path.name.startswith(name) and not path.name.endswith(".view-index")
    }


def test_a_running_job_is_followed_and_left_as_it_would_be(tmp_path, echo_plugin):
    rows = [{"id": f"r{i}", "prompt": f"row {i} says something"} for i in range(ROWS)]
    source = write_rows(tmp_path / "in.jsonl", rows)
    gate = tmp_path / "gate"
    plugin = with_plugin(echo_plugin)
    env = {**os.environ, "PYTHONPATH": str(REPO), **plugin, "ECHO_DELAY_S": "0.08"}
    watched, alone = tmp_path / "watched", tmp_path / "alone"
    watched.mkdir()
    alone.mkdir()
    out = watched / "out.jsonl"
    job = lmpress_process(
        *job_args(source, out), env={**env, "ECHO_GATE": str(gate)},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        lock = watched / "out.jsonl.lock"
        wait_for(lambda: b"rows_total" in (lock.read_bytes() if lock.exists() else b""), "start")
        viewer = client(out)
        live = viewer.get("/api/live").json()
        assert live["running"] is True and live["rows"] == 0
        assert viewer.get("/api/sources").json()["sources"][0]["live"] is True
        overview = viewer.get("/api/overview").json()
        assert overview["rows"]["total"] == ROWS and overview["rows"]["left"] == ROWS
        gate.touch()  # the job's replies may come now
        seen, rates, etas = 0, [], []
        while seen < ROWS:
            wait_for(lambda done=seen: len(whole_lines(out)) > done, f"row {seen}")
            written = whole_lines(out)
            live = viewer.get("/api/live", params={"since": seen}).json()
            assert live["rows"] >= len(written)  # at the first look after it was written
            page = viewer.get("/api/rows", params={"offset": seen, "limit": 100}).json()
            ids = [json.loads(line)["id"] for line in written[seen:]]
            assert [r["id"] for r in page["rows"]][: len(ids)] == ids
            rates.append(live["rate_rows_per_s"])
            etas.append(live["eta_s"])
            seen = len(written)
        assert job.wait(timeout=60) == 0, job.stderr.read()
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    assert any(rate for rate in rates) and any(eta is not None for eta in etas)
    assert viewer.get("/api/live").json()["running"] is False
    done = viewer.get("/api/overview").json()
    assert done["rows"] == {"ok": ROWS, "failed": 0, "cached": 0, "left": 0, "total": ROWS}
    # The same job with no viewer: the same output, byte for byte, and the same files.
    gate.touch()
    run = run_lmpress(*job_args(source, alone / "out.jsonl"), env={**plugin, "ECHO_DELAY_S": "0"})
    assert run.returncode == 0, run.stderr
    assert out.read_bytes() == (alone / "out.jsonl").read_bytes()
    mine, theirs = job_files(watched, "out.jsonl"), job_files(alone, "out.jsonl")
    assert set(mine) == set(theirs)
    for name in ("OUT", "OUT.fingerprint.json", "OUT.lock"):
        assert mine[name] == theirs[name], name
    assert sorted(
        p.name for p in watched.iterdir() if p.name not in {f"out.jsonl{n[3:]}" for n in mine}
    ) == ["out.jsonl.view-index"]
