"""NATIVE engine throughput against raw transformers, in the same run.

The sides load the same model and answer the same prompts greedily, at most the same number of
new tokens a row (exactly that many with EOS held off; `--eos` honours EOS, and each side counts
the tokens each row actually generated, EOS included). Each side runs in a process of its own
(see rounds.SideProcess); each round runs the sides in turn and then back (ABBA) so drift in
machine load hits all alike. The sides:

- raw: `model.generate` on static batches of `--batch-size`, left-padded;
- generate_batch (with `--eos`): transformers' own continuous batching, at most
  `--batch-size` requests a batch;
- lmpress: NATIVE, `generation.batch_size` `--batch-size`.

`--shared-prefix N` runs the prefix-reuse workload instead: every prompt after the same system
prompt of about N tokens, lmpress against lmpress with `model.model_kwargs.prefix_reuse` off.
`--compile` runs NATIVE with `model.compile` against NATIVE without it, each loaded once (the
compile counts as load, printed per side). `--chat` sends chat prompts (chat_prompts: tasks with replies of very different lengths) for a
real model, rather than strings of random words. Ratios by wall time and by each side's
process CPU time (all its threads) are printed (see benchmarks/rounds.py), and each side's
peak resident memory: over its whole process, where loading the model may set it, and while
generating (after loading and warm-up), which is where the sides differ.

    .venv/bin/python benchmarks/native_throughput.py [--prompts 64] [--batch-size 16]
        [--new-tokens 32] [--rounds 3] [--eos] [--chat] [--shared-prefix 300]
        [--model smollm2:135m-instruct] [--compile] [--dtype float32|bfloat16]
        [--temperature 0.8]
"""

from __future__ import annotations

import argparse
import time

from rounds import Rounds, SideProcess, chat_prompts, lmpress_generate, mixed_prompts

from lmpress.configs import load_config
from lmpress.engines.local.native.row_attention import own_attention_back
from lmpress.engines.registry import create_engine


def sampling(temperature: float) -> dict:
    """transformers' generation settings for greedy (0) or sampling from the whole distribution
    at `temperature` (no top-k or top-p), as both transformers sides take them."""
    return {
        "do_sample": temperature > 0,
        "temperature": temperature or None,
        "top_k": 0,
        "top_p": 1.0,
    }


def raw_generate(
    engine,
    prompts: list[str],
    batch_size: int,
    new_tokens: int,
    eos: bool = False,
    temperature: float = 0.0,
) -> int:
    """Plain transformers: chat template, left-padded static batches, model.generate. With
    `eos`, each row counts its tokens up to and including its first EOS, not the batch width.
    A `temperature` samples from the whole distribution at it (no top-k or top-p)."""
    import torch

    tokenizer, model = engine.hf_tokenizer, engine.model
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
                pad_token_id=tokenizer.pad_token_id,
                **sampling(temperature),
            )
        new = out[:, batch["input_ids"].shape[1] :].cpu()
        if not eos:
            produced += new.numel()
            continue
        ended = torch.isin(new, eos_ids)
        first = ended.int().argmax(dim=1)  # the first EOS, where a row has one
        produced += int(torch.where(ended.any(dim=1), first + 1, new.shape[1]).sum())
    return produced


def build_raw(
    config, prompts: list[str], batch_size: int, new_tokens: int, eos: bool, temperature: float
):
    """The raw side, in its own process: the engine only loads the model and tokenizer (its
    worker thread never runs here), then plain `generate` on them, on the attention the model
    was loaded with."""
    engine = create_engine(config)
    own_attention_back(engine.model)
    raw_generate(engine, prompts[:batch_size], batch_size, 2)  # warm up
    return lambda: raw_generate(engine, prompts, batch_size, new_tokens, eos, temperature)


def build_generate_batch(
    config, prompts: list[str], batch_size: int, new_tokens: int, eos: bool, temperature: float
):
    """transformers' continuous batching (`model.generate_batch`) on the engine's model, at
    most `batch_size` requests in a batch, greedy, stopping at EOS."""
    from transformers import ContinuousBatchingConfig, GenerationConfig

    engine = create_engine(config)
    own_attention_back(engine.model)
    tokenizer, model = engine.hf_tokenizer, engine.model
    inputs = [
        list(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": p}], add_generation_prompt=True, return_dict=True
            )["input_ids"]
        )
        for p in prompts
    ]

    def work(inputs: list[list[int]], new_tokens: int) -> int:
        out = model.generate_batch(
            inputs,
            generation_config=GenerationConfig(
                max_new_tokens=new_tokens,
                eos_token_id=sorted(engine.eos_ids),
                **sampling(temperature),
                pad_token_id=tokenizer.pad_token_id,
            ),
            continuous_batching_config=ContinuousBatchingConfig(max_requests_per_batch=batch_size),
        )
        return sum(len(o.generated_tokens) for o in out.values())

    work(inputs[:batch_size], 2)  # warm up
    return lambda: work(inputs, new_tokens)


def build_lmpress(
    config,
    prompts: list[str],
    batch_size: int,
    new_tokens: int,
    eos: bool,
    temperature: float,
    system: str = "",
):
    started = time.perf_counter()
    engine = create_engine(config)
    print(f"device {engine.device}, loaded in {time.perf_counter() - started:.1f} s", flush=True)
    if system:
        print(f"system prompt: {len(engine.hf_tokenizer(system)['input_ids'])} tokens", flush=True)
    lmpress_generate(engine, prompts[:batch_size], 2, system=system)  # warm up
    return lambda: lmpress_generate(engine, prompts, new_tokens, eos, system, temperature)


# The shared-prefix workload's system prompt: rules of about 20 tokens each, as many as it takes.
RULES = [
    "Answer in plain English, in complete sentences, without jargon or abbreviations.",
    "If a question is unclear, say which part is unclear before you answer the rest.",
    "Never invent facts, names, dates or numbers; say when you do not know something.",
    "Keep answers short unless the user asks for detail, a story, a list or an essay.",
    "Be polite and patient, even when the user is rude, confused or in a hurry.",
    "When you give steps, number them, and keep each step to a single clear action.",
    "Prefer examples from everyday life over abstract explanations wherever you can.",
]


def system_prompt(tokens: int) -> str:
    """About `tokens` tokens of numbered rules for an assistant (20 tokens a rule or so)."""
    rules = [f"Rule {i + 1}: {RULES[i % len(RULES)]}" for i in range(max(1, tokens // 20))]
    return "You are a helpful assistant for a public library. " + " ".join(rules)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny:smollm2-135m-shape")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--one-pass", action="store_true",
        help="each side once a round (A B C), not there and back (A B C C B A): for long runs",
    )  # fmt: skip
    parser.add_argument(
        "--eos", action="store_true", help="honour EOS: rows stop at different lengths"
    )
    parser.add_argument("--chat", action="store_true", help="chat prompts, for a real model")
    parser.add_argument(
        "--no-generate-batch", action="store_true",
        help="with --eos, leave transformers' generate_batch side out (it takes about as long "
        "as raw and needs over 13 GiB on a CPU)",
    )  # fmt: skip
    parser.add_argument(
        "--shared-prefix", type=int, default=0, metavar="TOKENS",
        help="the prefix-reuse workload: a system prompt of about TOKENS tokens before each prompt",
    )  # fmt: skip
    parser.add_argument(
        "--compile", action="store_true",
        help="NATIVE with model.compile (its decoding step compiled) against NATIVE without",
    )  # fmt: skip
    parser.add_argument("--dtype", default="auto", help="model.torch_dtype_str")
    parser.add_argument(
        "--temperature", type=float, default=0.0,
        help="sample at this temperature, from the whole distribution, on every side "
        "(each lmpress row seeded); 0: greedy",
    )  # fmt: skip
    args = parser.parse_args()

    overrides = {
        "model.model_name": args.model,
        "generation.batch_size": args.batch_size,
        "model.torch_dtype_str": args.dtype,
    }
    config = load_config(overrides=overrides)
    # Mixed lengths: 4 to 120 words, so left padding matters.
    prompts = chat_prompts(args.prompts) if args.chat else mixed_prompts(args.prompts, 120)
    work = (prompts, args.batch_size, args.new_tokens, args.eos, args.temperature)
    if args.shared_prefix:
        no_reuse = load_config(overrides={**overrides, "model.model_kwargs.prefix_reuse": False})
        system = system_prompt(args.shared_prefix)
        sides = {
            "prefix reuse": SideProcess("prefix reuse", build_lmpress, config, *work, system),
            "no reuse": SideProcess("no reuse", build_lmpress, no_reuse, *work, system),
        }
        pairs = [("prefix reuse", "no reuse")]
    elif args.compile:
        compiled = load_config(overrides={**overrides, "model.compile": True})
        sides = {
            "compiled": SideProcess("compiled", build_lmpress, compiled, *work),
            "eager": SideProcess("eager", build_lmpress, config, *work),
        }
        pairs = [("compiled", "eager")]
    else:
        # Each side in a process of its own, as users run them (see rounds.SideProcess).
        sides = {"raw": SideProcess("raw", build_raw, config, *work)}
        if args.eos and not args.no_generate_batch:  # it has no min_new_tokens to hold EOS off
            sides["generate_batch"] = SideProcess("generate_batch", build_generate_batch, config, *work)  # fmt: skip
        sides["lmpress"] = SideProcess("lmpress", build_lmpress, config, *work)
        pairs = [("lmpress", name) for name in sides if name != "lmpress"]
    rounds = Rounds()
    order = list(sides)
    for round_no in range(1, args.rounds + 1):
        for name in order if args.one_pass else order + order[::-1]:
            rounds.run_side(round_no, sides[name])
    peaks = {name: side.peak_rss_mib() for name, side in sides.items()}
    for side in sides.values():
        side.close()
    print(
        f"\nmodel {args.model}, {args.prompts} {'chat ' if args.chat else ''}prompts"
        f"{f' after a {args.shared_prefix}-token system prompt' if args.shared_prefix else ''}, "
        f"batch {args.batch_size}, {'at most ' if args.eos else ''}{args.new_tokens} new tokens, "
        f"EOS {'honoured' if args.eos else 'held off'}, dtype {args.dtype}, "
        f"{f'sampled at temperature {args.temperature:g}' if args.temperature else 'greedy'}"
    )
    for name in sides:
        whole, running = peaks[name]
        print(
            f"{name:16} {rounds.best(name):8.1f} tok/s (best)  peak RSS {whole:7.1f} MiB, "
            f"{running:7.1f} MiB while generating"
        )
    for ours, theirs in pairs:
        rounds.report(ours, theirs)


if __name__ == "__main__":
    main()
