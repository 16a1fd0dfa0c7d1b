"""Rows spread over two LoRA adapters and the base model, run as one job whose rows each choose
their adapter (`model.adapters`, `Request.adapter`), against the same rows run as three jobs of
one adapter each (NATIVE: `model.adapter_model` set to that adapter, or none; another engine:
`model.adapters` holding that one adapter).

A job is timed whole, as a user waits for it: the engine loads, answers its rows and closes.
Each side runs in a process of its own (rounds.SideProcess), which imports the backend once
before the first round; rounds alternate the order of the sides (ABBA). Every row generates
exactly `--new-tokens` tokens (EOS held off), so both sides count the same tokens. The adapters
are SmolLM2's two made offline (builtin_models/lora.py).

    .venv/bin/python benchmarks/multi_adapter.py [--engine NATIVE|LLAMACPP] [--rows 64]
        [--in-flight 32] [--new-tokens 32] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio

from rounds import Rounds, SideProcess, chat_prompts

from lmpress.builtin_models.lora import smollm2_adapters
from lmpress.builtin_models.packaged import SMOLLM2
from lmpress.configs import load_config
from lmpress.engines.registry import create_engine
from lmpress.vocabulary.types import GenerationParams, Message, Request

CHOICES = [None, "lora-a", "lora-b"]  # the base model, then each adapter


def rows(count: int, new_tokens: int) -> list[Request]:
    """`count` chat rows, spread in turn over the base model and the two adapters."""
    params = GenerationParams(max_new_tokens=new_tokens, min_tokens=new_tokens)
    return [
        Request(str(i), [Message("user", prompt)], params, adapter=CHOICES[i % len(CHOICES)])
        for i, prompt in enumerate(chat_prompts(count, seed=0))
    ]


def job(engine_name: str, in_flight: int, model: dict, requests: list[Request]) -> int:
    """One job: load the engine with `model`'s settings, answer the rows, close; the tokens."""
    overrides = {"engine": engine_name, "model.model_name": SMOLLM2}
    overrides["generation.batch_size"] = in_flight
    engine = create_engine(load_config(overrides={**overrides, **model}))
    try:
        results = engine.generate(requests)
    finally:
        asyncio.run(engine.aclose())
    assert all(r.ok for r in results), [r.error for r in results if not r.ok][:1]
    return sum(r.usage.completion_tokens for r in results)


def build(side: str, engine_name: str, in_flight: int, count: int, new_tokens: int):
    """One side, in its own process: the backend imported, the timed work returned."""
    import torch  # noqa: F401  (imported once, before any round: not a job's cost)

    adapters = {name: str(path) for name, path in smollm2_adapters().items()}
    requests = rows(count, new_tokens)
    every = {f"model.adapters.{name}": path for name, path in adapters.items()}

    def mixed() -> int:
        return job(engine_name, in_flight, every, requests)

    def one_each() -> int:
        tokens = 0
        for choice in CHOICES:
            own = [r for r in requests if r.adapter == choice]
            if choice is None:
                model = {}
            elif engine_name == "NATIVE":  # the adapter merged into the run, as before
                model = {"model.adapter_model": adapters[choice]}
                own = [Request(r.id, r.messages, r.params) for r in own]
            else:
                model = {f"model.adapters.{choice}": adapters[choice]}
            tokens += job(engine_name, in_flight, model, own)
        return tokens

    return mixed if side == "one job" else one_each


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=["NATIVE", "LLAMACPP"], default="NATIVE")
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--in-flight", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    names = ("one job", "three jobs")
    shared = (args.engine, args.in_flight, args.rows, args.new_tokens)
    sides = {name: SideProcess(name, build, name, *shared) for name in names}
    rounds = Rounds()
    for round_no in range(1, args.rounds + 1):
        for name in names if round_no % 2 else names[::-1]:
            rounds.run_side(round_no, sides[name])
    for side in sides.values():
        side.close()
    print(
        f"\n{args.engine} {SMOLLM2}: {args.rows} chat rows over 2 adapters and the base, "
        f"{args.in_flight} in flight, {args.new_tokens} new tokens each; a job timed whole "
        f"(load, rows, close)"
    )
    for name in names:
        print(f"{name}: {rounds.best(name):.1f} tok/s")
    rounds.report("one job", "three jobs")


if __name__ == "__main__":
    main()
