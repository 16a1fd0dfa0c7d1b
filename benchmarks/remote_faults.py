"""How a remote job's pacing holds up against pushback (issue 31): random transient faults, a
real rate limit, and a burst of "overloaded" answers, each through the real `lmpress batch` CLI
(REMOTE engine, the openai SDK) against the loopback test server.

    python benchmarks/remote_faults.py                 # all three cases
    python benchmarks/remote_faults.py --case random   # or limit, burst

1. random: transient faults unrelated to load, on a request's first attempt only: 15% a 429
   with Retry-After 0.2, 10% a 500, 5% a dropped connection, 5% a malformed body (35% in all).
   The same rows, num_workers and latency without faults are the yardstick: the figure is
   rows/s with faults over rows/s without, each by lmpress's own wall time and each run in its
   own process (target >= 0.6). Every row must be written once.
2. limit: the server takes --limit requests a minute (a token bucket with a second's burst)
   and answers the rest 429, with the wait in Retry-After and retry-after-ms, then without any.
   The figure is requests served per second once settled (the second half of the run), over
   the limit (target >= 0.9), and that no row runs out of retries.
3. burst: every request gets 529 (no Retry-After), then 503 with Retry-After 1, for --burst-s
   seconds starting --burst-at seconds into the run. The figure is how long after the burst the
   server serves at 0.9 of its pace before it again, per second (target <= 10 s).

The server runs in this process on a thread; each lmpress run is a child process. Each case's
row counts are checked: every id once in the output, no errors file.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from remote_throughput import uncached  # noqa: E402

from tests.servers.llm_server import Faults, LLMServer  # noqa: E402

# The mix: of the distinct conversations, 35% fail their first attempt, chosen among
# these kinds by content (so 3/7 of 35% = 15% get a 429, and so on).
RANDOM_KINDS = ("429", "429", "429", "500", "500", "drop", "malformed")


@dataclass
class Run:
    wall_s: float  # lmpress's own wall time (its summary), else the process's
    rows_written: int
    errors: int  # rows in OUT.errors.jsonl
    stderr: str


def write_rows(path: Path, count: int) -> None:
    with path.open("w") as out:
        for i in range(count):
            out.write(json.dumps({"id": f"row-{i}", "prompt": f"Question {i}: why?"}) + "\n")


def run_batch(server: LLMServer, rows: Path, out: Path, count: int, workers: int) -> Run:
    """The real CLI, lmpress's default retries; checks every row is written once."""
    cmd = [
        sys.executable, "-m", "lmpress", "batch", "--engine", "REMOTE",
        "--remote_params.api_url", server.openai_url,
        "--remote_params.num_workers", str(workers),
        "--model.model_name", "bench", "--generation.max_new_tokens", "16",
        "-i", str(rows), "-o", str(out),
    ]  # fmt: skip
    env = uncached({**os.environ, "PYTHONPATH": str(REPO)})
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
    wall = time.perf_counter() - started
    match = re.search(r"wall time\s*│\s*([\d.]+) s", proc.stderr)
    ids = [json.loads(line)["id"] for line in out.read_text().splitlines()] if out.exists() else []
    errors_path = out.with_name(f"{out.name}.errors.jsonl")
    errors = len(errors_path.read_text().splitlines()) if errors_path.exists() else 0
    if len(ids) != len(set(ids)):
        raise SystemExit(f"rows written twice: {len(ids) - len(set(ids))}")
    if proc.returncode not in (0, 1):
        raise SystemExit(f"lmpress batch failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    wall_s = float(match.group(1)) if match else wall
    return Run(wall_s, len(set(ids)), errors, proc.stderr)


def served_per_second(server: LLMServer) -> list[int]:
    """2xx answers in each second since the first request arrived."""
    start = server.stats.first_arrival or 0.0
    counts: list[int] = []
    for t, status in list(server.stats.replies):
        if 200 <= status < 300:
            second = int(t - start)
            counts.extend([0] * (second + 1 - len(counts)))
            counts[second] += 1
    return counts


def case_random(tmp: Path, rows: int, workers: int, latency: float) -> None:
    path = tmp / "random.jsonl"
    write_rows(path, rows)
    faults = Faults(
        latency_s=latency, transient_rate=0.35, transient_kinds=RANDOM_KINDS, retry_after="0.2"
    )
    figures = {}
    for name, f in (("fault-free", Faults(latency_s=latency)), ("random faults", faults)):
        with LLMServer(f) as server:
            run = run_batch(server, path, tmp / f"random-{name}.out.jsonl", rows, workers)
            statuses = dict(server.stats.statuses)
        figures[name] = rows / run.wall_s
        print(f"  {name:13} {rows} rows in {run.wall_s:6.2f} s: {figures[name]:6.1f} rows/s; "
              f"written {run.rows_written}, failed {run.errors}; server answers {statuses}",
              flush=True)  # fmt: skip
        assert run.rows_written == rows and run.errors == 0, run.stderr[-2000:]
    ratio = figures["random faults"] / figures["fault-free"]
    ideal = workers / latency
    print(f"  -> {ratio:.3f} of the fault-free throughput (target >= 0.6); fault-free is "
          f"{figures['fault-free'] / ideal:.3f} of the ideal {ideal:.0f} rows/s")  # fmt: skip


def case_limit(tmp: Path, rows: int, workers: int, latency: float, per_minute: int) -> None:
    path = tmp / "limit.jsonl"
    write_rows(path, rows)
    limit = per_minute / 60
    for retry_after in (True, False):
        faults = Faults(latency_s=latency, rate_limit_rps=limit, rate_limit_retry_after=retry_after)
        with LLMServer(faults) as server:
            run = run_batch(server, path, tmp / f"limit-{retry_after}.out.jsonl", rows, workers)
            served = served_per_second(server)
            rejected = server.stats.statuses[429]
        half = len(served) // 2
        settled = statistics.mean(served[half:-1]) if len(served) > 3 else float("nan")
        overall = rows / run.wall_s
        label = "with Retry-After" if retry_after else "without Retry-After"
        print(f"  {label:19} {rows} rows in {run.wall_s:6.1f} s: {overall:5.2f} rows/s overall "
              f"({overall / limit:.3f} of the limit), settled {settled:5.2f}/s ({settled / limit:.3f}"
              f"); 429s {rejected} ({rejected / (rejected + rows):.1%} of answers); written "
              f"{run.rows_written}, failed {run.errors}", flush=True)  # fmt: skip
        assert run.rows_written == rows and run.errors == 0, run.stderr[-2000:]


def case_burst(
    tmp: Path, rows: int, workers: int, latency: float, burst_at: float, burst_s: float
) -> None:
    path = tmp / "burst.jsonl"
    write_rows(path, rows)
    for status, retry_after in ((529, None), (503, "1")):
        faults = Faults(
            latency_s=latency, burst=(burst_at, burst_s), overload_status=status,
            overload_retry_after=retry_after,
        )  # fmt: skip
        with LLMServer(faults) as server:
            run = run_batch(server, path, tmp / f"burst-{status}.out.jsonl", rows, workers)
            served = served_per_second(server)
            refused = server.stats.statuses[status]
        end = int(burst_at + burst_s)
        before = statistics.mean(served[1 : int(burst_at)])
        back = next(
            (s - (burst_at + burst_s) for s in range(end, len(served) - 1)
             if all(x >= 0.9 * before for x in served[s : s + 2])),
            None,
        )  # fmt: skip
        label = f"{status}" + (f" Retry-After {retry_after}" if retry_after else " no Retry-After")
        during = statistics.mean(served[int(burst_at) + 1 : end]) if end > burst_at + 1 else 0
        after = served[end : end + 12]
        print(f"  {label:22} before {before:5.1f}/s, during {during:5.1f}/s, per second after: "
              f"{after}; back to 0.9 of before {back if back is None else f'{back:.1f}'} s after"
              f" the burst (target <= 10 s); {refused} refused; written {run.rows_written}, "
              f"failed {run.errors}", flush=True)  # fmt: skip
        assert run.rows_written == rows and run.errors == 0, run.stderr[-2000:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--case", choices=("random", "limit", "burst"), action="append")
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--latency", type=float, default=0.05)
    parser.add_argument("--random-rows", type=int, default=3000)
    parser.add_argument("--limit-rows", type=int, default=300)
    parser.add_argument("--limit", type=int, default=600, help="requests a minute")
    parser.add_argument("--burst-rows", type=int, default=6000)
    parser.add_argument("--burst-at", type=float, default=6.0)
    parser.add_argument("--burst-s", type=float, default=5.0)
    args = parser.parse_args()
    cases = args.case or ["random", "limit", "burst"]
    common = f"num_workers={args.workers}, latency {args.latency}s"
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        if "random" in cases:
            print(f"random faults: {args.random_rows} rows, {common}")
            case_random(tmp, args.random_rows, args.workers, args.latency)
        if "limit" in cases:
            print(f"rate limit {args.limit}/min: {args.limit_rows} rows, {common}")
            case_limit(tmp, args.limit_rows, args.workers, args.latency, args.limit)
        if "burst" in cases:
            print(f"burst of overload for {args.burst_s}s at {args.burst_at}s: "
                  f"{args.burst_rows} rows, {common}")  # fmt: skip
            case_burst(
                tmp, args.burst_rows, args.workers, args.latency, args.burst_at, args.burst_s
            )


if __name__ == "__main__":
    main()
