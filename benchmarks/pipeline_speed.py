"""Issue 53's figures: a four-step pipeline (topics -> 10 questions each -> answers -> a judge's
score -> keep the good ones) as `lmpress run` against Bespoke Curator running the same steps one
after another, and the pipeline against its slowest step run alone.

    python benchmarks/pipeline_speed.py [--topics 200] [--latency 0.2] [--workers 32] [--repeats 3]
        [--shared] [--checkout PATH]

The loopback OpenAI server (tests/servers/llm_server.py) runs in this process and answers every
request after --latency seconds, each step's prompt in the shape that step reads (`answer`), so
the run is latency-bound: what it measures is how each side keeps requests in flight, not the
2 cores' speed. Each side is a process of its own, timed end to end (start-up included):

- Curator: benchmarks/pipeline_curator.py with .venv-curator's Python (made here on first use:
  `bespokelabs-curator` pinned, from the package index), each step a `curator.LLM` subclass,
  `max_concurrent_requests` = --workers, its rate limits set out of the way, its cache in a
  fresh directory each run;
- lmpress: `lmpress run benchmarks/pipeline_speed.yaml --cache off` (from --checkout, by
  default this one), and each of its steps again alone (a one-step pipeline over the rows the
  step got in the whole run, kept with --keep-steps).

Both sides hold --workers requests in flight per step: Curator runs one step at a time, lmpress
its steps at once (each step's `concurrency` = --workers, the one engine they share
`remote_params.num_workers` = --workers times the steps that call it). With --shared, lmpress's
whole pipeline holds --workers in flight (num_workers = --workers, the steps taking what the
engine gives them), as many as Curator at any moment. Printed: a table of wall times per repeat,
their medians, and the two ratios (issue 53's targets: Curator / lmpress >= 1.5; pipeline /
slowest step alone <= 1.2).
"""

from __future__ import annotations

import argparse
import hashlib
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

import yaml  # noqa: E402

from tests.servers.llm_server import Faults, LLMServer  # noqa: E402

PIPELINE = REPO / "benchmarks" / "pipeline_speed.yaml"
CURATOR_SCRIPT = REPO / "benchmarks" / "pipeline_curator.py"
CURATOR_VENV = REPO / ".venv-curator"
CURATOR_PIN = "bespokelabs-curator==0.1.31"
QUESTIONS = re.compile(r"Write 10 questions about (.+?)\. Reply")
ANSWERED = re.compile(r"Answer-([0-9a-f]{8})")


def answer(last_user: str) -> str:
    """The server's reply to each step's prompt, deterministic and cheap: the questions as a
    JSON list of 10, an answer as text carrying a digest of its question, and a judge's JSON
    whose score comes from the answer's digest, so both sides keep the same rows whatever the
    judge's own wording."""
    judged = ANSWERED.search(last_user)
    if judged:
        score = int(judged.group(1), 16) % 10 + 1
        return json.dumps({"explanation": f"Score: {score}, by the digest.", "score": score})
    asked = QUESTIONS.search(last_user)
    if asked:
        topic = asked.group(1)
        questions = [f"Question {j} on {topic}: what matters most?" for j in range(10)]
        return json.dumps({"question": questions})
    digest = hashlib.sha256(last_user.encode("utf-8")).hexdigest()[:8]
    return f"Answer-{digest}: the short answer to {last_user[-60:]!r}."


def write_topics(path: Path, count: int) -> None:
    with path.open("w") as out:
        for i in range(count):
            out.write(json.dumps({"topic": f"topic {i}"}) + "\n")


def ensure_curator() -> Path:
    """.venv-curator's Python, the environment made (and Curator installed) on first use."""
    python = CURATOR_VENV / "bin" / "python"
    if not python.exists():
        print(f"making {CURATOR_VENV} with {CURATOR_PIN} (once)", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(CURATOR_VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", CURATOR_PIN], check=True)
    return python


class Timed(NamedTuple):
    """One side's repeat: its pipeline's wall time, each step's seconds (Curator's inside its
    process; lmpress's each alone, a process of its own), rows kept, the server's peak in flight."""

    wall: float
    steps: dict[str, float]
    rows: int
    in_flight: int = 0


def curator_env(work: Path) -> dict[str, str]:
    """The environment a Curator process runs in: a fresh cache under `work` (every run does
    the work), nothing fetched from the network, a key the loopback server takes."""
    return {
        **os.environ,
        "CURATOR_CACHE_DIR": str(work / "cache"),
        "CURATOR_DISABLE_CACHE": "true",
        "HF_DATASETS_CACHE": str(work / "hf"),
        "HF_HUB_OFFLINE": "1",
        "TELEMETRY_ENABLED": "false",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # litellm would fetch its price list
        "OPENAI_API_KEY": "bench",
    }


def run_curator(python: Path, server: LLMServer, topics: Path, workers: int) -> Timed:
    """Curator's whole process, timed end to end, with the step times it printed."""
    work = Path(tempfile.mkdtemp(prefix="lmpress-curator-"))
    env = curator_env(work)
    cmd = [str(python), str(CURATOR_SCRIPT), "--base-url", server.openai_url,
           "--input", str(topics), "--workers", str(workers), "--out", str(work / "out")]  # fmt: skip
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=work)
    wall = time.perf_counter() - started
    shutil.rmtree(work, ignore_errors=True)
    if proc.returncode != 0:
        raise SystemExit(f"the Curator side failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    said = json.loads(proc.stdout.strip().splitlines()[-1])
    steps = {name: step["seconds"] for name, step in said["steps"].items()}
    return Timed(wall, steps, said["rows"])


class Lmpress(NamedTuple):
    """How the lmpress side runs: which checkout, how many in flight, shared or per step."""

    checkout: Path
    url: str
    workers: int
    shared: bool

    def has_run(self) -> bool:
        """Whether the checkout's CLI has `lmpress run` yet (issue 53's command)."""
        probe = subprocess.run([sys.executable, "-m", "lmpress", "run", "--help"],
                               cwd=self.checkout, capture_output=True, env=self.env())  # fmt: skip
        return probe.returncode == 0

    def env(self) -> dict[str, str]:
        return {**os.environ, "PYTHONPATH": str(self.checkout)}

    def pipeline(self, where: Path, only: str | None = None) -> Path:
        """pipeline_speed.yaml pointed at the server with the concurrency asked for; `only`:
        that step alone."""
        spec = yaml.safe_load(PIPELINE.read_text())
        calling = [step for step in spec["steps"] if "model" in step]
        for step in calling:
            step.pop("concurrency", None)
            if not self.shared:
                step["concurrency"] = self.workers
        for model in spec["models"].values():
            model["api_url"] = self.url
            workers = self.workers if self.shared else self.workers * len(calling)
            model.setdefault("overrides", {})["remote_params.num_workers"] = workers
        if only is not None:
            spec["steps"] = [step for step in spec["steps"] if step["name"] == only]
        path = where / f"pipeline-{only or 'all'}.yaml"
        path.write_text(yaml.safe_dump(spec, sort_keys=False))
        return path

    def run(self, pipeline: Path, rows: Path, out: Path, keep_steps: bool = False) -> float:
        """`lmpress run` in a process of its own, the response cache off (every request goes
        to the server, as Curator's cache is off); its wall time."""
        shutil.rmtree(out, ignore_errors=True)
        cmd = [sys.executable, "-m", "lmpress", "run", str(pipeline), "-i", str(rows), "-o",
               str(out), "--cache", "off", *(["--keep-steps"] if keep_steps else [])]  # fmt: skip
        started = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, env=self.env(),
                              cwd=self.checkout)  # fmt: skip
        wall = time.perf_counter() - started
        if proc.returncode != 0:
            raise SystemExit(f"lmpress run failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        return wall


def count_rows(path: Path) -> int:
    with path.open() as rows:
        return sum(1 for line in rows if line.strip())


def step_names() -> list[str]:
    return [step["name"] for step in yaml.safe_load(PIPELINE.read_text())["steps"]]


def lmpress_repeat(side: Lmpress, tmp: Path, topics: Path) -> Timed:
    """One repeat of the lmpress side: the whole pipeline, then each step alone on the rows
    that step got in the whole run."""
    whole = tmp / "lmpress-all"
    wall = side.run(side.pipeline(tmp), topics, whole, keep_steps=True)
    alone, rows = {}, topics
    for name in step_names():
        alone[name] = side.run(side.pipeline(tmp, only=name), rows, tmp / f"lmpress-{name}")
        rows = whole / "steps" / f"{name}.jsonl"  # what the next step got
    return Timed(wall, alone, count_rows(whole / "dataset.jsonl"))


def measure(args: argparse.Namespace, server: LLMServer, tmp: Path) -> tuple[list, list]:
    """The repeats, Curator then lmpress each time: (Curator's, lmpress's), lmpress's empty
    when the checkout has no `lmpress run`."""
    python = ensure_curator()
    topics = tmp / "topics.jsonl"
    write_topics(topics, args.topics)
    side = Lmpress(args.checkout.resolve(), server.openai_url, args.workers, args.shared)
    has_run = side.has_run()
    if not has_run:
        print(f"{side.checkout} has no `lmpress run` yet: the Curator side only", flush=True)
    curator: list[Timed] = []
    lmpress: list[Timed] = []
    for i in range(args.repeats):
        server.reset()
        run = run_curator(python, server, topics, args.workers)
        curator.append(run._replace(in_flight=server.stats.max_in_flight))
        print(f"repeat {i + 1}: Curator {run.wall:.2f} s ({_seconds(run.steps)})", flush=True)
        if has_run:
            server.reset()
            run = lmpress_repeat(side, tmp, topics)
            lmpress.append(run._replace(in_flight=server.stats.max_in_flight))
            print(f"repeat {i + 1}: lmpress {run.wall:.2f} s (alone: {_seconds(run.steps)})",
                  flush=True)  # fmt: skip
    return curator, lmpress


def _seconds(steps: dict[str, float]) -> str:
    return ", ".join(f"{name} {seconds:.2f} s" for name, seconds in steps.items())


def report(curator: list[Timed], lmpress: list[Timed]) -> None:
    print("\nwall seconds (each side a process of its own, start-up included):")
    head = [f"{'repeat':>6}", f"{'Curator':>8}"]
    if lmpress:
        head += [f"{'lmpress':>8}", *(f"{name + ' alone':>15}" for name in step_names())]
    print("  ".join(head))
    for i, run in enumerate(curator):
        line = f"{i + 1:>6}  {run.wall:8.2f}"
        if lmpress:
            line += f"  {lmpress[i].wall:8.2f}  " + "  ".join(
                f"{seconds:15.2f}" for seconds in lmpress[i].steps.values())  # fmt: skip
        print(line)
    print("Curator's steps inside its process, medians: " + _seconds(
        {name: statistics.median(run.steps[name] for run in curator) for name in curator[0].steps}
    ))  # fmt: skip
    curator_wall = _summary("Curator", curator)
    if not lmpress:
        return
    pipeline = _summary("lmpress", lmpress)
    alone = {name: statistics.median(run.steps[name] for run in lmpress) for name in step_names()}
    slowest = max(alone, key=alone.__getitem__)
    print(f"Curator / lmpress: {curator_wall / pipeline:.2f}x (target >= 1.5)")
    print(f"lmpress pipeline / its slowest step alone ({slowest}, {alone[slowest]:.2f} s): "
          f"{pipeline / alone[slowest]:.2f} (target <= 1.2)")  # fmt: skip


def _summary(side: str, runs: list[Timed]) -> float:
    """Print a side's median wall time, rows kept and peak in flight; return the median."""
    wall = statistics.median(run.wall for run in runs)
    print(f"{side}, median: {wall:.2f} s, {runs[0].rows} rows kept, at most "
          f"{max(run.in_flight for run in runs)} requests in flight")  # fmt: skip
    return wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topics", type=int, default=200)
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--workers", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--shared",
        action="store_true",
        help="lmpress's steps share --workers in flight (default: each step)",
    )
    parser.add_argument(
        "--checkout",
        type=Path,
        default=REPO,
        help="the lmpress tree whose `lmpress run` is timed (default: this one)",
    )
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="lmpress-pipeline-bench-"))
    try:
        with LLMServer(Faults(latency_s=args.latency, answer=answer)) as server:
            curator, lmpress = measure(args, server, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    held = "in all, lmpress's steps sharing them" if args.shared else "per step"
    print(f"\n{args.topics} topics, {args.latency:g} s latency, {args.workers} requests in "
          f"flight {held}, {args.repeats} repeats")  # fmt: skip
    report(curator, lmpress)


if __name__ == "__main__":
    main()
