"""What `lmpress batch --ray` costs over a local run: the same job on a remote engine against a
loopback test server, once locally and once on a local Ray with 2 replicas, in the same run.

    python benchmarks/ray_overhead.py [--rows 3200] [--latency 0.2] [--workers 32] [--rounds 3]

The server answers every request after --latency seconds, so the job is latency-bound: the time
it takes is lmpress's and Ray's overhead, not the 2 cores' speed. Both sides have the same
total concurrency (--workers; with --ray each replica gets half). Each side is the real CLI in
a process of its own, alternating local, ray, ray, local (ABBA) each round.

Printed per round and as medians:
- rows/s of each side over its whole process (Ray's start-up and the replicas' loading
  included), and the ratio ray / local;
- rows/s from the first row written to the end, and that ratio: what a long job pays once its
  replicas are up;
- Ray's start-up time (starting a local Ray, as lmpress reports it).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

from remote_throughput import REPO, uncached, write_rows

sys.path.insert(0, str(REPO))

from tests.servers.llm_server import Faults, LLMServer

RAY = [
    "--ray",
    "--ray.replicas",
    "2",
    "--ray.cpus_per_replica",
    "0.5",
    *os.environ.get("RAY_EXTRA", "").split(),
]


class Run(NamedTuple):
    wall_s: float  # the whole process
    first_s: float  # until the first row was in the output
    stderr: str

    def steady(self, rows: int) -> float:
        """rows/s from the first row written to the end: the rate once replicas are up."""
        return rows / max(self.wall_s - self.first_s, 1e-9)


def run_side(server: LLMServer, rows: Path, out: Path, workers: int, extra: list[str]) -> Run:
    """The real CLI in a process of its own, watching when its first row lands."""
    cmd = [
        sys.executable, "-m", "lmpress", "batch", "--engine", "REMOTE",
        "--remote_params.api_url", server.openai_url,
        "--remote_params.num_workers", str(workers),
        "--model.model_name", "bench", "--generation.max_new_tokens", "16",
        "-i", str(rows), "-o", str(out), "--overwrite", *extra,
    ]  # fmt: skip
    out.unlink(missing_ok=True)
    with tempfile.TemporaryFile("w+") as err:
        started = time.perf_counter()
        proc = subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=err, cwd=REPO,
            env=uncached({**os.environ, "PYTHONPATH": str(REPO)}),
        )  # fmt: skip
        first = None
        while proc.poll() is None:
            if first is None and out.exists() and out.stat().st_size:
                first = time.perf_counter() - started
            time.sleep(0.005)
        wall = time.perf_counter() - started
        err.seek(0)
        stderr = err.read()
    if proc.returncode != 0:
        raise SystemExit(f"lmpress batch failed ({proc.returncode}):\n{stderr[-3000:]}")
    return Run(wall, wall if first is None else first, stderr)


def ray_start_s(stderr: str) -> float:
    match = re.search(r"started Ray in ([\d.]+)s", stderr)
    if not match:
        raise SystemExit(f"no Ray start-up line in:\n{stderr[-2000:]}")
    return float(match.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=3200)
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--workers", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="lmpress-ray-bench-"))
    rows = tmp / "in.jsonl"
    write_rows(rows, args.rows)
    whole: dict[str, list[float]] = {"local": [], "ray": []}  # rows/s, by round
    steady: dict[str, list[float]] = {"local": [], "ray": []}
    starts: list[float] = []
    with LLMServer(Faults(latency_s=args.latency)) as server:
        for round_no in range(1, args.rounds + 1):
            runs: dict[str, list[Run]] = {"local": [], "ray": []}
            for side in ("local", "ray", "ray", "local"):
                extra = RAY if side == "ray" else []
                run = run_side(server, rows, tmp / f"{side}.jsonl", args.workers, extra)
                runs[side].append(run)
                if side == "ray":
                    starts.append(ray_start_s(run.stderr))
            for side, done in runs.items():
                whole[side].append(args.rows / statistics.mean(r.wall_s for r in done))
                steady[side].append(statistics.mean(r.steady(args.rows) for r in done))
            print(
                f"round {round_no}: whole run local {whole['local'][-1]:.0f} rows/s, "
                f"ray {whole['ray'][-1]:.0f} rows/s; from the first row written: local "
                f"{steady['local'][-1]:.0f} rows/s, ray {steady['ray'][-1]:.0f} rows/s",
                flush=True,
            )
    ideal = args.workers / args.latency

    def ratio(rates: dict[str, list[float]]) -> float:
        return statistics.median(a / b for a, b in zip(rates["ray"], rates["local"], strict=True))

    print(
        f"\n{args.rows} rows, {args.latency:g}s latency, {args.workers} in flight "
        f"(ideal {ideal:.0f} rows/s), {args.rounds} rounds, medians:\n"
        f"  ray (2 replicas) / local, whole run (processes timed end to end): "
        f"{ratio(whole):.2f}\n"
        f"  ray (2 replicas) / local, from the first row written:            "
        f"{ratio(steady):.2f}\n"
        f"  Ray start-up (a local Ray, as lmpress reports it): {statistics.median(starts):.1f} s"
    )


if __name__ == "__main__":
    main()
