"""NATIVE engine throughput against raw transformers `model.generate`, in the same run.

Both sides load the same random-weight model of SmolLM2-135M's shape and answer the same
prompts of mixed lengths greedily with the same number of new tokens per prompt (EOS held off,
so every row generates exactly that many; `--eos` honours EOS instead, and each side counts
the tokens each row actually generated). The baseline runs static batches of the same size
with left padding. Each side runs in a process of its own (see rounds.SideProcess); each round
runs raw, lmpress, lmpress, raw (ABBA) so drift in machine load hits both alike.

Two ratios are printed (see benchmarks/rounds.py): by wall time, and by each side's process
CPU time (all its threads). On a machine shared with other work the wall ratio swings with
their load; the CPU-time ratio barely does, since both sides run the same threads on the same
model.

    .venv/bin/python benchmarks/native_throughput.py [--prompts 64] [--batch-size 16]
        [--new-tokens 32] [--rounds 3] [--eos] [--model smollm2:135m-instruct]
"""

from __future__ import annotations

import argparse

from rounds import Rounds, SideProcess, lmpress_generate, mixed_prompts

from lmpress.configs import load_config
from lmpress.engines.registry import create_engine


def raw_generate(
    engine, prompts: list[str], batch_size: int, new_tokens: int, eos: bool = False
) -> int:
    """Plain transformers: chat template, left-padded static batches, model.generate. With
    `eos`, each row counts its tokens up to and including its first EOS, not the batch width."""
    import torch

    tokenizer, model = engine.tokenizer, engine.model
    eos_ids = model.generation_config.eos_token_id
    eos_ids = torch.tensor(eos_ids if isinstance(eos_ids, list) else [eos_ids])
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
                min_new_tokens=0 if eos else new_tokens,
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id,
            )
        new = out[:, batch["input_ids"].shape[1] :].cpu()
        if not eos:
            produced += new.numel()
            continue
        ended = torch.isin(new, eos_ids)
        first = ended.int().argmax(dim=1)  # the first EOS, where a row has one
        produced += int(torch.where(ended.any(dim=1), first + 1, new.shape[1]).sum())
    return produced


def build_raw(config, prompts: list[str], batch_size: int, new_tokens: int, eos: bool):
    """The raw side, in its own process: the engine only loads the model and tokenizer (its
    worker thread never runs here), then plain `generate` on them."""
    engine = create_engine(config)
    raw_generate(engine, prompts[:batch_size], batch_size, 2)  # warm up
    return lambda: raw_generate(engine, prompts, batch_size, new_tokens, eos)


def build_lmpress(config, prompts: list[str], batch_size: int, new_tokens: int, eos: bool):
    engine = create_engine(config)
    print(f"device {engine.device}", flush=True)
    lmpress_generate(engine, prompts[:batch_size], 2)  # warm up
    return lambda: lmpress_generate(engine, prompts, new_tokens, eos)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny:smollm2-135m-shape")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--eos", action="store_true", help="honour EOS: rows stop at different lengths"
    )
    args = parser.parse_args()

    config = load_config(
        overrides={"model.model_name": args.model, "generation.batch_size": args.batch_size}
    )
    # Mixed lengths: 4 to 120 words, so left padding matters.
    prompts = mixed_prompts(args.prompts, max_words=120)
    work = (prompts, args.batch_size, args.new_tokens, args.eos)
    # Each side in a process of its own, as users run them (see rounds.SideProcess).
    sides = {
        "raw": SideProcess("raw", build_raw, config, *work),
        "lmpress": SideProcess("lmpress", build_lmpress, config, *work),
    }
    rounds = Rounds()
    for round_no in range(1, args.rounds + 1):
        for name in ("raw", "lmpress", "lmpress", "raw"):
            rounds.run_side(round_no, sides[name])
    for side in sides.values():
        side.close()
    print(
        f"\nmodel {args.model}, {args.prompts} prompts, batch {args.batch_size}, "
        f"{'at most ' if args.eos else ''}{args.new_tokens} new tokens, "
        f"EOS {'honoured' if args.eos else 'held off'}"
    )
    print(f"raw transformers generate: {rounds.best('raw'):.1f} tok/s")
    print(f"lmpress NATIVE:            {rounds.best('lmpress'):.1f} tok/s")
    rounds.report("lmpress", "raw")


if __name__ == "__main__":
    main()
