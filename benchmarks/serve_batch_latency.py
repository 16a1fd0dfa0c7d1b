"""Interactive latency of `lmpress serve` while a batch runs on it (/v1/batches).

One server (NATIVE on a random-weight model of SmolLM2-135M's shape, greedy) with a state
directory. Streamed chat requests from the official AsyncOpenAI client, `--clients` at a time,
each timed from the request sent to its first content token (time to first token):

1. idle: no batch;
2. batch: while a batch of `--batch-lines` lines runs on the same engine (submitted through
   files.create + batches.create, measured once it is in_progress).

Prints p50 and p95 of each, and how many batch lines were done meanwhile (a batch that ended
before the measurement did is said: raise --batch-lines). A batch keeps at most a quarter of
the engine's in-flight requests (half of NATIVE's `generation.batch_size`) at the engine, so
an interactive request finds a free slot. Run by hand:

    python benchmarks/serve_batch_latency.py                # 64 requests each, 4 at a time
    python benchmarks/serve_batch_latency.py --requests 200 --batch-lines 2000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import serve_throughput

REPO = Path(__file__).resolve().parent.parent
MODEL = "served"


def start_server(settings: list[str]) -> tuple[subprocess.Popen, str]:
    proc, url, _ = serve_throughput.start_server(settings)
    return proc, url


async def first_token_s(client, i: int, max_tokens: int) -> float:
    started = time.perf_counter()
    stream = await client.chat.completions.create(
        model=MODEL, stream=True, max_tokens=max_tokens, temperature=0,
        messages=[{"role": "user", "content": f"Question {i}: say something about the sea."}],
    )  # fmt: skip
    first = None
    async for chunk in stream:
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.perf_counter() - started
    return first if first is not None else time.perf_counter() - started


async def measure(client, requests: int, clients: int, max_tokens: int) -> list[float]:
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(requests):
        queue.put_nowait(i)
    times: list[float] = []

    async def worker() -> None:
        while not queue.empty():
            times.append(await first_token_s(client, queue.get_nowait(), max_tokens))

    await asyncio.gather(*(worker() for _ in range(clients)))
    return times


def percentiles(times: list[float]) -> str:
    cuts = statistics.quantiles(times, n=100, method="inclusive")
    return f"p50 {cuts[49] * 1000:7.1f} ms   p95 {cuts[94] * 1000:7.1f} ms   (n={len(times)})"


async def run(url: str, args, workdir: Path) -> None:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    await measure(client, 4, 1, args.max_new_tokens)  # warm up
    idle = await measure(client, args.requests, args.clients, args.max_new_tokens)
    print(f"idle:          {percentiles(idle)}", flush=True)

    lines = workdir / "batch.jsonl"
    with lines.open("w") as f:
        for i in range(args.batch_lines):
            body = {"model": MODEL, "max_tokens": args.max_new_tokens, "temperature": 0,
                    "messages": [{"role": "user", "content": f"Batch line {i}: tell a story."}]}  # fmt: skip
            f.write(json.dumps({"custom_id": f"line-{i}", "method": "POST",
                                "url": "/v1/chat/completions", "body": body}) + "\n")  # fmt: skip
    upload = await client.files.create(file=lines, purpose="batch")
    batch = await client.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    while (batch := await client.batches.retrieve(batch.id)).status == "validating":
        await asyncio.sleep(0.1)
    busy = await measure(client, args.requests, args.clients, args.max_new_tokens)
    batch = await client.batches.retrieve(batch.id)
    print(f"batch running: {percentiles(busy)}", flush=True)
    counts = batch.request_counts
    done = counts.completed if counts else 0
    print(f"batch lines done meanwhile: {done} of {args.batch_lines} ({batch.status})")
    if batch.status != "in_progress":
        print("the batch ended before the measurement did: raise --batch-lines")
    await client.batches.cancel(batch.id)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny:smollm2-135m-shape")
    parser.add_argument("--requests", type=int, default=64, help="interactive requests, each phase")
    parser.add_argument("--clients", type=int, default=4, help="interactive requests at a time")
    parser.add_argument("--batch-lines", type=int, default=1000)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=8)
    args = parser.parse_args()
    # Build the tiny model first (it trains a 49k-vocab tokenizer), outside any timing.
    subprocess.run([sys.executable, "-m", "lmpress.builtin_models.tiny", args.model.removeprefix("tiny:")],
                   check=True, capture_output=True, env={**os.environ, "PYTHONPATH": str(REPO)})  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        settings = [
            "--engine", "NATIVE", "--model.model_name", args.model,
            "--serve.served_model_name", MODEL, "--generation.batch_size", str(args.batch_size),
            "--state-dir", str(Path(tmp) / "state"),
        ]  # fmt: skip
        print(f"NATIVE on {args.model}, batch_size={args.batch_size}, greedy, "
              f"max_new_tokens={args.max_new_tokens}, {args.clients} interactive at a time")  # fmt: skip
        proc, url = start_server(settings)
        try:
            asyncio.run(run(url, args, Path(tmp)))
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    return 0


if __name__ == "__main__":
    sys.exit(main())
