"""Throughput of `lmpress serve` against the same engine's offline `lmpress batch`.

Both run the NATIVE engine on a random-weight model of SmolLM2-135M's shape with the same
generation settings (greedy, the same max_new_tokens and batch_size) over the same prompts:

1. `lmpress batch` over a JSONL file of the prompts: its completion tokens / its wall time.
2. `lmpress serve`, then 32 concurrent streaming clients (the official AsyncOpenAI client) that
   take the prompts from a shared queue: completion tokens / the time from the first request
   sent to the last stream ended.

The ratio (serve / batch) is what counts; both are measured in the same run, alternating over
a few rounds, and the median of the rounds' ratios is reported. Model loading is outside both
measurements. Run by hand:

    python benchmarks/serve_throughput.py                 # 4 rounds of 32 prompts, 32 tokens
    python benchmarks/serve_throughput.py --prompts 128 --max-new-tokens 64 --rounds 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from remote_throughput import uncached

REPO = Path(__file__).resolve().parent.parent
LISTENING = re.compile(r"listening on (http://\S+)/v1")
TOPICS = (
    "the sky", "rivers", "a quiet city", "the moon", "small birds", "old trees", "rain",
    "mountains", "the sea at night", "a red house", "bright stars", "the wind",
)  # fmt: skip


def prompts(count: int) -> list[str]:
    return [
        f"Question {i}: write a few sentences about {TOPICS[i % len(TOPICS)]} and why it matters."
        for i in range(count)
    ]


def lmpress(*args: str, **kwargs) -> subprocess.Popen:
    env = uncached(
        {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    )
    return subprocess.Popen([sys.executable, "-m", "lmpress", *args], env=env, **kwargs)


def run_batch(settings: list[str], texts: list[str], workdir: Path) -> tuple[int, float]:
    """(completion tokens, wall seconds) of `lmpress batch`, as its summary reports them."""
    source, out = workdir / "prompts.jsonl", workdir / "out.jsonl"
    with source.open("w") as f:
        for i, text in enumerate(texts):
            f.write(json.dumps({"id": i, "messages": [{"role": "user", "content": text}]}) + "\n")
    proc = lmpress("batch", *settings, "-i", str(source), "-o", str(out), stderr=subprocess.PIPE,
                   text=True)  # fmt: skip
    _, summary = proc.communicate()
    if proc.returncode != 0:
        sys.exit(f"lmpress batch failed:\n{summary}")
    wall = float(re.search(r"wall time\W+([\d.]+) s", summary).group(1))
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    tokens = sum(row["response"]["usage"]["completion_tokens"] for row in rows)
    return tokens, wall


def start_server(settings: list[str]) -> tuple[subprocess.Popen, str, list[str]]:
    proc = lmpress("serve", *settings, "--port", "0", stderr=subprocess.PIPE, text=True)
    log: list[str] = []
    found = threading.Event()

    def read() -> None:
        for line in proc.stderr:
            log.append(line)
            if LISTENING.search(line):
                found.set()

    threading.Thread(target=read, daemon=True).start()
    while not found.wait(0.5):
        if proc.poll() is not None:
            sys.exit("lmpress serve exited:\n" + "".join(log))
    url = next(LISTENING.search(line).group(1) for line in log if LISTENING.search(line))
    return proc, url, log


async def run_clients(url: str, model: str, texts: list[str], clients: int, max_tokens: int):
    """(completion tokens, wall seconds) for `clients` concurrent streaming clients."""
    from openai import AsyncOpenAI

    queue: asyncio.Queue[str] = asyncio.Queue()
    for text in texts:
        queue.put_nowait(text)
    tokens = 0

    async def client_loop(client: AsyncOpenAI) -> None:
        nonlocal tokens
        while not queue.empty():
            text = queue.get_nowait()
            stream = await client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": text}],
                max_tokens=max_tokens,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
            )
            async for chunk in stream:
                if chunk.usage is not None:
                    tokens += chunk.usage.completion_tokens

    # One client (connection pool) per simulated user, as separate programs would have.
    users = [
        AsyncOpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=3600)
        for _ in range(clients)
    ]
    started = time.perf_counter()
    await asyncio.gather(*(client_loop(user) for user in users))
    wall = time.perf_counter() - started
    for user in users:
        await user.close()
    return tokens, wall


def measure(what: str, settings: list[str], texts: list[str], args) -> tuple[int, float]:
    if what == "batch":
        with tempfile.TemporaryDirectory() as tmp:
            return run_batch(settings, texts, Path(tmp))
    proc, url, _ = start_server(settings)
    try:
        return asyncio.run(run_clients(url, args.model, texts, args.clients, args.max_new_tokens))
    finally:
        proc.terminate()
        proc.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny:smollm2-135m-shape")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=4, help="batch and serve, this many times")
    args = parser.parse_args()

    # Build the tiny model once, before either measurement (it trains a 49k-vocab tokenizer).
    subprocess.run([sys.executable, "-m", "lmpress.builtin_models.tiny", args.model.removeprefix("tiny:")],
                   check=True, capture_output=True, env={**os.environ, "PYTHONPATH": str(REPO)})  # fmt: skip
    settings = [
        "--engine", "NATIVE", "--model.model_name", args.model,
        "--generation.temperature", "0", "--generation.max_new_tokens", str(args.max_new_tokens),
        "--generation.batch_size", str(args.batch_size),
    ]  # fmt: skip
    texts = prompts(args.prompts)
    print(
        f"{args.prompts} prompts, max_new_tokens={args.max_new_tokens}, "
        f"batch_size={args.batch_size}, greedy, NATIVE on {args.model}",
        flush=True,
    )

    # The machine's load drifts (other jobs come and go), so the two alternate in short rounds,
    # in the order batch-serve, serve-batch, batch-serve...; each round gives a ratio.
    ratios = []
    totals = {"batch": [0, 0.0], "serve": [0, 0.0]}
    for round_ in range(1, args.rounds + 1):
        measured = {}
        for what in ("batch", "serve") if round_ % 2 else ("serve", "batch"):
            tokens, wall = measure(what, settings, texts, args)
            print(f"round {round_} lmpress {what}: {tokens} tokens in {wall:.2f} s = "
                  f"{tokens / wall:.2f} tok/s", flush=True)  # fmt: skip
            measured[what] = tokens / wall
            totals[what][0] += tokens
            totals[what][1] += wall
        ratios.append(measured["serve"] / measured["batch"])
        print(f"round {round_} ratio serve/batch = {ratios[-1]:.3f}", flush=True)
    batch_tps, serve_tps = (tokens / wall for tokens, wall in totals.values())
    print(
        f"all rounds: lmpress batch {batch_tps:.2f} tok/s, lmpress serve {serve_tps:.2f} tok/s "
        f"({args.clients} concurrent streaming clients); ratio of totals "
        f"{serve_tps / batch_tps:.3f}"
    )
    print(f"ratio serve/batch = {statistics.median(ratios):.3f} (median of {len(ratios)} rounds; "
          f"target >= 0.8)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
