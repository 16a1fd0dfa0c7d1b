"""Speculative decoding by prompt lookup (`model.speculative_method: ngram`) against the same
engine with it off, on copy-heavy or free-text chat prompts.

Each side loads the engine in a process of its own (rounds.SideProcess), with the same model,
rows in flight and prompts; rounds alternate the order of the sides (ABBA) so drift in the
machine's load hits both alike. Rows are greedy and honour EOS (a copy reply ends when the copy
does), so each side counts the tokens it generated; greedy text is the same on both sides, so
the counts are too. After each run the speculating side prints its drafted and kept tokens
(the scheduler's `speculation_counts`).

    .venv/bin/python benchmarks/speculation.py [--engine LLAMACPP|NATIVE] [--workload copy|chat]
        [--prompts 32] [--in-flight 16] [--new-tokens 256] [--rounds 2]
        [--model smollm2:135m-instruct] [--tokens 4]

`--workload copy`: rounds.copy_prompts (fix the typos of a paragraph and return it in full, or
pull its fields out as JSON); `chat`: rounds.chat_prompts.
"""

from __future__ import annotations

import argparse

from rounds import Rounds, SideProcess, chat_prompts, copy_prompts, lmpress_generate

from lmpress.configs import load_config
from lmpress.engines.registry import create_engine
from lmpress.vocabulary.types import GenerationParams


def build(engine_name: str, model: str, in_flight: int, method: str, tokens: int, prompts, new):
    """One side, in its own process: load, warm up, return the timed work."""
    config = load_config(
        overrides={
            "engine": engine_name,
            "model.model_name": model,
            "generation.batch_size": in_flight,
            "model.speculative_method": method,
            "model.num_speculative_tokens": tokens,
        }
    )
    engine = create_engine(config)
    engine.generate(prompts[:in_flight], GenerationParams(max_new_tokens=2))

    def work() -> int:
        counts = getattr(engine.scheduler, "speculation_counts", None)
        before = (counts.drafted, counts.accepted) if counts is not None else (0, 0)
        generated = lmpress_generate(engine, prompts, new, eos=True)
        if counts is not None and method != "off":
            drafted, kept = counts.drafted - before[0], counts.accepted - before[1]
            print(
                f"  {method}: {drafted} drafted, {kept} kept (acceptance "
                f"{kept / max(1, drafted):.2f}); {kept / max(1, generated):.2f} of the "
                f"{generated} tokens came from kept drafts",
                flush=True,
            )
        return generated

    return work


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=["LLAMACPP", "NATIVE"], default="LLAMACPP")
    parser.add_argument("--workload", choices=["copy", "chat"], default="copy")
    parser.add_argument("--model", default="smollm2:135m-instruct")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--in-flight", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=4, help="model.num_speculative_tokens")
    args = parser.parse_args()

    make = copy_prompts if args.workload == "copy" else chat_prompts
    prompts = make(args.prompts, seed=0)
    shared = (args.engine, args.model, args.in_flight)
    sides = {
        method: SideProcess(method, build, *shared, method, args.tokens, prompts, args.new_tokens)
        for method in ("off", "ngram")
    }
    rounds = Rounds()
    for round_no in range(1, args.rounds + 1):
        order = ("off", "ngram") if round_no % 2 else ("ngram", "off")
        for method in order:
            rounds.run_side(round_no, sides[method])
    for side in sides.values():
        side.close()
    print(
        f"\n{args.engine} {args.model}, {args.workload} workload: {args.prompts} prompts, "
        f"{args.in_flight} in flight, greedy, at most {args.new_tokens} new tokens (EOS "
        f"honoured), {args.tokens} drafted tokens at most"
    )
    print(f"off:   {rounds.best('off'):.1f} tok/s")
    print(f"ngram: {rounds.best('ngram'):.1f} tok/s")
    rounds.report("ngram", "off")


if __name__ == "__main__":
    main()
