"""What `model.kv_cache_dtype` costs and buys on this CPU, on SmolLM2: each engine's cache at
auto against its quantized ones (LLAMACPP int8 and int4, llama.cpp's q8_0 and q4_0; VLLM fp8;
NATIVE int8, lmpress's own), each side in a process of its own.

For each side:
- KV per token: the cache's bytes per token of context, from the engine's own account (the
  cache llama.cpp says it allocated, over its cells; the tokens vLLM says its cache of
  VLLM_CPU_KVCACHE_SPACE GiB holds; the bytes of NATIVE's slot cache tensors, an int8
  cache's read buffers included, over their columns, at its largest step);
- tokens per GiB: the context, or rows times their lengths, that one GiB of cache holds;
- tok/s: `--rows` chat rows, greedy, `--max-new-tokens` each (ignore_eos, so every row runs its
  full length), `--in-flight` at once, generation alone timed, median of `--rounds`;
- match: the rows whose greedy text equals the auto side's of the same engine, twice: over the
  timed rounds' texts (ignore_eos, `--max-new-tokens` each), and over the replies a user gets
  (the end of text honoured, up to `--reply-tokens`), generated once more, untimed.

A side `ENGINE:DTYPE@N` runs N rows in flight instead of `--in-flight`: `NATIVE:auto@1` against
`NATIVE:auto` is the engine's own floor, how often greedy text changes with nothing quantized,
only the rows batched with each row (the float sums' order) changed.

    python benchmarks/kv_cache.py [--rows 64] [--max-new-tokens 64] [--reply-tokens 256]
        [--in-flight 16] [--rounds 2] [--sides LLAMACPP:auto,LLAMACPP:int8,NATIVE:auto@1,...]
        [--vllm-python PY]

Run it with the main venv's Python; the VLLM sides run with `--vllm-python`
(default .venv-vllm/bin/python).
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
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MODEL = "smollm2:135m-instruct"
SIDES = ["LLAMACPP:auto", "LLAMACPP:int8", "LLAMACPP:int4", "VLLM:auto", "VLLM:fp8",
         "NATIVE:auto", "NATIVE:int8"]  # fmt: skip
TOPICS = ["rain", "the sea", "cats", "roads", "bread", "music", "trees", "the moon"]
# "llama_kv_cache: size = 90.00 MiB (512 cells, 30 layers, 8/8 seqs), ...": a split cache
# gives each sequence's cells.
LLAMA_KV = re.compile(r"llama_kv_cache: size = +([\d.]+) MiB \( *(\d+) cells, +\d+ layers, +(\d+)/")
VLLM_KV = re.compile(r"KV cache size: ([\d,]+) tokens")
VLLM_SPACE_GIB = 1


def kv_bytes_per_token(engine: str, dtype: str) -> float:
    """The engine's own account of its cache, read from its log in a process of its own."""
    args = ["infer", "--engine", engine, "--model.model_name", MODEL, "--cache", "off",
            "--model.kv_cache_dtype", dtype, "--generation.max_new_tokens", "1", "Hi"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    if engine == "LLAMACPP":
        args += ["--model.model_kwargs.verbose", "true", "--model.model_kwargs.n_ctx", "4096"]
    else:
        args += ["--debug", "--model.model_kwargs.enforce_eager", "true"]
        env["VLLM_CPU_KVCACHE_SPACE"] = str(VLLM_SPACE_GIB)
        model = json.loads(subprocess.check_output(
            [sys.executable, "-c", "from lmpress.engines.local.vllm.translate import "
             f"model_directory; import json; print(json.dumps(model_directory({MODEL!r}, 'm')))"],
            env=env, text=True))  # fmt: skip
        args[args.index(MODEL)] = model
    run = subprocess.run([sys.executable, "-m", "lmpress", *args], capture_output=True,
                         text=True, env=env)  # fmt: skip
    if run.returncode != 0:
        raise SystemExit(f"{engine} {dtype}: {run.stderr[-2000:]}")
    if engine == "LLAMACPP":
        size, cells, seqs = (float(x) for x in LLAMA_KV.findall(run.stderr)[-1])
        return size * 2**20 / (cells * seqs)
    tokens = int(VLLM_KV.findall(run.stderr)[-1].replace(",", ""))
    return VLLM_SPACE_GIB * 2**30 / tokens


def side(engine: str, dtype: str, args: argparse.Namespace) -> dict:
    """In the side's own process: its texts and its tok/s in each round."""
    from lmpress.configs import load_config
    from lmpress.engines.registry import create_engine
    from lmpress.vocabulary.types import GenerationParams, Message, Request

    model = MODEL
    kwargs: dict = {}
    if engine == "VLLM":
        from lmpress.engines.local.vllm.translate import model_directory

        model = model_directory(MODEL, "model")
        kwargs = {"enforce_eager": True, "max_num_seqs": args.in_flight}
    overrides = {"engine": engine, "model.model_name": model, "model.kv_cache_dtype": dtype,
                 "generation.batch_size": args.in_flight, "model.model_kwargs": kwargs}  # fmt: skip
    engine_ = create_engine(load_config(overrides=overrides))
    params = GenerationParams(max_new_tokens=args.max_new_tokens, ignore_eos=True)
    requests = [
        Request(
            f"r{i}", [Message("user", f"Tell me one fact about {TOPICS[i % 8]} ({i}).")], params
        )
        for i in range(args.rows)
    ]
    replying = GenerationParams(max_new_tokens=args.reply_tokens)
    replies = [Request(r.id, r.messages, replying) for r in requests]
    rates, texts = [], []
    largest = watch_native_cache() if engine == "NATIVE" else {}
    try:
        for _ in range(args.rounds):
            start = time.perf_counter()
            results = engine_.generate(requests)
            elapsed = time.perf_counter() - start
            rates.append(sum(r.usage.completion_tokens for r in results) / elapsed)
            texts = [r.text for r in results]
        replied = [r.text for r in engine_.generate(replies)]
    finally:
        asyncio.run(engine_.aclose())
    return {"rates": rates, "texts": texts, "replies": replied, **largest}


def watch_native_cache() -> dict:
    """NATIVE's KV bytes a token, read from its slot cache's own tensors at its largest step
    (the returned dict fills in as the rows run)."""
    from lmpress.engines.local.native.batch_cache import BatchCache

    largest: dict = {}
    step_inputs = BatchCache.step_inputs

    def watched(self, widths=1):
        out = step_inputs(self, widths)
        tensors = [t for layer in self.layers for t in layer]
        held = sum(t.codes.nbytes + t.scales.nbytes if hasattr(t, "codes") else t.nbytes
                   for t in tensors) + sum(t.nbytes for t in self.reads)  # fmt: skip
        if self.columns() > largest.get("columns", 0):
            largest.update(columns=self.columns(), kv=held / self.columns())
        return out

    BatchCache.step_inputs = watched
    return largest


def matching(these: list[str], those: list[str]) -> int:
    return sum(a == b for a, b in zip(these, those, strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--reply-tokens", type=int, default=256)
    parser.add_argument("--in-flight", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--sides", default=",".join(SIDES))
    parser.add_argument("--vllm-python", default=str(REPO / ".venv-vllm" / "bin" / "python"))
    parser.add_argument("--side", help=argparse.SUPPRESS)  # ENGINE:DTYPE, in its own process
    args = parser.parse_args()
    if args.side:
        engine, dtype = args.side.split(":")
        dtype = dtype.partition("@")[0]
        found = side(engine, dtype, args)
        if engine != "NATIVE":
            found["kv"] = kv_bytes_per_token(engine, dtype)
        print(json.dumps(found))
        return
    found: dict[str, dict] = {}
    for name in args.sides.split(","):
        python = args.vllm_python if name.startswith("VLLM") else sys.executable
        in_flight = name.partition("@")[2] or str(args.in_flight)
        command = [python, __file__, "--side", name, "--rows", str(args.rows),
                   "--max-new-tokens", str(args.max_new_tokens), "--reply-tokens",
                   str(args.reply_tokens), "--in-flight", in_flight,
                   "--rounds", str(args.rounds)]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(REPO), "VLLM_CPU_KVCACHE_SPACE": "2"}
        out = subprocess.run(command, capture_output=True, text=True, env=env)
        if out.returncode != 0:
            print(f"{name}: failed: {out.stderr[-1500:]}", file=sys.stderr)
            continue
        found[name] = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"SmolLM2, {args.rows} rows x {args.max_new_tokens} new tokens (ignore_eos), "
          f"{args.in_flight} in flight, median of {args.rounds} rounds; replies: up to "
          f"{args.reply_tokens} tokens, ended where the model ends them\n")  # fmt: skip
    print("| side | KV bytes/token | tokens per GiB | tok/s | tok/s vs auto "
          "| greedy match vs auto (ignore_eos) | replies matching auto's |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, data in found.items():
        auto = found.get(name.split(":")[0] + ":auto")
        rate = statistics.median(data["rates"])
        ratio = rate / statistics.median(auto["rates"]) if auto else float("nan")
        same, replies = (
            (matching(auto["texts"], data["texts"]), matching(auto["replies"], data["replies"]))
            if auto
            else (0, 0)
        )
        print(f"| {name} | {data['kv']:.0f} | {2**30 / data['kv']:,.0f} | {rate:.1f} "
              f"| {ratio:.2f} | {same} of {len(data['texts'])} "
              f"| {replies} of {len(data['replies'])} |")  # fmt: skip
    print("\nThe first row's reply on each side:")
    for name, data in found.items():
        print(f"- {name}: {data['texts'][0][:160]!r}")


if __name__ == "__main__":
    main()
