"""What scheduling by adapter costs on LLAMACPP: 64 SmolLM2 chat rows over two LoRA adapters and
the base model, as one job against three jobs of one adapter each.

llama.cpp applies an adapter to a whole context, so the LLAMACPP engine decodes each adapter's
rows in turns (lmpress/engines/local/llamacpp/turns.py), and a turn's last rows run in a batch
that shrinks as they end. Side "one job": a process loads SmolLM2-135M-Instruct (F16) with both
adapters (builtin_models/lora.py, converted to GGUF and cached before timing) and answers the
rows, mixed at random. Side "three jobs": three processes one after the other, each loading
the model with one adapter (or none) and answering that adapter's rows. Each job is timed from
before its engine loads to its last reply, as a user waits for it; generation alone is printed
too, and per CPU-second of generating (less moved by other work on a shared machine). Greedy,
EOS honoured: both sides generate the same tokens.

    .venv/bin/python benchmarks/multi_adapter_llamacpp.py [--rows 64] [--new-tokens 64]
        [--batch-size 16] [--rounds 2] [--threads N]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

from rounds import chat_prompts

from lmpress.builtin_models.lora import smollm2_adapters
from lmpress.builtin_models.packaged import SMOLLM2
from lmpress.configs import load_config
from lmpress.engines.registry import create_engine
from lmpress.vocabulary.types import GenerationParams, Message, Request


def job(
    adapters: dict[str, str], rows: list[tuple[str, str | None]], settings: dict
) -> tuple[int, float, float, int]:
    """One job in this process: load the model with `adapters`, answer `rows` (prompt,
    adapter); the tokens generated, seconds loading, seconds generating, adapter switches."""
    started = time.perf_counter()
    config = load_config(
        overrides={
            "engine": "LLAMACPP",
            "model.model_name": SMOLLM2,
            "model.adapters": adapters,
            "model.model_kwargs": settings["model_kwargs"],
            "generation.batch_size": settings["batch_size"],
        }
    )
    engine = create_engine(config)
    loaded, cpu = time.perf_counter(), time.process_time()
    params = GenerationParams(max_new_tokens=settings["new_tokens"])
    requests = [
        Request(str(i), [Message("user", prompt)], params, adapter=adapter)
        for i, (prompt, adapter) in enumerate(rows)
    ]
    results = engine.generate(requests)
    done, cpu = time.perf_counter(), time.process_time() - cpu
    assert all(r.ok for r in results), [r.error for r in results if not r.ok][:1]
    switches = engine.scheduler.turns.switches
    asyncio.run(engine.aclose())
    tokens = sum(r.usage.completion_tokens for r in results)
    print(f"  {len(rows)} rows: {tokens / cpu:.1f} tok/CPU-s generating", flush=True)
    return tokens, loaded - started, done - loaded, switches


def run_job(adapters: dict[str, str], rows: list, settings: dict) -> tuple[int, float, float, int]:
    """`job` in a fresh process, as a user runs a job."""
    with ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn")) as pool:
        return pool.submit(job, adapters, rows, settings).result()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()

    paths = {name: str(path) for name, path in smollm2_adapters().items()}
    rng = random.Random(54)
    rows = [(p, rng.choice([None, *paths])) for p in chat_prompts(args.rows, seed=54)]
    settings = {
        "model_kwargs": {"n_ctx": 8192, "kv_unified": True, "n_threads": args.threads},
        "batch_size": args.batch_size,
        "new_tokens": args.new_tokens,
    }
    run_job(paths, rows[:1], {**settings, "new_tokens": 1})  # converts the adapters, once
    totals: dict[str, list[tuple[int, float, float]]] = {"one job": [], "three jobs": []}
    for round_no in range(1, args.rounds + 1):
        tokens, load_s, gen_s, switches = run_job(paths, rows, settings)
        totals["one job"].append((tokens, load_s, gen_s))
        print(f"round {round_no} one job: {tokens} tokens, load {load_s:.1f} s, generate "
              f"{gen_s:.1f} s, {switches} adapter switches", flush=True)  # fmt: skip
        parts = []
        for adapter in (None, *paths):
            group = [row for row in rows if row[1] == adapter]
            one = {adapter: paths[adapter]} if adapter else {}
            parts.append(run_job(one, group, settings)[:3])
        tokens, load_s, gen_s = (sum(part[i] for part in parts) for i in range(3))
        totals["three jobs"].append((tokens, load_s, gen_s))
        print(f"round {round_no} three jobs: {tokens} tokens, load {load_s:.1f} s, generate "
              f"{gen_s:.1f} s", flush=True)  # fmt: skip
    best = {
        side: max(runs, key=lambda r: r[0] / (r[1] + r[2])) for side, runs in totals.items()
    }  # fmt: skip
    print(f"\n{args.rows} rows (2 adapters + base), max_new_tokens {args.new_tokens}, batch "
          f"{args.batch_size}, {args.threads} threads; best round of each side:")  # fmt: skip
    for side, (tokens, load_s, gen_s) in best.items():
        print(f"{side:10}: {tokens / (load_s + gen_s):6.1f} tok/s whole jobs, "
              f"{tokens / gen_s:6.1f} tok/s generating")  # fmt: skip
    (t1, l1, g1), (t3, l3, g3) = best["one job"], best["three jobs"]
    print(f"one job / three jobs: {t1 / (l1 + g1) / (t3 / (l3 + g3)):.2f} whole jobs, "
          f"{t1 / g1 / (t3 / g3):.2f} generating")  # fmt: skip


if __name__ == "__main__":
    main()
