"""How fast lmpress reads and writes JSONL, against another checkout of lmpress.

    python benchmarks/jsonl_throughput.py --against ../base --rounds 5

A batch job reads its input twice (a scan, then the run) and writes one output line per row,
flushed; a resumed job reads its output once. Each round times, in a fresh process per side
(that checkout on PYTHONPATH, the same interpreter), three passes over --rows rows: reading
input rows ({"id", "prompt"}), writing output rows shaped like `lmpress batch`'s with
`JsonlWriter`, and reading those back. The sides alternate; it prints each side's median and
the ratio this / other, per pass and for the three together.
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
PASSES = ("read input", "write output", "read output")


def output_row(i: int) -> dict:
    reply = "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor"
    question = f"Question number {i}: why?"
    return {
        "id": f"row-{i}",
        "messages": [
            {"role": "user", "content": question},
            {"role": "assistant", "content": reply},
        ],
        "response": {
            "text": reply,
            "finish_reason": "length",
            "usage": {"prompt_tokens": 12, "completion_tokens": 16, "total_tokens": 28},
            "model": "bench",
            "engine": "REMOTE",
            "latency_s": 0.0123,
        },
    }


def time_passes(workdir: Path, count: int) -> dict[str, float]:
    """In the child: the seconds each pass takes with the lmpress found on sys.path."""
    from lmpress.data import jsonl
    from lmpress.data.jsonl import JsonlWriter, read_lines

    print(jsonl.__file__, file=sys.stderr)

    rows = [output_row(i) for i in range(count)]
    out = workdir / "out.jsonl"
    seconds = {}
    started = time.perf_counter()
    assert sum(1 for line in read_lines(workdir / "in.jsonl") if not line.error) == count
    seconds["read input"] = time.perf_counter() - started
    started = time.perf_counter()
    with JsonlWriter(out) as writer:
        for row in rows:
            writer.write(row)
    seconds["write output"] = time.perf_counter() - started
    started = time.perf_counter()
    assert sum(1 for line in read_lines(out) if not line.error) == count
    seconds["read output"] = time.perf_counter() - started
    out.unlink()
    return seconds


def run_side(checkout: Path, workdir: Path, count: int) -> dict[str, float]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", str(workdir), str(count)]
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    done = subprocess.run(cmd, env=env, cwd=checkout, capture_output=True, text=True, check=True)
    assert done.stderr.startswith(str(checkout)), f"lmpress not from {checkout}: {done.stderr}"
    return json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--against", type=Path, required=True, help="another lmpress checkout")
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    sides = {"other": args.against.resolve(), "this": REPO}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in sides}
    print(f"{sides['other']} (other) against {REPO} (this): {args.rows:,} rows")
    with tempfile.TemporaryDirectory() as name:
        workdir = Path(name)
        with (workdir / "in.jsonl").open("w", encoding="utf-8") as rows:
            for i in range(args.rows):
                rows.write(json.dumps({"id": f"row-{i}", "prompt": f"Question {i}: why?"}) + "\n")
        for r in range(args.rounds):
            for side in list(sides) if r % 2 == 0 else list(reversed(sides)):
                seconds = run_side(sides[side], workdir, args.rows)
                seconds["total"] = sum(seconds.values())
                runs[side].append(seconds)
                shown = "  ".join(f"{p} {seconds[p]:.3f}s" for p in (*PASSES, "total"))
                print(f"  round {r + 1} {side:5} {shown}", flush=True)
    for p in (*PASSES, "total"):
        medians = {side: statistics.median(s[p] for s in runs[side]) for side in sides}
        print(
            f"  {p:12} median other {medians['other']:.3f}s, this {medians['this']:.3f}s: "
            f"this / other {medians['this'] / medians['other']:.3f}"
        )


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        print(json.dumps(time_passes(Path(sys.argv[2]), int(sys.argv[3]))))
    else:
        main()
