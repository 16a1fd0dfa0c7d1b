"""How well prompt lookup's drafting rule (engines/local/speculation.py, `RowDrafts`) fits a
workload, free of the machine's noise: NATIVE decodes the rows greedily once, each row's
tokens are kept, and the rule is replayed over them row by row. Greedy tokens do not depend
on the drafts, so a replayed step keeps exactly the drafts the engine would keep.

For each row-step the replay counts the tokens emitted (its kept drafts and the model's own
token) and the tokens carried (its next token and its drafts); with `--step-cost` (a step's
fixed work in tokens carried, native/speculation.STEP_COST) and `--in-flight` it estimates a decode
step's gain, tokens emitted a step over the step's cost, against one token a row a step.
The engine's step planner (draft_counts) may carry fewer drafts than a row asks for; the
replay carries all it asks for. Run it at two commits to compare drafting rules.

    .venv/bin/python benchmarks/drafting_replay.py [--workload copy|chat] [--prompts 64]
        [--new-tokens 256] [--tokens 4] [--lookup-min 2] [--lookup-max 4]
"""

from __future__ import annotations

import argparse

from rounds import chat_prompts, copy_prompts, lmpress_generate

from lmpress.configs import load_config
from lmpress.engines.local import speculation
from lmpress.engines.registry import create_engine


def greedy_rows(prompts: list[str], new_tokens: int) -> list[tuple[list[int], list[int]]]:
    """Each row's prompt tokens and the tokens NATIVE emitted for it, greedy, EOS honoured:
    recorded as the rows settle their steps (the only place both are seen as token ids)."""
    config = load_config(
        overrides={
            "engine": "NATIVE",
            "model.model_name": "smollm2:135m-instruct",
            "generation.batch_size": 16,
            "model.speculative_method": "ngram",
        }
    )
    engine = create_engine(config)
    rows: list[tuple[list[int], list[int]]] = []
    start, settle = speculation.RowDrafts.__init__, speculation.RowDrafts.settle

    def recorded_start(self, spec, prompt_ids):
        prompt_ids = list(prompt_ids)
        start(self, spec, prompt_ids)
        self.recorded = (prompt_ids, [])
        rows.append(self.recorded)

    def recorded_settle(self, drafts, kept, emitted):
        self.recorded[1].extend(emitted)
        settle(self, drafts, kept, emitted)

    speculation.RowDrafts.__init__ = recorded_start
    speculation.RowDrafts.settle = recorded_settle
    try:
        lmpress_generate(engine, prompts, new_tokens, eos=True)
    finally:
        speculation.RowDrafts.__init__, speculation.RowDrafts.settle = start, settle
    return rows


def replay(rows, spec: speculation.Speculation) -> dict[str, float]:
    steps = drafted = kept_all = emitted_all = 0
    for prompt, reply in rows:
        row = spec.row(prompt)
        i = 0
        while i < len(reply):
            drafts = row.propose(len(reply) - i - 1)
            kept = 0
            while kept < len(drafts) and drafts[kept] == reply[i + kept]:
                kept += 1
            emitted = reply[i : i + kept + 1]
            row.settle(len(drafts), kept, emitted)
            steps, drafted, kept_all = steps + 1, drafted + len(drafts), kept_all + kept
            emitted_all += len(emitted)
            i += len(emitted)
    return {
        "emitted": emitted_all / steps,
        "carried": 1 + drafted / steps,
        "kept": kept_all / max(1, drafted),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=["copy", "chat"], default="copy")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=4, help="model.num_speculative_tokens")
    parser.add_argument("--lookup-min", type=int, default=2)
    parser.add_argument("--lookup-max", type=int, default=4)
    parser.add_argument("--in-flight", type=int, default=16)
    parser.add_argument("--step-cost", type=float, default=32)
    args = parser.parse_args()

    make = copy_prompts if args.workload == "copy" else chat_prompts
    rows = greedy_rows(make(args.prompts, seed=0), args.new_tokens)
    spec = speculation.Speculation("ngram", args.tokens, args.lookup_min, args.lookup_max)
    figures = replay(rows, spec)
    n, cost = args.in_flight, args.step_cost
    gain = figures["emitted"] * (cost + n) / (cost + n * figures["carried"])
    print(
        f"{args.workload}: {len(rows)} rows, {sum(len(r) for _, r in rows)} tokens; a row-step "
        f"emits {figures['emitted']:.2f} tokens and carries {figures['carried']:.2f}; "
        f"{figures['kept']:.0%} of drafts kept; a decode step's estimated gain at "
        f"{n} in flight: {gain:.2f}"
    )


if __name__ == "__main__":
    main()
