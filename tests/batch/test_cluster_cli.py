"""`lmpress batch --ray` through the real CLI, on a real local Ray cluster: the same rows as a
local run on NATIVE and REMOTE, and every row exactly once when a replica or the driver is
killed mid-job.

Most tests join one cluster the module starts (`ray start --head`), as a user joins theirs;
the NATIVE test and the restart test let `lmpress batch --ray` start a local Ray of their own.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from lmpress.batch.cluster.connect import NO_PRESTARTED_WORKERS
from tests.cli.test_cli import mixed_rows
from tests.conftest import REPO, run_lmpress, with_plugin
from tests.growing_files import whole_rows
from tests.servers.llm_server import Faults, LLMServer, reply_text
from tests.suite_checks import described, load_factor

ray = pytest.importorskip("ray", reason="the ray extra is not installed")

# Slow by nature: each test starts Ray workers (or a local Ray of its own) that import and load
# their engine, 20-40 s on an idle 2-core machine before a row is run.
pytestmark = [pytest.mark.timeout(420), pytest.mark.slow]

TINY = ["--model.model_name", "tiny:llama", "--generation.max_new_tokens", "3",
        "--generation.batch_size", "64"]  # fmt: skip
FAST = ["--remote_params.retry_backoff_base", "0.05", "--remote_params.retry_backoff_max", "1"]
BAD_LINES = ["not json at all", '{"txt": "no messages"}']
FAILING = "PLEASE-FAIL"  # the test server refuses any conversation holding it, every time


# Set for the module, so that every process it starts carries it: lmpress, the Ray head, and
# the workers of each Ray, which Ray leaves to init rather than to the test that started them.
MODULE_TOKEN = "LMPRESS_TEST_RAY_MODULE"


@pytest.fixture(scope="module", autouse=True)
def no_ray_process_outlives_the_module():
    """No process this module started is left when it ends (the session's own check sees only
    the test process's children, and a Ray worker is not one). Each run stops its Ray when it
    ends, and a replica notices soon after; one still there after a generous grace is killed,
    and the module fails naming it."""
    token = uuid.uuid4().hex
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(MODULE_TOKEN, token)
        # Each Ray would otherwise report its usage to Ray's servers: no test reaches past
        # the loopback.
        patch.setenv("RAY_USAGE_STATS_ENABLED", "0")
        yield
    # A replica has been seen to stop a minute after its job on a loaded machine: the grace
    # bounds a process that never stops, and grows with the load as the tests' budget does.
    _, left = psutil.wait_procs(_carrying(token), timeout=90 * load_factor())
    names = [described(p) for p in left]
    for process in left:
        process.kill()
    assert not names, "Ray processes outlived the module (now killed):\n  " + "\n  ".join(names)


def _carrying(token: str) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter():
        try:
            if process.pid != os.getpid() and process.environ().get(MODULE_TOKEN) == token:
                found.append(process)
        except psutil.Error:
            pass
    return found


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A Ray head on this machine, as `ray start --head` starts one; its address."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    ray_cli = Path(sys.executable).with_name("ray")
    temp = tmp_path_factory.mktemp("ray")
    head = subprocess.Popen(
        [str(ray_cli), "start", "--head", "--block", f"--port={port}", "--num-cpus=2",
         "--include-dashboard=false", "--node-ip-address=127.0.0.1", f"--temp-dir={temp}",
         # No log monitor: it streams workers' output to drivers, which lmpress's jobs do not
         # ask for (`log_to_driver`, --debug aside), and it reads every log file all module.
         "--include-log-monitor=false", "--disable-usage-stats",
         # Replicas at the suite's priority, and no workers started ahead of the tasks that
         # need them (a replica cannot use one), as a local Ray of lmpress's runs: at Ray's
         # default nice 15 they wait behind any busy process (the rest of the suite).
         f"--system-config={json.dumps({'worker_niceness': 0, **NO_PRESTARTED_WORKERS})}"],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    address = f"127.0.0.1:{port}"
    try:
        _wait_for_port(port, head)
        yield address
    finally:
        os.killpg(head.pid, signal.SIGKILL)  # the head and every process it started
        head.wait(timeout=30)


def _wait_for_port(port: int, head: subprocess.Popen, limit_s: float = 60) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        assert head.poll() is None, "ray start --head exited"
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                time.sleep(2)  # the GCS listens before the head's raylet has registered
                return
        time.sleep(0.2)
    raise AssertionError("the Ray head did not start")


def write_input(path: Path, rows: list[dict], bad_lines: list[str] = ()) -> Path:
    lines = [json.dumps(r) for r in rows]
    for i, bad in enumerate(bad_lines):  # spread through the file
        lines.insert((i + 1) * len(lines) // (len(bad_lines) + 1), bad)
    path.write_text("".join(line + "\n" for line in lines))
    return path


def ident(row: dict) -> str:
    return row.get("id") or row.get("conversation_id") or row.get("custom_id")


def written(path: Path) -> list[dict]:
    """The rows of a finished job's output: every line whole (a job still running or killed
    is read with `whole_rows`)."""
    text = path.read_text()
    assert not text or text.endswith("\n"), f"{path.name} ends mid-line"
    return [json.loads(line) for line in text.splitlines()]


def replies(path: Path) -> dict[str, str]:
    """Each written row's id and reply; the ids are asserted unique first."""
    rows = written(path)
    ids = [ident(r) for r in rows]
    assert len(ids) == len(set(ids)), "a row was written twice"
    return {ident(r): r["response"]["text"] for r in rows}


def failed_lines(out: Path) -> list[int]:
    errors = out.with_name(f"{out.name}.errors.jsonl")
    return sorted(json.loads(line)["line"] for line in errors.read_text().splitlines())


def hits_misses_saved(summary: dict) -> dict:
    """The response cache's counts in a run's summary (its write wait is a timing)."""
    return {k: v for k, v in summary["cache"].items() if k != "longest_write_wait_s"}


def summary(out: Path) -> dict:
    return json.loads(out.with_name(f"{out.name}.summary.json").read_text())


def remote_args(server: LLMServer, *more: str) -> list[str]:
    return ["--engine", "REMOTE", "--remote_params.api_url", server.openai_url,
            "--model.model_name", "test-model", *FAST, *more]  # fmt: skip


def test_native_on_ray_writes_the_rows_a_local_run_writes(tmp_path):
    # 64 rows: each of mixed_rows' four shapes 16 times, in four calls of 16 (more rows only
    # repeat those calls).
    src = write_input(tmp_path / "in.jsonl", mixed_rows(64), BAD_LINES)
    local, on_ray = tmp_path / "local.jsonl", tmp_path / "ray.jsonl"
    run = run_lmpress("batch", "-i", str(src), "-o", str(local), *TINY)
    assert run.returncode == 1, run.stderr[-2000:]  # the two bad lines
    # No --ray.address: lmpress starts a local Ray of its own, and stops it.
    # One replica: a NATIVE replica is the whole engine as a local run has it (no share of
    # limits to split), and rows from two replicas reaching one driver is the REMOTE test's
    # subject; a second would only load torch and the model again.
    # --cache off: the replica generates every row, rather than read the local run's replies.
    run = run_lmpress(
        "batch", "-i", str(src), "-o", str(on_ray), *TINY, "--ray",
        "--ray.cpus_per_replica", "0.5", "--ray.batch_size", "16", "--cache", "off",
    )  # fmt: skip
    assert run.returncode == 1, run.stderr[-2000:]
    assert "started Ray" in run.stderr
    assert "Traceback" not in run.stderr
    expected = replies(local)
    assert len(expected) == 64
    assert replies(on_ray) == expected  # greedy: the same text for every row
    assert failed_lines(on_ray) == failed_lines(local) and len(failed_lines(local)) == 2
    done = summary(on_ray)
    assert (done["rows_ok"], done["rows_failed"]) == (64, 2)
    assert done["completion_tokens"] == summary(local)["completion_tokens"]


def test_remote_on_ray_writes_the_rows_a_local_run_writes(tmp_path, cluster):
    # 100 rows: seven calls of 16 across two replicas, each shape of mixed_rows 25 times.
    rows = mixed_rows(100)
    rows[37] = {"id": "refused", "prompt": f"{FAILING} this one"}
    src = write_input(tmp_path / "in.jsonl", rows)
    local, on_ray = tmp_path / "local.jsonl", tmp_path / "ray.jsonl"
    with LLMServer(Faults(latency_s=0.01, permanent={FAILING: 400})) as server:
        args = remote_args(server, "--remote_params.num_workers", "8")
        run = run_lmpress("batch", "-i", str(src), "-o", str(local), *args)
        assert run.returncode == 1, run.stderr[-2000:]
        server.reset()
        on_cluster = [
            "--ray", "--ray.address", cluster, "--ray.replicas", "2",
            "--ray.cpus_per_replica", "0.5", "--ray.batch_size", "16",
        ]  # fmt: skip
        run = run_lmpress(
            "batch", "-i", str(src), "-o", str(on_ray), *args, *on_cluster, "--cache", "off"
        )
        stats = server.stats
        # Again, with the response cache the local run filled: the replicas read it, and only
        # the refused row (whose failure was not kept) reaches the server.
        server.reset()
        cached = tmp_path / "cached.jsonl"
        again = run_lmpress("batch", "-i", str(src), "-o", str(cached), *args, *on_cluster)
        assert server.stats.requests == 1, again.stderr[-2000:]
    assert again.returncode == 1, again.stderr[-2000:]
    assert hits_misses_saved(summary(cached)) == {"hits": 99, "misses": 1, "saved_usd": None}
    assert replies(cached) == replies(local)
    assert all(row["response"]["cached"] for row in written(cached))
    assert run.returncode == 1, run.stderr[-2000:]
    assert f"joined the Ray cluster at {cluster}" in run.stderr
    assert f"{src}:38: " in run.stderr  # the refused row is reported, and the job went on
    # The two replicas share the run's concurrency: 4 requests each, 8 in all.
    assert stats.max_in_flight <= 8
    expected = replies(local)
    assert len(expected) == 99 and "refused" not in expected
    assert replies(on_ray) == expected
    assert failed_lines(on_ray) == failed_lines(local) == [38]


# One replica, as model loads are what these runs spend their time on; rows of many calls
# reaching one driver from two replicas is the generation tests' subject. --cache off: the
# replica computes what the local run computed, rather than read its replies.
ON_CLUSTER = ["--ray.cpus_per_replica", "0.5", "--ray.batch_size", "8", "--cache", "off"]
# What differs between two runs of the same rows: timings, the ids OpenAI Batch output lines
# are given (`by_ident` keys a line by its custom_id instead), and whether the response cache
# answered (a row asking what an earlier row of the run asked is a hit).
VOLATILE = {"latency_s", "request_id", "created", "cached"}


def assert_same_rows(got: object, want: object, where: str = "") -> None:
    """Equal rows, floats within 1e-4 of each other: a replica batches rows with other
    neighbours than a local run does (which, depends on when rows reach it), so the padding
    around a text, and with it the order in which the matmuls add up, vary. Reordering a
    float32 sum of n terms moves it by about sqrt(n)*u of the terms' scale (u = 2**-24, 6e-8);
    through k chained matmuls, k times that. The tiny cross-encoder's logit (n <= 128, k ~ 13,
    activations of order 1 after LayerNorm) moves about 9e-6, absolute however near 0 it is;
    MiniLM's unit vectors (n <= 1536, k ~ 36: 8e-5 of entries ~0.05) about 4e-6. 1e-4 leaves
    10x room or more; another row's score or vector is off by 1e-2 or more."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and set(got) - VOLATILE == set(want) - VOLATILE, where
        for key in set(want) - VOLATILE:
            assert_same_rows(got[key], want[key], f"{where}.{key}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_same_rows(g, w, f"{where}[{i}]")
    elif isinstance(want, float):
        assert got == pytest.approx(want, rel=1e-4, abs=1e-4), where
    else:
        assert got == want, where


def by_ident(path: Path) -> dict[str, dict]:
    """Each written row by its id (an OpenAI Batch line's custom_id); ids asserted unique."""
    rows = written(path)
    keys = [row["custom_id"] if "custom_id" in row else row["id"] for row in rows]
    assert len(keys) == len(set(keys)), "a row was written twice"
    for row in rows:
        if "custom_id" in row:
            del row["id"]
    return dict(zip(keys, rows, strict=True))


def test_an_embed_run_on_ray_writes_a_local_run_s_parquet_vectors(tmp_path, cluster):
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = ["", *(f"Sentence {i} is about item {i * 7}. " * (1 + i % 6) for i in range(29))]
    rows = [{"id": f"t{i}", "input": text} for i, text in enumerate(texts)]
    rows.insert(4, {"id": "chat", "messages": [{"role": "user", "content": "hi"}]})
    src = write_input(tmp_path / "in.jsonl", rows)
    local, on_ray = tmp_path / "local.parquet", tmp_path / "ray.parquet"
    embed = ["--engine", "NATIVE", "--model.model_name", "minilm", "--task", "embed"]
    run = run_lmpress("batch", "-i", str(src), "-o", str(local), *embed)
    assert run.returncode == 1, run.stderr[-2000:]  # the chat row
    run = run_lmpress(
        "batch", "-i", str(src), "-o", str(on_ray), *embed, "--ray", "--ray.address", cluster,
        *ON_CLUSTER,
    )  # fmt: skip
    assert run.returncode == 1, run.stderr[-2000:]
    assert f"joined the Ray cluster at {cluster}" in run.stderr
    assert f"{src}:5: a chat row in an embed run" in run.stderr
    assert "Traceback" not in run.stderr
    want, got = pq.read_table(local), pq.read_table(on_ray)
    # The same columns and types; their order, like the rows', is whichever row came first.
    assert {f.name: f.type for f in got.schema} == {f.name: f.type for f in want.schema}
    assert want.schema.field("embedding").type == pa.list_(pa.float32(), 384)
    want_rows = {row["id"]: row for row in want.to_pylist()}
    got_rows = {row["id"]: row for row in got.to_pylist()}
    assert len(got_rows) == got.num_rows == 31  # each row once, the failed one among them
    assert want_rows["chat"]["error_kind"] == "invalid_row"
    assert_same_rows(got_rows, want_rows)


def test_a_rerank_run_on_ray_writes_a_local_run_s_rows_and_batch_lines(tmp_path, cluster):
    docs = ["alpha doc", "beta doc about cats", "gamma doc", "delta doc on dogs", "the sea"]
    rows: list[dict] = [
        {"id": f"r{i}", "query": f"which {docs[i % 5]}", "documents": docs[i % 3 :], "top_n": 2}
        for i in range(20)
    ]
    rows += [
        {"id": "pair", "text_1": "which one", "text_2": docs[:2]},
        {"id": "bad", "query": "no documents"},
        {"custom_id": "s", "method": "POST", "url": "/v1/score",
         "body": {"model": "m", "text_1": "q", "text_2": ["a doc", "b doc"]}},
        {"custom_id": "k", "method": "POST", "url": "/v1/rerank",
         "body": {"model": "m", "query": "q", "documents": docs, "top_n": 3}},
    ]  # fmt: skip
    src = write_input(tmp_path / "in.jsonl", rows)
    local, on_ray = tmp_path / "local.jsonl", tmp_path / "ray.jsonl"
    rerank = ["--engine", "NATIVE", "--model.model_name", "tiny:cross-encoder", "--task",
              "rerank"]  # fmt: skip
    run = run_lmpress("batch", "-i", str(src), "-o", str(local), *rerank)
    assert run.returncode == 1, run.stderr[-2000:]  # the row without documents
    run = run_lmpress(
        "batch", "-i", str(src), "-o", str(on_ray), *rerank, "--ray", "--ray.address", cluster,
        *ON_CLUSTER,
    )  # fmt: skip
    assert run.returncode == 1, run.stderr[-2000:]
    assert f"{src}:22: Missing required parameter: 'documents'" in run.stderr
    assert "Traceback" not in run.stderr
    want = by_ident(local)
    assert len(want) == 23 and "bad" not in want
    assert want["k"]["response"]["body"]["results"][0]["document"]["text"] in docs
    assert_same_rows(by_ident(on_ray), want)
    assert failed_lines(on_ray) == failed_lines(local) == [22]


def prompt_rows(count: int) -> list[dict]:
    return [{"id": f"row-{i}", "prompt": f"Question {i}"} for i in range(count)]


def assert_each_row_once_with_its_reply(out: Path, count: int) -> None:
    got = replies(out)  # asserts no id twice
    assert sorted(got) == sorted(f"row-{i}" for i in range(count))
    for i in range(count):
        assert got[f"row-{i}"] == reply_text(f"Question {i}")


def _replica_pids() -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if b"MapBatches(Replica)" in cmdline:
                pids.append(int(entry.name))
    return pids


def _start_and_wait_for(args: list[str], out: Path, rows: int, limit_s: float = 120):
    """Start `lmpress batch` and return it once `rows` rows are in the output."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "lmpress", "batch", *args],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + limit_s
    while len(whole_rows(out)) < rows:
        assert proc.poll() is None, proc.stderr.read()[-2000:]
        assert time.monotonic() < deadline, "the job made no progress"
        time.sleep(0.05)
    return proc


# The killed jobs: KILLED_JOB rows, acted on once KILLED_AT are written. The server answers
# HELD_AFTER of them and holds the rest until the test has acted (`Faults.hold_after`), so the
# job is mid-way when the kill lands on any machine. HELD_AFTER leaves room for the answered
# rows of the calls still in flight (8 rows a call), which a replica hands back whole.
KILLED_JOB, KILLED_AT, HELD_AFTER = 160, 40, 96


def held_server() -> LLMServer:
    return LLMServer(Faults(hold_after=HELD_AFTER))


def ray_job_args(server: LLMServer, src: Path, out: Path, cluster: str) -> list[str]:
    """A job on the module's cluster: 8 rows in flight, 8 rows a call, two replicas."""
    return ["-i", str(src), "-o", str(out), *remote_args(server),
            "--remote_params.num_workers", "8", "--ray", "--ray.address", cluster,
            "--ray.replicas", "2", "--ray.cpus_per_replica", "0.5",
            "--ray.batch_size", "8"]  # fmt: skip


def test_a_replica_killed_mid_job_loses_no_row_and_writes_none_twice(tmp_path, cluster):
    import pyarrow as pa
    import pyarrow.parquet as pq

    src = tmp_path / "in.parquet"  # Parquet in: read by the same datasource, by row group
    pq.write_table(pa.Table.from_pylist(prompt_rows(KILLED_JOB)), src, row_group_size=32)
    out = tmp_path / "out.jsonl"
    with held_server() as server:
        args = ray_job_args(server, src, out, cluster)
        proc = _start_and_wait_for(args, out, KILLED_AT)
        victims = _replica_pids()
        assert victims, "no replica process found"
        os.kill(victims[0], signal.SIGKILL)
        done_when_killed = len(whole_rows(out))
        server.release()
        _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr[-2000:]
    assert done_when_killed <= HELD_AFTER < KILLED_JOB  # killed mid-job
    assert_each_row_once_with_its_reply(out, KILLED_JOB)
    assert summary(out)["rows_ok"] == KILLED_JOB


def test_a_killed_driver_resumes_every_row_exactly_once(tmp_path, cluster):
    src = write_input(tmp_path / "in.jsonl", prompt_rows(KILLED_JOB))
    out = tmp_path / "out.parquet"  # Parquet out: its journal is the record resume reads
    journal = tmp_path / "out.parquet.journal.jsonl"
    with held_server() as server:
        args = ray_job_args(server, src, out, cluster)
        proc = _start_and_wait_for(args, journal, KILLED_AT)
        proc.kill()
        proc.wait(timeout=30)
        before = len(whole_rows(journal))
        assert before <= HELD_AFTER and not out.exists()  # killed mid-job
        server.release()
        rerun = run_lmpress("batch", *args)
        # A changed config is refused rather than mixed into the output.
        changed = run_lmpress("batch", *args, "--generation.temperature", "0.5")
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    import pyarrow.parquet as pq

    rows = pq.read_table(out).to_pylist()
    every_row = sorted(f"row-{i}" for i in range(KILLED_JOB))
    assert sorted(r["id"] for r in rows) == every_row  # each once
    for row in rows:
        assert row["response"] == reply_text(row["prompt"])
    done = json.loads((tmp_path / "out.parquet.summary.json").read_text())
    assert done["rows_skipped"] >= before - 1  # a torn last line is cut and redone
    assert done["rows_ok"] + done["rows_skipped"] == KILLED_JOB
    assert changed.returncode == 2
    assert "generation.temperature" in changed.stderr and "Traceback" not in changed.stderr


def test_sigterm_stops_the_replicas_writes_the_summary_exits_143_and_resumes(tmp_path, cluster):
    src = write_input(tmp_path / "in.jsonl", prompt_rows(KILLED_JOB))
    out = tmp_path / "out.jsonl"
    with held_server() as server:
        args = ray_job_args(server, src, out, cluster)
        proc = _start_and_wait_for(args, out, KILLED_AT)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=120)
        server.release()
        assert proc.returncode == 143, stderr[-2000:]
        assert "Traceback" not in stderr
        assert "stopping the Ray replicas; the rows they hold are left for the next run" in stderr
        stopped = summary(out)
        assert (stopped["signal"], stopped["stopped_because"]) == ("SIGTERM", "stopped by SIGTERM")
        assert KILLED_AT <= stopped["rows_ok"] == len(replies(out)) <= HELD_AFTER
        rerun = run_lmpress("batch", *args)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert_each_row_once_with_its_reply(out, KILLED_JOB)


def test_what_ray_cannot_do_ends_the_job_in_one_line(tmp_path, cluster, echo_plugin):
    src = write_input(tmp_path / "in.jsonl", prompt_rows(3))
    out = tmp_path / "out.jsonl"
    # ECHO where the refusal comes before any replica starts: the driver's engine is
    # incidental, and NATIVE's would import torch for nothing.
    echo = ["--engine", "ECHO", "--model.model_name", "echo"]
    run = run_lmpress(
        "batch", "-i", str(src), "-o", str(out), *echo, "--ray", "--ray.replicas", "64",
        "--ray.cpus_per_replica", "1", env=with_plugin(echo_plugin),
    )  # fmt: skip
    assert run.returncode == 2
    assert "ray.replicas 64" in run.stderr and "need 64 CPUs" in run.stderr
    assert "Traceback" not in run.stderr
    assert not out.exists()
    # A model the replicas cannot load: lmpress's own line, not Ray's account of a dead actor.
    # LLAMACPP: its replica fails to load as NATIVE's does, without importing torch first.
    run = run_lmpress(
        "batch", "-i", str(src), "-o", str(out), "--engine", "LLAMACPP",
        "--model.model_name", str(tmp_path / "nope"),
        "--ray", "--ray.address", cluster, "--ray.cpus_per_replica", "0.5",
    )  # fmt: skip
    assert run.returncode == 2
    assert f"joined the Ray cluster at {cluster}" in run.stderr  # the replica refused it
    assert f"lmpress: error: model.model_name: '{tmp_path / 'nope'}' does not exist" in run.stderr
    assert "Traceback" not in run.stderr
    # An address nothing answers at: refused at once (Ray itself retries for minutes).
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
    run = run_lmpress(
        "batch", "-i", str(src), "-o", str(out), *echo, "--ray", "--ray.address",
        f"127.0.0.1:{free}", timeout=60, env=with_plugin(echo_plugin),
    )  # fmt: skip
    assert run.returncode == 2
    assert f"ray.address 127.0.0.1:{free}: nothing answers there" in run.stderr
    # A task the engine does not answer: refused before Ray starts, as a live run refuses it.
    embed = write_input(tmp_path / "embed.jsonl", [{"id": "a", "input": "x"}])
    run = run_lmpress(
        "batch", "-i", str(embed), "-o", str(out), "--engine", "DEEPSEEK", "--task", "embed",
        "--model.model_name", "m", "--ray", env={"DEEPSEEK_API_KEY": "k"},
    )  # fmt: skip
    assert run.returncode == 2
    assert "task: engine DEEPSEEK cannot embed" in run.stderr
    assert "starting Ray" not in run.stderr and "Traceback" not in run.stderr


def test_native_on_ray_scores_loglikelihood_rows_as_a_local_run_does(tmp_path, cluster):
    from tests.batch.test_loglikelihood_cli import BAD, QUESTIONS

    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(row) + "\n" for row in QUESTIONS + BAD))
    local, on_ray = tmp_path / "local.jsonl", tmp_path / "ray.jsonl"
    task = ["--model.model_name", "tiny:llama", "--task", "loglikelihood", "--cache", "off"]
    run = run_lmpress("batch", "-i", str(src), "-o", str(local), *task)
    assert run.returncode == 1, run.stderr[-2000:]  # the bad rows
    run = run_lmpress(
        "batch", "-i", str(src), "-o", str(on_ray), *task, "--ray", "--ray.address", cluster,
        "--ray.cpus_per_replica", "0.5", "--ray.batch_size", "4",
    )  # fmt: skip
    assert run.returncode == 1, run.stderr[-2000:]
    assert "Traceback" not in run.stderr

    def scores(path: Path) -> dict[str, dict]:
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        return {r["id"]: {k: v for k, v in r.items() if k != "response"} for r in rows}

    # The same rows and fields; a logprob within float32 rounding, since NATIVE packs the
    # requests a round holds into one pass, and a replica's rounds hold other rows than the
    # local run's (the sums differ in the seventh digit).
    ray_rows, local_rows = scores(on_ray), scores(local)
    assert sorted(ray_rows) == sorted(local_rows) and len(local_rows) == len(QUESTIONS)
    for id, row in local_rows.items():
        theirs = ray_rows[id]
        assert {k: v for k, v in theirs.items() if "logprob" not in k} == {
            k: v for k, v in row.items() if "logprob" not in k
        }, id
        for key in (k for k in row if "logprob" in k):
            assert theirs[key] == pytest.approx(row[key], abs=1e-5), (id, key)
    assert failed_lines(on_ray) == failed_lines(local) and len(failed_lines(local)) == len(BAD)


def test_a_replica_whose_restart_never_ends_stops_the_job_and_the_next_run_finishes_it(
    tmp_path, echo_plugin
):
    # A replica dies and Ray's restart of it never finishes (in a loaded run, a vLLM replica
    # killed for memory, whose restart Ray could not complete): without a watch, Ray Data
    # waits for it forever. ECHO holds its replies until `gate` exists, and an ECHO started
    # while `hang` exists never finishes starting. No --ray.address: the replicas must carry
    # this test's environment, so lmpress starts a local Ray of its own.
    rows, gate, hang = 160, tmp_path / "gate", tmp_path / "hang"
    src = write_input(tmp_path / "in.jsonl", prompt_rows(rows))
    out = tmp_path / "out.jsonl"
    env = {**os.environ, **with_plugin(echo_plugin), "ECHO_GATE": str(gate),
           "ECHO_HANG_START": str(hang)}  # fmt: skip
    args = [sys.executable, "-m", "lmpress", "batch", "-i", str(src), "-o", str(out),
            "--engine", "ECHO", "--model.model_name", "echo", "--ray",
            "--ray.cpus_per_replica", "0.5", "--ray.batch_size", "8",
            "--ray.calls_per_replica", "1"]  # fmt: skip
    proc = subprocess.Popen(
        [*args, "--ray.restart_timeout_s", "3"], env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        gate.touch()  # let a call through: the replica has started and runs rows
        deadline = time.monotonic() + 120 * load_factor()
        while len(whole_rows(out)) < 8:
            assert proc.poll() is None, proc.stderr.read()[-2000:]
            assert time.monotonic() < deadline, "the job wrote no row"
            time.sleep(0.05)
        gate.unlink()
        hang.touch()
        victims = [p for p in _carrying_value("ECHO_HANG_START", str(hang))
                   if b"MapBatches(Replica)" in Path(f"/proc/{p.pid}/cmdline").read_bytes()]  # fmt: skip
        assert len(victims) == 1, victims
        # The local Ray runs the replica at the job's own priority, not Ray's nice 15.
        assert victims[0].nice() == psutil.Process(proc.pid).nice()
        victims[0].kill()
        _, stderr = proc.communicate(timeout=120 * load_factor())
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, stderr[-2000:]
    assert "no Ray replica has run for 3s" in stderr and "ray.restart_timeout_s" in stderr
    assert "Traceback" not in stderr
    stopped = summary(out)
    assert stopped["stopped_because"].startswith("no Ray replica has run for 3s")
    done = replies(out)  # whole rows, none twice
    assert 8 <= len(done) == stopped["rows_ok"] < rows
    assert stopped["rows_left"] == rows - len(done)
    hang.unlink()
    gate.touch()
    rerun = run_lmpress(*args[3:], env={**with_plugin(echo_plugin), "ECHO_GATE": str(gate)})
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert sorted(replies(out)) == sorted(f"row-{i}" for i in range(rows))


def _carrying_value(name: str, value: str) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter():
        try:
            if process.environ().get(name) == value:
                found.append(process)
        except psutil.Error:
            pass
    return found
