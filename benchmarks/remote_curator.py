"""Issue 57's figures: one remote step, `lmpress batch` against Bespoke Curator on the same
loopback server, each side as a share of the ideal rate.

    python benchmarks/remote_curator.py [--rows 1600 16000] [--rounds 3] [--latency 0.2]
        [--workers 32]

The server (tests/servers/llm_server.py) runs on a thread of this process and answers every
request after --latency seconds, so with --workers requests in flight no side can finish N rows
in less than N x latency / workers seconds (10 s for 1,600 rows at 200 ms and 32): the ideal.
Both sides send the same rows (remote_throughput.py's {"id", "prompt"}, max_tokens 16) with
--workers in flight, each run a fresh process, the sides alternating over --rounds:

- lmpress: `lmpress batch --engine REMOTE`, num_workers = --workers, its response cache empty
  (remote_throughput.py's run_batch);
- Curator: benchmarks/curator_step.py with .venv-curator's Python (pipeline_speed.py's
  ensure_curator), `max_concurrent_requests` = --workers, its rate limits out of the way, its
  cache off, tiktoken's encoding a stand-in (pipeline_curator.py).

A side's share of the ideal is given two ways: over its process's wall time, start to exit
(interpreter start, imports, reading the rows and writing the replies included), and over the
server's busy window (its first request in to its last reply out). Also printed: the side's own
CPU time, the seconds from its start to its first request and from the last reply to its exit,
the server's CPU time as a share of its busy window (one core is 1.0: the server must not be
what limits), and the most requests the server held at once. Medians over the rounds;
issue 57's targets: lmpress >= 0.95 of the ideal at 16,000 rows, Curator / lmpress >= 1.2.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.pipeline_speed import curator_env, ensure_curator  # noqa: E402
from benchmarks.remote_throughput import run_batch, write_rows  # noqa: E402
from tests.servers.llm_server import Faults, LLMServer  # noqa: E402

CURATOR_STEP = REPO / "benchmarks" / "curator_step.py"
SIDES = ("lmpress", "Curator")


class Run(NamedTuple):
    wall_s: float  # the side's process, start to exit
    window_s: float  # the server's first request in to its last reply out
    cpu_s: float  # the side's process, user and system
    server_cpu_s: float  # this process (the server's threads) over the run
    before_s: float  # the process's start to its first row's request
    in_flight: int  # the most the server held at once

    @property
    def after_s(self) -> float:
        """The last reply to the process's exit."""
        return self.wall_s - self.window_s - self.before_s


def run_curator(python: Path, server: LLMServer, rows: Path, workers: int) -> tuple[float, float]:
    """Curator's process, timed start to exit: (wall seconds, CPU seconds)."""
    work = Path(tempfile.mkdtemp(prefix="lmpress-curator-"))
    env = curator_env(work)
    cmd = [str(python), str(CURATOR_STEP), "--base-url", server.openai_url, "--input", str(rows),
           "--workers", str(workers), "--out", str(work / "out")]  # fmt: skip
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, cwd=work)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - started
        out.seek(0)
        err.seek(0)
        said, stderr = out.read(), err.read()
    shutil.rmtree(work, ignore_errors=True)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"the Curator side failed:\n{stderr[-3000:]}")
    written = json.loads(said.strip().splitlines()[-1])["rows"]
    assert written == count_rows(rows), f"Curator wrote {written} rows"
    return wall, usage.ru_utime + usage.ru_stime


def count_rows(path: Path) -> int:
    with path.open("rb") as rows:
        return sum(1 for _ in rows)


def server_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run_side(side: str, server: LLMServer, rows: Path, workers: int, tmp: Path) -> Run:
    server.reset()
    cpu_before, began = server_cpu(), time.monotonic()  # the server's clock
    if side == "Curator":
        wall, cpu = run_curator(ensure_curator(), server, rows, workers)
    else:
        out = tmp / "lmpress.out.jsonl"
        run = run_batch(server, rows, out, workers)
        assert count_rows(out) == count_rows(rows), "lmpress: rows missing"
        out.unlink()
        wall, cpu = run.wall_s, run.cpu_s
    s, count = server.stats, count_rows(rows)
    # Curator first posts an empty conversation to read rate limits from the reply's headers
    # (it does with its limits given too); the server refuses it at once (400), and the window
    # starts at the first row's request.
    probes = s.requests - count
    assert s.completed == count and s.statuses[400] == probes, (side, s.statuses)
    first = s.arrivals[probes][0]
    window = s.last_done - first
    return Run(wall, window, cpu, server_cpu() - cpu_before, first - began, s.max_in_flight)


def measure(count: int, rounds: int, latency: float, workers: int, tmp: Path) -> dict:
    rows = tmp / f"rows-{count}.jsonl"
    write_rows(rows, count)
    runs: dict[str, list[Run]] = {side: [] for side in SIDES}
    with LLMServer(Faults(latency_s=latency)) as server:
        for r in range(rounds):
            for side in SIDES if r % 2 == 0 else tuple(reversed(SIDES)):
                run = run_side(side, server, rows, workers, tmp)
                runs[side].append(run)
                print(f"  {count:,} rows, round {r + 1}, {side:7}: wall {run.wall_s:7.2f} s, "
                      f"server window {run.window_s:7.2f} s (from {run.before_s:.2f} s to "
                      f"{run.after_s:.2f} s before the end), CPU {run.cpu_s:6.2f} s, server CPU "
                      f"{run.server_cpu_s / run.window_s:.2f} of a core, at most {run.in_flight} "
                      f"in flight", flush=True)  # fmt: skip
    return runs


def report(results: dict[int, dict[str, list[Run]]], latency: float, workers: int) -> None:
    print(
        "\n| rows | side | wall s | share of ideal (wall) | server window s | share of ideal "
        "(window) | start to first request s | last reply to exit s | side's CPU s | server CPU "
        "/ window | Curator / lmpress (wall; window) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for count, runs in results.items():
        ideal = count * latency / workers
        median = {
            side: Run(*(statistics.median(getattr(r, f) for r in rs) for f in Run._fields))
            for side, rs in runs.items()
        }
        for side in SIDES:
            m = median[side]
            after = statistics.median(r.after_s for r in runs[side])
            walls = ", ".join(f"{r.wall_s:.2f}" for r in runs[side])
            ratio = "" if side == "lmpress" else (
                f"**{m.wall_s / median['lmpress'].wall_s:.2f}x**; "
                f"{m.window_s / median['lmpress'].window_s:.2f}x"
            )  # fmt: skip
            print(f"| {count:,} | {side} | {m.wall_s:.2f} ({walls}) | **{ideal / m.wall_s:.3f}** "
                  f"| {m.window_s:.2f} | {ideal / m.window_s:.3f} | {m.before_s:.2f} | "
                  f"{after:.2f} | {m.cpu_s:.2f} | "
                  f"{m.server_cpu_s / m.window_s:.2f} | {ratio} |")  # fmt: skip
    print(f"\nideal: rows x {latency:g} s / {workers} in flight; medians of each side's runs")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1600, 16000])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--workers", type=int, default=32)
    args = parser.parse_args()
    ensure_curator()
    with tempfile.TemporaryDirectory() as name:
        results = {
            count: measure(count, args.rounds, args.latency, args.workers, Path(name))
            for count in args.rows
        }
    report(results, args.latency, args.workers)


if __name__ == "__main__":
    main()
