"""What the response cache saves on a rerun, what it costs a cold run, and whether two jobs
writing it at once wait on each other.

    python benchmarks/response_cache.py                 # all three
    python benchmarks/response_cache.py --only rerun    # rerun, overhead or writers
    python benchmarks/response_cache.py --rounds 5      # overhead: more alternating rounds

1. Rerun: 10,000 rows against a test server that answers after 100 ms (--latency), at
   --workers requests in flight. The job runs once with an empty cache, then again on the
   same rows with 1,000 of them changed (to another output). The figure is the first run's
   wall time over the second's (target >= 8x), each `lmpress batch` a fresh process, timed
   whole (start-up included); the server must see exactly the 1,000 changed requests.
2. Overhead: a cold run (the cache empty, so every row is a miss and is written to it) against
   `--cache off`, at full speed (no latency), 10,000 rows. The sides alternate over --rounds,
   each a fresh process with an empty cache directory; the figure is the ratio of medians of
   rows/s by lmpress's own wall time (target >= 0.97: at most 3% slower).
3. Writers: two `lmpress batch` processes started together, each with its own 10,000 rows
   (1,000 of them shared), writing one cache directory. Each reports the longest it waited for
   the other's transaction (summary `cache.longest_write_wait_s`, target < 1 s); afterwards
   every row of both is answered from the cache by a third run (no entry lost or damaged).

The server runs in this process on a thread; lmpress runs as the real CLI in child processes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.servers.llm_server import Faults, LLMServer  # noqa: E402

ROWS = 10_000
CHANGED = 1_000


def write_rows(path: Path, count: int, changed: set[int] = frozenset(), tag: str = "") -> None:
    with path.open("w") as out:
        for i in range(count):
            text = f"Question {tag}{i}: why?" if i not in changed else f"Question {i}, reworded?"
            out.write(json.dumps({"id": f"row-{i}", "prompt": text}) + "\n")


def start_batch(server: LLMServer, rows: Path, out: Path, cache: Path, *extra: str):
    cmd = [
        sys.executable, "-m", "lmpress", "batch", "--engine", "REMOTE",
        "--remote_params.api_url", server.openai_url, "--model.model_name", "bench",
        "--generation.max_new_tokens", "16", "-i", str(rows), "-o", str(out),
        "--cache-dir", str(cache), *extra,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=REPO)  # fmt: skip


def run_batch(server, rows, out, cache, *extra) -> tuple[float, dict]:
    """(process wall time, the run's summary)."""
    started = time.perf_counter()
    proc = start_batch(server, rows, out, cache, *extra)
    _, stderr = proc.communicate()
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"lmpress batch failed ({proc.returncode}):\n{stderr[-3000:]}")
    return wall, summary_of(out)


def summary_of(out: Path) -> dict:
    return json.loads(out.with_name(f"{out.name}.summary.json").read_text())


def asked(server: LLMServer) -> int:
    return server.stats.completed


def rerun(tmp: Path, latency: float, workers: int) -> None:
    cache = tmp / "rerun-cache"
    first_rows, second_rows = tmp / "first.jsonl", tmp / "second.jsonl"
    write_rows(first_rows, ROWS)
    changed = set(range(0, ROWS, ROWS // CHANGED))
    write_rows(second_rows, ROWS, changed)
    flags = ["--remote_params.num_workers", str(workers)]
    with LLMServer(Faults(latency_s=latency)) as server:
        first, s1 = run_batch(server, first_rows, tmp / "first.out.jsonl", cache, *flags)
        sent_first = asked(server)
        server.reset()
        second, s2 = run_batch(server, second_rows, tmp / "second.out.jsonl", cache, *flags)
        sent_second = asked(server)
    print(f"rerun: {ROWS:,} rows, {latency * 1000:.0f} ms latency, {workers} in flight")
    print(f"  first run  {first:7.2f} s  ({sent_first:,} requests reached the server)")
    print(f"  second run {second:7.2f} s  ({sent_second:,} requests; {len(changed):,} rows changed;"
          f" cache {s2['cache']})")  # fmt: skip
    print(f"  speed-up   {first / second:7.2f}x  (target >= 8x)")
    assert sent_second == len(changed), "the server must see exactly the changed rows"


def overhead(tmp: Path, rounds: int) -> None:
    rows = tmp / "overhead.jsonl"
    write_rows(rows, ROWS)
    rates: dict[str, list[float]] = {"off": [], "cold": []}
    with LLMServer(Faults()) as server:
        for r in range(rounds):
            for side in ("off", "cold") if r % 2 == 0 else ("cold", "off"):
                cache = tmp / f"cold-{r}-{side}"
                out = tmp / f"{side}-{r}.jsonl"
                extra = ["--cache", "off"] if side == "off" else []
                _, summary = run_batch(server, rows, out, cache, *extra)
                rates[side].append(summary["rows_per_s"])
                print(f"  round {r + 1} {side:4} {summary['rows_per_s']:8.1f} rows/s", flush=True)
    off, cold = statistics.median(rates["off"]), statistics.median(rates["cold"])
    print(f"overhead: cold cache {cold:.1f} rows/s vs --cache off {off:.1f} rows/s (medians of "
          f"{rounds}): ratio {cold / off:.3f} (target >= 0.97)")  # fmt: skip


def writers(tmp: Path) -> None:
    cache = tmp / "shared-cache"
    inputs = []
    for name in ("a", "b"):
        path = tmp / f"writer-{name}.jsonl"
        # Rows 0-999 are the same in both; the rest are each writer's own.
        with path.open("w") as out:
            for i in range(ROWS):
                text = f"Question {i}: why?" if i < CHANGED else f"Question {name}{i}: why?"
                out.write(json.dumps({"id": f"row-{i}", "prompt": text}) + "\n")
        inputs.append(path)
    with LLMServer(Faults()) as server:
        procs = [
            start_batch(server, rows, tmp / f"{rows.stem}.out.jsonl", cache) for rows in inputs
        ]
        for proc in procs:
            _, stderr = proc.communicate()
            if proc.returncode != 0:
                raise SystemExit(f"a writer failed ({proc.returncode}):\n{stderr[-3000:]}")
        waits = [
            summary_of(tmp / f"{rows.stem}.out.jsonl")["cache"]["longest_write_wait_s"]
            for rows in inputs
        ]
        server.reset()
        for rows in inputs:
            _, summary = run_batch(server, rows, tmp / f"{rows.stem}.again.jsonl", cache)
            assert summary["cache"]["hits"] == ROWS, summary["cache"]
        assert asked(server) == 0
    print(f"writers: two jobs writing one cache at once: longest wait for the other's write "
          f"{max(waits):.3f} s (target < 1 s); then every row of both ({2 * ROWS:,}) was a hit")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("rerun", "overhead", "writers"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--latency", type=float, default=0.1)
    parser.add_argument("--workers", type=int, default=16)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="lmpress-cache-bench-") as scratch:
        tmp = Path(scratch)
        if args.only in (None, "rerun"):
            rerun(tmp, args.latency, args.workers)
        if args.only in (None, "overhead"):
            overhead(tmp, args.rounds)
        if args.only in (None, "writers"):
            writers(tmp)


if __name__ == "__main__":
    main()
