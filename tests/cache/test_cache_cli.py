"""The response cache as a user meets it: `lmpress batch` run again pays only for the rows that
changed, a hit is the row a live run writes, and `--cache`, the dry run, the budget, `infer` and
`lmpress cache` do what they say. Remote runs go through the real SDK to the loopback server,
which counts what reaches it."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.conftest import run_lmpress
from tests.servers.llm_server import BatchFaults, Faults, LLMServer

VOLATILE = {"latency_s", "cached"}


def rows(count: int, changed: dict[int, str] | None = None) -> list[dict]:
    changed = changed or {}
    return [
        {"id": f"row-{i}", "prompt": changed.get(i, f"Question {i}: why is the sky blue?")}
        for i in range(count)
    ]


def write(path: Path, items: list[dict]) -> Path:
    path.write_text("".join(json.dumps(item) + "\n" for item in items))
    return path


def read(path: Path) -> dict[str, dict]:
    found = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        found[row["id"]] = row
    return found


def hits_misses_saved(summary: dict) -> dict:
    """The response cache's counts in a run's summary (its write wait is a timing)."""
    return {k: v for k, v in summary["cache"].items() if k != "longest_write_wait_s"}


def summary(out: Path) -> dict:
    return json.loads(out.with_name(f"{out.name}.summary.json").read_text())


def steady(row: dict) -> dict:
    """A row apart from what differs between a hit and a live reply: timing and the mark."""
    response = {k: v for k, v in row["response"].items() if k not in VOLATILE}
    return {**row, "response": response}


def asked(server: LLMServer) -> list[str]:
    """The user turns of the chat completions that reached the server."""
    found = []
    for path, body in server.stats.bodies:
        if path.endswith("/chat/completions"):
            found.append(body["messages"][-1]["content"])
    return sorted(found)


@pytest.fixture(scope="module")
def server():
    with LLMServer() as running:
        yield running


def remote(server: LLMServer, *more: str) -> list[str]:
    return ["--engine", "REMOTE", "--remote_params.api_url", server.openai_url,
            "--model.model_name", "test-model", *more]  # fmt: skip


def batch(src: Path, out: Path, *args: str, ok: int = 0):
    run = run_lmpress("batch", "-i", str(src), "-o", str(out), *args)
    assert run.returncode == ok, run.stderr[-3000:]
    assert "Traceback" not in run.stderr
    return run


def test_a_rerun_pays_only_for_the_rows_that_changed(tmp_path, server):
    first, second = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    server.reset()
    batch(write(tmp_path / "in.jsonl", rows(40)), first, *remote(server))
    assert len(asked(server)) == 40
    changed = {i: f"Question {i}: why is the sea green?" for i in (3, 9, 27)}
    server.reset()
    # Another output, and settings that change no reply: the cache still answers.
    batch(write(tmp_path / "in2.jsonl", rows(42, changed)), second, *remote(server),
          "--remote_params.num_workers", "3", "--remote_params.connection_timeout", "60")  # fmt: skip
    new = [changed[3], changed[9], changed[27], *(r["prompt"] for r in rows(42)[40:])]
    assert asked(server) == sorted(new)  # exactly the changed and the added rows
    before, after = read(first), read(second)
    for rid, row in after.items():
        i = int(rid.split("-")[1])
        if i in changed or i >= 40:
            assert "cached" not in row["response"]
            continue
        assert row["response"]["cached"] is True
        assert steady(row) == steady(before[rid])  # the row a live run wrote
    done = summary(second)
    assert hits_misses_saved(done) == {"hits": 37, "misses": 5, "saved_usd": None}
    assert done["rows_ok"] == 42
    # The tokens and rates count what this run generated, not what the cache answered.
    assert done["prompt_tokens"] == sum(
        after[f"row-{i}"]["response"]["usage"]["prompt_tokens"] for i in (3, 9, 27, 40, 41)
    )


def test_cache_off_and_refresh_generate_every_row(tmp_path, server):
    src = write(tmp_path / "in.jsonl", rows(12))
    batch(src, tmp_path / "a.jsonl", *remote(server))
    server.reset()
    batch(src, tmp_path / "off.jsonl", *remote(server), "--cache", "off")
    assert len(asked(server)) == 12
    assert "cache" not in summary(tmp_path / "off.jsonl")
    server.reset()
    batch(src, tmp_path / "refresh.jsonl", *remote(server), "--cache", "refresh")
    assert len(asked(server)) == 12
    assert summary(tmp_path / "refresh.jsonl")["cache"]["misses"] == 12
    server.reset()
    batch(src, tmp_path / "after.jsonl", *remote(server))
    assert asked(server) == []


def test_only_reproducible_requests_are_cached_unless_all_is_asked(tmp_path, server):
    src = write(tmp_path / "in.jsonl", rows(6))
    sampled = ["--generation.temperature", "0.8"]
    for name in ("s1", "s2"):
        server.reset()
        batch(src, tmp_path / f"{name}.jsonl", *remote(server, *sampled))
        assert len(asked(server)) == 6  # unseeded sampling: a new sample each run
    seeded = [*sampled, "--generation.seed", "7"]
    batch(src, tmp_path / "seeded1.jsonl", *remote(server, *seeded))
    server.reset()
    batch(src, tmp_path / "seeded2.jsonl", *remote(server, *seeded))
    assert asked(server) == []
    batch(src, tmp_path / "all1.jsonl", *remote(server, *sampled), "--cache", "all")
    server.reset()
    batch(src, tmp_path / "all2.jsonl", *remote(server, *sampled), "--cache", "all")
    assert asked(server) == []


def test_a_damaged_cache_is_said_in_one_line_and_the_job_runs_without_it(
    tmp_path, server, monkeypatch
):
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "responses.sqlite3").write_bytes(b"not a database, whatever it was" * 64)
    src = write(tmp_path / "in.jsonl", rows(8))
    server.reset()
    run = batch(src, tmp_path / "out.jsonl", *remote(server), "--cache-dir", str(cache))
    said = [line for line in run.stderr.splitlines() if "response cache" in line]
    assert len(said) == 1 and "running without it" in said[0], run.stderr
    assert len(asked(server)) == 8 and len(read(tmp_path / "out.jsonl")) == 8
    # `lmpress cache clear` replaces it, and the next runs use it again.
    cleared = run_lmpress("cache", "clear", "--cache-dir", str(cache))
    assert cleared.returncode == 0 and "replaced the damaged cache" in cleared.stdout
    batch(src, tmp_path / "again.jsonl", *remote(server), "--cache-dir", str(cache))
    server.reset()
    batch(src, tmp_path / "third.jsonl", *remote(server), "--cache-dir", str(cache))
    assert asked(server) == []


def test_a_damaged_entry_is_generated_again_never_served(tmp_path, server):
    cache = tmp_path / "cache"
    src = write(tmp_path / "in.jsonl", rows(5))
    batch(src, tmp_path / "a.jsonl", *remote(server), "--cache-dir", str(cache))
    db = sqlite3.connect(cache / "responses.sqlite3")
    victim = db.execute("SELECT key FROM responses LIMIT 1").fetchone()[0]
    db.execute("UPDATE responses SET value = ? WHERE key = ?", (b'{"v":1}', victim))
    db.commit()
    db.close()
    server.reset()
    run = batch(src, tmp_path / "b.jsonl", *remote(server), "--cache-dir", str(cache))
    assert len(asked(server)) == 1  # the damaged one, generated again
    assert "1 damaged entries" in run.stderr
    assert {k: steady(v) for k, v in read(tmp_path / "b.jsonl").items()} == {
        k: steady(v) for k, v in read(tmp_path / "a.jsonl").items()
    }


def test_hits_cost_nothing_and_the_summary_says_what_they_saved(tmp_path, server):
    src = write(tmp_path / "in.jsonl", rows(10))
    priced = remote(server, "--remote_params.input_price_per_million", "2",
                    "--remote_params.output_price_per_million", "8")  # fmt: skip
    batch(src, tmp_path / "a.jsonl", *priced)
    paid = summary(tmp_path / "a.jsonl")["cost_usd"]
    assert paid > 0
    server.reset()
    # A token budget far below the rows' tokens: hits spend none of it.
    run = batch(src, tmp_path / "b.jsonl", *priced, "--max-tokens", "5")
    assert asked(server) == []
    again = summary(tmp_path / "b.jsonl")
    assert again["cost_usd"] == 0 and again["stopped_because"] is None
    assert hits_misses_saved(again) == {"hits": 10, "misses": 0, "saved_usd": paid}
    assert all(row["response"]["cost_usd"] == 0 for row in read(tmp_path / "b.jsonl").values())
    assert "10 hits / 0 misses, saved $" in run.stderr


def test_the_dry_run_counts_the_rows_the_cache_would_answer(tmp_path, server):
    batch(write(tmp_path / "in.jsonl", rows(20)), tmp_path / "a.jsonl", *remote(server))
    changed = write(tmp_path / "in2.jsonl", rows(20, {0: "Something else entirely?"}))
    run = run_lmpress("batch", "-i", str(changed), "--dry-run", *remote(server))
    assert run.returncode == 0, run.stderr
    line = next(line for line in run.stderr.splitlines() if "response cache" in line)
    assert line.split("│")[2].strip() == "19"
    off = run_lmpress("batch", "-i", str(changed), "--dry-run", *remote(server), "--cache", "off")
    assert "response cache" not in off.stderr


def test_a_parquet_output_marks_its_hits(tmp_path, server):
    src = write(tmp_path / "in.jsonl", rows(4))
    batch(src, tmp_path / "a.parquet", *remote(server))
    batch(src, tmp_path / "b.parquet", *remote(server))
    first = pq.read_table(tmp_path / "a.parquet").to_pylist()
    second = pq.read_table(tmp_path / "b.parquet").to_pylist()
    assert [r["cached"] for r in first] == [False] * 4
    assert [r["cached"] for r in second] == [True] * 4
    key = lambda r: r["id"]  # noqa: E731
    strip = lambda r: {k: v for k, v in r.items() if k not in VOLATILE}  # noqa: E731
    assert sorted(map(strip, first), key=key) == sorted(map(strip, second), key=key)


def test_infer_answers_from_the_cache_without_asking_again(server):
    ask = ["infer", *remote(server), "Why is the sky blue?"]
    server.reset()
    first = run_lmpress(*ask)
    second = run_lmpress(*ask)
    assert first.returncode == second.returncode == 0, second.stderr
    assert first.stdout == second.stdout and first.stdout.strip()
    assert len(asked(server)) == 1
    assert "from the response cache" in second.stderr
    third = run_lmpress(*ask, "--cache", "off")
    assert third.stdout == first.stdout and len(asked(server)) == 2


def test_bad_cache_flags_are_one_line(tmp_path, server):
    src = write(tmp_path / "in.jsonl", rows(1))
    run = run_lmpress("batch", "-i", str(src), "-o", str(tmp_path / "o.jsonl"), "--cache", "maybe",
                      *remote(server))  # fmt: skip
    assert run.returncode == 2
    assert run.stderr.strip() == "lmpress: error: --cache maybe: use on, all, refresh, off"
    run = run_lmpress("cache", "prune", "--max-size", "lots", "--cache-dir", str(tmp_path))
    assert run.returncode == 2 and "--max-size lots: give a size such as 500MB" in run.stderr


def test_the_cache_command_shows_prunes_and_clears(tmp_path, server):
    cache = tmp_path / "cache"
    batch(write(tmp_path / "in.jsonl", rows(200)), tmp_path / "a.jsonl", *remote(server),
          "--cache-dir", str(cache))  # fmt: skip
    stats = run_lmpress("cache", "stats", "--cache-dir", str(cache))
    assert stats.returncode == 0, stats.stderr
    assert "entries    200" in stats.stdout and "REMOTE  test-model" in stats.stdout
    size_kb = float(stats.stdout.split("size")[1].split()[0])  # "size  36.0 KB of 5.0 GB"
    pruned = run_lmpress("cache", "prune", "--older-than", "1d", "--cache-dir", str(cache))
    assert pruned.returncode == 0 and pruned.stdout.startswith("removed 0 replies; 200 left")
    half = f"{int(size_kb / 2)}KB"
    capped = run_lmpress("cache", "prune", "--max-size", half, "--cache-dir", str(cache))
    assert capped.returncode == 0, capped.stderr
    left = int(capped.stdout.split(";")[1].split()[0])
    assert 0 < left < 200
    assert f"of {float(int(size_kb / 2)):.1f} KB" in capped.stdout  # the cap, kept
    cleared = run_lmpress("cache", "clear", "--cache-dir", str(cache))
    assert cleared.stdout.startswith(f"removed {left} replies")
    assert "entries    0" in run_lmpress("cache", "stats", "--cache-dir", str(cache)).stdout


def test_native_smollm2_hits_are_the_rows_it_generates(tmp_path):
    """Real weights: a hit is byte for byte the row NATIVE wrote, apart from timing and the
    mark."""
    questions = ["What is the capital of France?", "Name a primary colour.", "What is 2 + 2?"]
    src = write(
        tmp_path / "in.jsonl", [{"id": f"q{i}", "prompt": q} for i, q in enumerate(questions)]
    )
    args = ["-c", "smollm2", "--engine", "NATIVE", "--generation.max_new_tokens", "24"]
    batch(src, tmp_path / "live.jsonl", *args)
    run = batch(src, tmp_path / "again.jsonl", *args)
    live, again = read(tmp_path / "live.jsonl"), read(tmp_path / "again.jsonl")
    assert "Paris" in live["q0"]["response"]["text"]
    assert all(row["response"]["cached"] for row in again.values())
    assert {k: steady(v) for k, v in again.items()} == {k: steady(v) for k, v in live.items()}
    assert "3 hits / 0 misses" in run.stderr


def test_a_provider_batch_submits_only_what_the_cache_lacks(tmp_path):
    keys = {"OPENAI_API_KEY": "sk-test-openai"}
    with LLMServer(Faults(batch=BatchFaults(step_s=0.05))) as srv:
        args = ["--engine", "OPENAI", "--remote_params.api_url", srv.openai_url,
                "--model.model_name", "gpt-4o-mini", "--remote_params.batch_poll_max_s", "0.1"]  # fmt: skip

        def job(src: Path, out: Path, *more: str):
            run = run_lmpress("batch", "-i", str(src), "-o", str(out), *args, *more, env=keys)
            assert run.returncode == 0, run.stderr[-3000:]
            return run

        job(write(tmp_path / "in.jsonl", rows(10)), tmp_path / "a.jsonl", "--provider-batch")
        srv.reset()
        changed = write(tmp_path / "in2.jsonl", rows(10, {2: "Other?", 5: "Another?"}))
        job(changed, tmp_path / "b.jsonl", "--provider-batch")
        assert sorted(srv.stats.batch_submissions) == ["row-2", "row-5"]
        done = summary(tmp_path / "b.jsonl")
        assert (done["cache"]["hits"], done["cache"]["misses"]) == (8, 2)
        # The batch's replies answer a live run of the same rows: nothing reaches the server.
        srv.reset()
        job(changed, tmp_path / "live.jsonl")
        assert srv.stats.requests == 0
        live, batch_rows = read(tmp_path / "live.jsonl"), read(tmp_path / "b.jsonl")
        assert {k: v["response"]["text"] for k, v in live.items()} == {
            k: v["response"]["text"] for k, v in batch_rows.items()
        }
