"""Whether `lmpress batch --models A,B` runs two remote models side by side: the same rows
through two models on one test server, as one --models job against two jobs of one model each
run one after another.

    python benchmarks/models_side_by_side.py             # 64 rows, 100 ms a reply, 4 workers
    python benchmarks/models_side_by_side.py --rows 256 --rounds 3

Each side is a fresh `lmpress batch` process against the same server (it runs in this process
on a thread), with the response cache off. The figure is the two single-model jobs' wall time
(their summaries' wall_s, summed) over the --models job's (its summary's wall_s); side by side
makes it close to 2, one after another to 1. Process start-up is left out of both sides.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.servers.llm_server import Faults, LLMServer  # noqa: E402


def batch_wall(folder: Path, *args: str) -> float:
    """Run `lmpress batch` with `args`; its summary's wall_s (the last -o's)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "lmpress", "batch", *args, "--cache", "off", "--overwrite"]
    run = subprocess.run(command, env=env, capture_output=True, text=True, cwd=folder)
    if run.returncode != 0:
        raise SystemExit(run.stderr)
    out = args[args.index("-o") + 1]
    return json.loads((folder / f"{out}.summary.json").read_text())["wall_s"]


def one_round(folder: Path, recipes: list[str]) -> float:
    apart = sum(
        batch_wall(folder, "-c", recipe, "-i", "in.jsonl", "-o", f"alone-{i}.jsonl")
        for i, recipe in enumerate(recipes)
    )
    together = batch_wall(
        folder, "--models", ",".join(recipes), "-i", "in.jsonl", "-o", "both.jsonl"
    )
    print(f"one after another {apart:.2f} s, --models {together:.2f} s: {apart / together:.2f}x")
    return apart / together


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--latency", type=float, default=0.1, help="seconds a reply takes")
    parser.add_argument("--workers", type=int, default=4, help="num_workers of each model")
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, LLMServer(Faults(latency_s=args.latency)) as server:
        folder = Path(tmp)
        rows = (json.dumps({"id": f"q{i}", "prompt": f"Question {i}?"}) for i in range(args.rows))
        (folder / "in.jsonl").write_text("".join(row + "\n" for row in rows))
        recipes = []
        for name in ("first", "second"):
            (folder / f"{name}.yaml").write_text(
                f"engine: REMOTE\nmodel:\n  model_name: {name}-model\nremote_params:\n"
                f"  api_url: {server.openai_url}\n  num_workers: {args.workers}\n"
            )
            recipes.append(f"{name}.yaml")
        ratios = [one_round(folder, recipes) for _ in range(args.rounds)]
    print(f"median {statistics.median(ratios):.2f}x (two remote models side by side)")


if __name__ == "__main__":
    main()
