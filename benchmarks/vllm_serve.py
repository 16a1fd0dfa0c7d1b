"""`lmpress serve --engine VLLM` against `vllm serve`, same model and engine arguments.

Both servers start the same way, each in a process of its own, on 127.0.0.1: the same model
directory (the one the VLLM engine loads for a lmpress model name), dtype, `enforce_eager`,
`max_num_seqs` and `max_model_len`, with `VLLM_CPU_KVCACHE_SPACE` set for both. Once a
server answers /v1/models, `--clients` concurrent streaming clients (the openai SDK's
AsyncOpenAI, one per simulated user, `stream=True`, `stream_options.include_usage`) take
vllm_check.py's chat conversations from a shared queue, greedy, `--max-tokens` each. A side's
throughput is the completion tokens its usage chunks report / the time from the first request
sent to the last stream ended; server start-up is outside it. The sides alternate (vLLM,
lmpress, lmpress, vLLM, ...), a server started afresh for each run, and the median of the
rounds' ratios is printed with the load average over the run.

Needs vLLM, so run it with the vLLM venv (it starts both servers with the same Python):

    VLLM_CPU_KVCACHE_SPACE=2 PYTHONPATH=$PWD .venv-vllm/bin/python benchmarks/vllm_serve.py \\
        [--model smollm2:135m-instruct] [--prompts 64] [--clients 32] [--max-tokens 256] \\
        [--rounds 2] [--dtype float32] [--no-eager] [--profile DIR]

`--profile DIR` runs lmpress's server only, under py-spy (if installed), writing a flame graph.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from vllm_check import conversations

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def server_command(side: str, args: argparse.Namespace, model_dir: str, port: int) -> list[str]:
    if side == "vllm":
        return [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir,
            "--served-model-name", "bench", "--host", "127.0.0.1", "--port", str(port),
            "--dtype", args.dtype, "--max-num-seqs", str(args.max_num_seqs),
            "--max-model-len", str(args.max_model_len),
            *(["--enforce-eager"] if args.eager else []),
        ]  # fmt: skip
    kwargs = "--model.model_kwargs."
    return [
        sys.executable, "-m", "lmpress", "serve", "--engine", "VLLM",
        "--model.model_name", model_dir, "--host", "127.0.0.1", "--port", str(port),
        f"{kwargs}dtype", args.dtype, f"{kwargs}max_num_seqs", str(args.max_num_seqs),
        f"{kwargs}max_model_len", str(args.max_model_len),
        f"{kwargs}enforce_eager", "true" if args.eager else "false",
    ]  # fmt: skip


def wait_ready(proc: subprocess.Popen, port: int, log: Path, timeout: float = 600) -> str:
    """The model id the server lists, once /v1/models answers."""
    import json

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"the server exited (code {proc.returncode}):\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2) as r:
                return json.load(r)["data"][0]["id"]
        except OSError:
            time.sleep(1)
    proc.terminate()
    sys.exit(f"the server did not answer within {timeout:.0f} s:\n{log.read_text()[-3000:]}")


async def run_clients(port: int, model: str, chats: list, clients: int, max_tokens: int):
    """(completion tokens, wall seconds, streamed chunks) over `clients` streaming clients."""
    from openai import AsyncOpenAI

    queue: asyncio.Queue[list] = asyncio.Queue()
    for messages in chats:
        queue.put_nowait(messages)
    counts = {"tokens": 0, "chunks": 0}

    async def client_loop(client: AsyncOpenAI) -> None:
        while not queue.empty():
            messages = queue.get_nowait()
            stream = await client.chat.completions.create(
                model=model,
                messages=messages,
                max_tokens=max_tokens,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
            )
            async for chunk in stream:
                counts["chunks"] += 1
                if chunk.usage is not None:
                    counts["tokens"] += chunk.usage.completion_tokens

    users = [
        AsyncOpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=3600
        )
        for _ in range(clients)
    ]
    started = time.perf_counter()
    await asyncio.gather(*(client_loop(user) for user in users))
    wall = time.perf_counter() - started
    for user in users:
        await user.close()
    return counts["tokens"], wall, counts["chunks"]


def measure(side: str, args: argparse.Namespace, model_dir: str, chats: list, tmp: Path):
    port = free_port()
    command = server_command(side, args, model_dir, port)
    if args.profile:
        flame = Path(args.profile) / f"{side}-{int(time.time())}.svg"
        command = ["py-spy", "record", "--subprocesses", "-r", "50", "-o", str(flame), "--",
                   *command]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    log = tmp / f"{side}.log"
    with log.open("w") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        model = wait_ready(proc, port, log)
        asyncio.run(run_clients(port, model, chats[: args.clients], args.clients, 8))  # warm-up
        load = os.getloadavg()[0]
        tokens, wall, chunks = asyncio.run(
            run_clients(port, model, chats, args.clients, args.max_tokens)
        )
        return tokens, wall, chunks, (load + os.getloadavg()[0]) / 2
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2:135m-instruct")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--max-num-seqs", type=int, default=32)
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--no-eager", dest="eager", action="store_false")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--only", choices=("vllm", "lmpress"), help="one side, once per round")
    parser.add_argument("--profile", help="run lmpress's server under py-spy, flame graph here")
    args = parser.parse_args()

    from lmpress.engines.local.vllm.translate import model_directory

    model_dir = model_directory(args.model, "--model")
    chats = conversations(args.prompts)
    print(
        f"{args.prompts} chat prompts, {args.clients} streaming clients, max_tokens "
        f"{args.max_tokens}, greedy; max_num_seqs {args.max_num_seqs}, max_model_len "
        f"{args.max_model_len}, {args.dtype}, {'eager' if args.eager else 'compiled'}, "
        f"VLLM_CPU_KVCACHE_SPACE={os.environ.get('VLLM_CPU_KVCACHE_SPACE', '2')}; {model_dir}",
        flush=True,
    )
    if args.profile:
        Path(args.profile).mkdir(parents=True, exist_ok=True)
        args.only = args.only or "lmpress"
    ratios, loads = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(1, args.rounds + 1):
            sides = ("vllm", "lmpress") if round_ % 2 else ("lmpress", "vllm")
            rates = {}
            for side in (args.only,) if args.only else sides:
                tokens, wall, chunks, load = measure(side, args, model_dir, chats, Path(tmp))
                rates[side] = tokens / wall
                loads.append(load)
                print(f"round {round_} {side:8}: {tokens} tokens in {wall:.2f} s = "
                      f"{rates[side]:.1f} tok/s ({chunks} chunks), load {load:.2f}", flush=True)  # fmt: skip
            if len(rates) == 2:
                ratios.append(rates["lmpress"] / rates["vllm"])
                print(f"round {round_} lmpress / vllm = {ratios[-1]:.3f}", flush=True)
    if ratios:
        print(f"lmpress serve / vllm serve, completion tokens/s: median "
              f"{statistics.median(ratios):.3f} of {len(ratios)} rounds "
              f"({', '.join(f'{r:.3f}' for r in ratios)}); load average {min(loads):.1f} to "
              f"{max(loads):.1f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
