"""NATIVE engine throughput against raw transformers `model.generate`, in the same run.

Both sides use the same loaded random-weight model of SmolLM2-135M's shape, the same prompts
of mixed lengths, greedy decoding and the same number of new tokens per prompt (EOS held off,
so every row generates exactly that many). The baseline runs static batches of the same size
with left padding. Each round runs raw, lmpress, lmpress, raw (ABBA) so drift in machine load
hits both alike; the best run of each side is compared.

Two ratios are printed: by wall time, and by this process's CPU time (all its threads). On a
machine shared with other work the wall ratio swings with their load; the CPU-time ratio
barely does, since both sides run the same threads on the same model.

    .venv/bin/python benchmarks/native_throughput.py [--prompts 64] [--batch-size 16]
        [--new-tokens 32] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time

from lmpress.configs import load_config
from lmpress.engines.registry import create_engine
from lmpress.types import GenerationParams


def make_prompts(count: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    words = "the quick brown fox jumps over a lazy dog while rivers run to the sea".split()
    # Mixed lengths: 4 to 120 words, so left padding matters.
    return [" ".join(rng.choice(words) for _ in range(rng.randint(4, 120))) for _ in range(count)]


def raw_generate(engine, prompts: list[str], batch_size: int, new_tokens: int) -> int:
    """Plain transformers: chat template, left-padded static batches, model.generate."""
    import torch

    tokenizer, model = engine.tokenizer, engine.model
    produced = 0
    for start in range(0, len(prompts), batch_size):
        texts = [
            tokenizer.apply_chat_template(
                [{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True
            )
            for p in prompts[start : start + batch_size]
        ]
        batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.inference_mode():
            out = model.generate(
                **batch.to(engine.device),
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id,
            )
        produced += (out.shape[1] - batch["input_ids"].shape[1]) * out.shape[0]
    return produced


def lmpress_generate(engine, prompts: list[str], new_tokens: int) -> int:
    params = GenerationParams(max_new_tokens=new_tokens, min_tokens=new_tokens)
    results = engine.generate(prompts, params)
    assert all(r.ok for r in results), [r.error for r in results if not r.ok][:1]
    return sum(r.usage.completion_tokens for r in results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny:smollm2-135m-shape")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    config = load_config(
        overrides={"model.model_name": args.model, "generation.batch_size": args.batch_size}
    )
    engine = create_engine(config)
    prompts = make_prompts(args.prompts)
    # Warm up both paths (first-call allocations, lazy kernels).
    raw_generate(engine, prompts[: args.batch_size], args.batch_size, 2)
    lmpress_generate(engine, prompts[: args.batch_size], 2)

    best = {"raw": 0.0, "lmpress": 0.0}
    best_cpu = {"raw": 0.0, "lmpress": 0.0}
    for round_no in range(1, args.rounds + 1):
        for name in ("raw", "lmpress", "lmpress", "raw"):
            started, cpu_started = time.perf_counter(), time.process_time()
            if name == "raw":
                tokens = raw_generate(engine, prompts, args.batch_size, args.new_tokens)
            else:
                tokens = lmpress_generate(engine, prompts, args.new_tokens)
            rate = tokens / (time.perf_counter() - started)
            cpu_rate = tokens / (time.process_time() - cpu_started)
            best[name] = max(best[name], rate)
            best_cpu[name] = max(best_cpu[name], cpu_rate)
            print(f"round {round_no} {name:8} {tokens} tokens  {rate:8.1f} tok/s  "
                  f"{cpu_rate:8.1f} tok/cpu-s", flush=True)  # fmt: skip
    asyncio.run(engine.aclose())
    print(
        f"\nmodel {args.model}, device {engine.device}, {args.prompts} prompts, "
        f"batch {args.batch_size}, {args.new_tokens} new tokens"
    )
    print(f"raw transformers generate: {best['raw']:.1f} tok/s")
    print(f"lmpress NATIVE:            {best['lmpress']:.1f} tok/s")
    print(f"ratio lmpress/raw:         {best['lmpress'] / best['raw']:.3f}  (wall time)")
    print(f"ratio lmpress/raw:         {best_cpu['lmpress'] / best_cpu['raw']:.3f}  (CPU time)")


if __name__ == "__main__":
    main()
