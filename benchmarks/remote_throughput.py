"""How close `lmpress batch` on a remote engine comes to keeping a server busy, and whether its
memory stays flat as the input grows.

    python benchmarks/remote_throughput.py            # both measurements
    python benchmarks/remote_throughput.py --quick    # 1,000 vs 10,000 rows for the memory part
    python benchmarks/remote_throughput.py --openai-batch --rounds 3   # OpenAI Batch vs plain
    python benchmarks/remote_throughput.py --against ../base --rounds 3  # another checkout vs this

1. Throughput: a test server that answers every request after 200 ms, 1,600 requests,
   num_workers=32. The ideal is num_workers / latency = 160 requests/s; the figure is the ratio
   achieved / ideal (target >= 0.9), measured over the server's busy window (first request in to
   last reply out) and over lmpress's own wall time (its summary, which includes connecting).
2. Memory: peak RSS of the `lmpress batch` process for 10,000 vs 100,000 input rows against the
   same server with no latency (target ratio <= 1.2). Each run is a fresh process; its peak RSS
   comes from os.wait4, so nothing else is counted.
3. With --openai-batch: the same requests as OpenAI Batch lines (custom_id, url, body with
   messages and max_tokens, so every row carries generation overrides and gets OpenAI Batch
   output lines) against plain {"id", "prompt"} rows, each side a fresh process against the
   same server, the sides alternating over --rounds. It prints OpenAI Batch throughput as a
   ratio of plain-row throughput (target >= 0.95) per round and their median, from lmpress's
   own wall time. --latency 0 takes the server's wait away, so lmpress's own per-row work is
   all that is timed.
4. With --against CHECKOUT: the memory run (--rows rows, 100,000 by default, no latency) of
   another lmpress checkout against this one, each side a fresh process with its own tree on
   PYTHONPATH and the same interpreter, alternating over --rounds. It prints each run's wall
   time, CPU time and peak RSS, then each side's medians and the ratios this / other.

The server runs in this process on a thread; lmpress runs as the real CLI in a child process.
"""

from __future__ import annotations

import argparse
import json
import os
import re
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

from tests.servers.llm_server import Faults, LLMServer  # noqa: E402

LATENCY_S = 0.2
WORKERS = 32
REQUESTS = 1600


def uncached(env: dict[str, str]) -> dict[str, str]:
    """`env` for an `lmpress batch` child whose run must send every row: a response cache of its
    own, empty, removed at exit (lmpress's own cache, on by default in a batch, would answer a
    rerun of the same rows without a request; a checkout from before the cache ignores it)."""
    import atexit

    where = tempfile.mkdtemp(prefix="lmpress-bench-cache-")
    atexit.register(shutil.rmtree, where, True)
    return {**env, "LMPRESS_RESPONSE_CACHE": where}


def write_rows(path: Path, count: int, openai_batch: bool = False) -> None:
    with path.open("w") as out:
        for i in range(count):
            question = f"Question number {i}: why?"
            row = {"id": f"row-{i}", "prompt": question}
            if openai_batch:  # what the OpenAI Batch API and vllm run-batch read
                messages = [{"role": "user", "content": question}]
                body = {"model": "bench", "messages": messages, "max_tokens": 16}
                row = {"custom_id": f"row-{i}", "method": "POST", "url": "/v1/chat/completions",
                       "body": body}  # fmt: skip
            out.write(json.dumps(row) + "\n")


class BatchRun(NamedTuple):
    wall_s: float
    rss_kib: int  # peak RSS
    cpu_s: float  # user and system time: on a shared machine, steadier than wall time
    stderr: str


def run_batch(
    server: LLMServer,
    rows: Path,
    out: Path,
    workers: int,
    repo: Path = REPO,
    extra: list[str] | None = None,
) -> BatchRun:
    """Run the real CLI of the checkout at `repo` and time it."""
    cmd = [
        sys.executable, "-m", "lmpress", "batch", "--engine", "REMOTE",
        "--remote_params.api_url", server.openai_url,
        "--remote_params.num_workers", str(workers),
        "--model.model_name", "bench", "--generation.max_new_tokens", "16",
        "-i", str(rows), "-o", str(out), *(extra or []),
    ]  # fmt: skip
    env = uncached({**os.environ, "PYTHONPATH": str(repo)})
    with tempfile.TemporaryFile("w+") as err:
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env, cwd=repo)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - started
        err.seek(0)
        stderr = err.read()
    if proc.returncode != 0:
        raise SystemExit(f"lmpress batch failed ({proc.returncode}):\n{stderr[-3000:]}")
    return BatchRun(wall, usage.ru_maxrss, usage.ru_utime + usage.ru_stime, stderr)


def summary_wall(stderr: str) -> float | None:
    match = re.search(r"wall time\s*│\s*([\d.]+) s", stderr)
    return float(match.group(1)) if match else None


def throughput(tmp: Path) -> dict[str, float]:
    rows, out = tmp / "tp.jsonl", tmp / "tp.out.jsonl"
    write_rows(rows, REQUESTS)
    with LLMServer(Faults(latency_s=LATENCY_S)) as server:
        run = run_batch(server, rows, out, WORKERS)
        wall, stderr = run.wall_s, run.stderr
        s = server.stats
        assert s.completed == REQUESTS, s.statuses
        window = s.last_done - s.first_arrival
        max_in_flight = s.max_in_flight
    ideal = WORKERS / LATENCY_S
    lmpress_wall = summary_wall(stderr)
    return {
        "ideal_rps": ideal,
        "server_window_s": window,
        "ratio_server_window": REQUESTS / window / ideal,
        "lmpress_wall_s": lmpress_wall or float("nan"),
        "ratio_lmpress_wall": REQUESTS / lmpress_wall / ideal if lmpress_wall else float("nan"),
        "process_wall_s": wall,
        "max_in_flight": max_in_flight,
    }


def openai_batch_ratio(tmp: Path, rounds: int, latency: float) -> list[tuple[float, float]]:
    """(plain rows/s, OpenAI Batch rows/s) per round, by lmpress's summary wall time."""
    inputs = {}
    for kind in ("plain", "openai"):
        inputs[kind] = tmp / f"{kind}.jsonl"
        write_rows(inputs[kind], REQUESTS, openai_batch=kind == "openai")
    figures = []
    with LLMServer(Faults(latency_s=latency)) as server:
        for r in range(rounds):
            rates = {}
            order = ("plain", "openai") if r % 2 == 0 else ("openai", "plain")
            for kind in order:
                out = tmp / f"{kind}.out.jsonl"
                stderr = run_batch(server, inputs[kind], out, WORKERS).stderr
                wall = summary_wall(stderr)
                assert wall, stderr[-2000:]
                rates[kind] = REQUESTS / wall
                out.unlink()
            figures.append((rates["plain"], rates["openai"]))
    return figures


def memory(tmp: Path, small: int, large: int) -> dict[str, float]:
    figures = {}
    with LLMServer(Faults()) as server:
        for count in (small, large):
            rows, out = tmp / f"mem{count}.jsonl", tmp / f"mem{count}.out.jsonl"
            write_rows(rows, count)
            run = run_batch(server, rows, out, WORKERS)
            figures[f"rss_mib_{count}"] = run.rss_kib / 1024
            figures[f"wall_s_{count}"] = run.wall_s
            rows.unlink()
            out.unlink()
    figures["rss_ratio"] = figures[f"rss_mib_{large}"] / figures[f"rss_mib_{small}"]
    return figures


def against(tmp: Path, other: Path, count: int, rounds: int) -> dict[str, list[BatchRun]]:
    """Each run of each side, "other" and "this"."""
    rows = tmp / "against.jsonl"
    write_rows(rows, count)
    sides = {"other": other, "this": REPO}
    runs: dict[str, list[BatchRun]] = {name: [] for name in sides}
    with LLMServer(Faults()) as server:
        for r in range(rounds):
            for name in list(sides) if r % 2 == 0 else list(reversed(sides)):
                out = tmp / f"{name}-{r}" / "out.jsonl"
                out.parent.mkdir()
                run = run_batch(server, rows, out, WORKERS, repo=sides[name])
                with out.open("rb") as written:
                    assert sum(1 for _ in written) == count, f"{name}: rows missing"
                runs[name].append(run)
                print(
                    f"  round {r + 1} {name:5} wall {run.wall_s:6.1f} s  CPU {run.cpu_s:6.1f} s  "
                    f"peak RSS {run.rss_kib / 1024:6.1f} MiB",
                    flush=True,
                )
                shutil.rmtree(out.parent)
    return runs


def report_against(runs: dict[str, list[BatchRun]]) -> None:
    figures = {"wall": "wall_s", "CPU": "cpu_s", "peak RSS": "rss_kib"}
    for label, field in figures.items():
        medians = {
            name: statistics.median(getattr(r, field) for r in rs) for name, rs in runs.items()
        }
        unit = ("MiB", 1024) if field == "rss_kib" else ("s", 1)
        per_round = [
            getattr(t, field) / getattr(o, field)
            for t, o in zip(runs["this"], runs["other"], strict=True)
        ]
        print(
            f"  {label:8} median other {medians['other'] / unit[1]:.1f} {unit[0]}, this "
            f"{medians['this'] / unit[1]:.1f} {unit[0]}: this / other "
            f"{medians['this'] / medians['other']:.3f} (per round "
            f"{', '.join(f'{x:.3f}' for x in per_round)})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="1,000 vs 10,000 rows for memory")
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument(
        "--openai-batch", action="store_true", help="only: OpenAI Batch input against plain rows"
    )
    parser.add_argument(
        "--against", type=Path, help="only: another lmpress checkout's memory run against this"
    )
    parser.add_argument("--rows", type=int, default=100_000, help="with --against")
    parser.add_argument("--rounds", type=int, default=3, help="with --openai-batch or --against")
    parser.add_argument("--latency", type=float, default=LATENCY_S, help="with --openai-batch")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        if args.openai_batch:
            figures = openai_batch_ratio(tmp, args.rounds, args.latency)
            ratios = [o / p for p, o in figures]
            print(f"OpenAI Batch input vs plain rows: {REQUESTS} requests, num_workers={WORKERS}, "
                  f"latency {args.latency}s, {args.rounds} rounds")  # fmt: skip
            for i, (p, o) in enumerate(figures, start=1):
                print(
                    f"  round {i}: plain {p:.1f} rows/s, OpenAI Batch {o:.1f} rows/s -> {o / p:.3f}"
                )
            print(f"  median ratio {statistics.median(ratios):.3f} (target >= 0.95)")
            return
        if args.against:
            print(f"{args.against} (other) against {REPO} (this): {args.rows:,} rows, no latency")
            report_against(against(tmp, args.against.resolve(), args.rows, args.rounds))
            return
        if not args.skip_throughput:
            t = throughput(tmp)
            print(f"throughput: {REQUESTS} requests, num_workers={WORKERS}, latency {LATENCY_S}s, "
                  f"ideal {t['ideal_rps']:.0f} req/s")  # fmt: skip
            print(f"  server busy window {t['server_window_s']:.2f}s -> ratio "
                  f"{t['ratio_server_window']:.3f} (target >= 0.9)")  # fmt: skip
            print(f"  lmpress wall time  {t['lmpress_wall_s']:.2f}s -> ratio "
                  f"{t['ratio_lmpress_wall']:.3f}")  # fmt: skip
            print(f"  whole process {t['process_wall_s']:.2f}s (with interpreter start and "
                  f"imports); server saw at most {t['max_in_flight']} in flight")  # fmt: skip
        if not args.skip_memory:
            small, large = (1_000, 10_000) if args.quick else (10_000, 100_000)
            m = memory(tmp, small, large)
            print(f"memory: peak RSS of lmpress batch, {small:,} rows {m[f'rss_mib_{small}']:.1f} "
                  f"MiB ({m[f'wall_s_{small}']:.0f}s), {large:,} rows "
                  f"{m[f'rss_mib_{large}']:.1f} MiB ({m[f'wall_s_{large}']:.0f}s) -> ratio "
                  f"{m['rss_ratio']:.3f} (target <= 1.2)")  # fmt: skip


if __name__ == "__main__":
    main()
