"""Peak memory of an embedding batch job at 10x the rows: `lmpress batch --task embed` on MiniLM
(NATIVE), the same command on `--rows` rows and on 10x as many, each in a process of its own.

Rows stream in and out, so the peak should not grow with the input: the ratio of the two peaks
(the larger run's over the smaller's) is the figure, target <= 1.1. The texts are short and
alike (8 to 24 words), since what is measured is what a row costs the job, not the model's
activations on long texts.

    .venv/bin/python benchmarks/embed_memory.py [--rows 10000]

The peak is the kernel's own account of the child's maximum resident set (`os.wait4`).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rounds import WORDS

REPO = Path(__file__).resolve().parent.parent


def write_rows(path: Path, count: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    with path.open("w", encoding="utf-8") as out:
        for i in range(count):
            text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 24)))
            out.write(json.dumps({"id": str(i), "input": text}) + "\n")


def peak_of_job(rows: int, workdir: Path) -> tuple[float, float]:
    """(peak RSS in MiB, wall seconds) of one `lmpress batch --task embed` over `rows` rows."""
    src, out = workdir / f"in-{rows}.jsonl", workdir / f"out-{rows}.jsonl"
    write_rows(src, rows)
    command = [
        sys.executable, "-m", "lmpress", "batch", "-i", str(src), "-o", str(out), "--overwrite",
        "--engine", "NATIVE", "--model.model_name", "minilm", "--task", "embed",
        "--generation.batch_size", "32",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    started = time.perf_counter()
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    if status != 0:
        raise SystemExit(f"the {rows}-row job failed: {proc.stderr.read().decode()[-2000:]}")
    written = sum(1 for _ in out.open("rb"))
    assert written == rows, f"{written} rows written of {rows}"
    return usage.ru_maxrss / 1024, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000, help="the smaller job's rows")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        small, small_s = peak_of_job(args.rows, Path(tmp))
        large, large_s = peak_of_job(args.rows * 10, Path(tmp))
    print(f"{args.rows:>9,} rows: peak {small:7.1f} MiB, {small_s:6.1f} s")
    print(f"{args.rows * 10:>9,} rows: peak {large:7.1f} MiB, {large_s:6.1f} s")
    print(f"peak ratio (10x rows / 1x): {large / small:.3f}")


if __name__ == "__main__":
    main()
