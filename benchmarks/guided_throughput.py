"""Guided decoding's cost on throughput: tokens/s under a JSON Schema against unconstrained
generation of the same prompts, on the same engine, in the same run.

Both sides load the same model on the same engine (NATIVE or LLAMACPP) and answer the same 64
chat prompts, each asking for a JSON description of a subject, greedily, EOS honoured, at most
128 new tokens. The guided side sets `guided_decoding` to a nested JSON Schema (a string with
maxLength, an integer range, an enum, an array of strings with maxItems, a nested object) with
`disable_any_whitespace`, so every row is masked by its grammar at every step; the free side
sets nothing. Guided rows end when their JSON is complete, free rows when the model says EOS,
so the two sides generate different numbers of tokens: the ratio compares tokens/s (each side
counts usage.completion_tokens), and each side's mean tokens per row is printed beside it.
The guided replies are checked against the schema (`jsonschema`) every run.

Each side runs in a process of its own (see rounds.SideProcess); each round runs free, guided,
guided, free (ABBA) so drift in the machine's load hits both alike. The target (issue 16) is a
median ratio guided/free of at least 0.85.

    .venv/bin/python benchmarks/guided_throughput.py --engine NATIVE|LLAMACPP [--prompts 64]
        [--new-tokens 128] [--batch-size 16] [--rounds 3] [--model smollm2:135m-instruct]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from rounds import Rounds, SideProcess

from lmpress.configs import load_config
from lmpress.engines.registry import create_engine
from lmpress.vocabulary.types import GenerationParams, Message, Request

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "year": {"type": "integer", "minimum": -3000, "maximum": 2100},
        "category": {"enum": ["animal", "place", "food", "invention", "person", "artwork"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 4},
        "details": {
            "type": "object",
            "properties": {
                "origin": {"type": "string", "maxLength": 40},
                "summary": {"type": "string", "maxLength": 100},
            },
            "required": ["origin", "summary"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "year", "category", "tags", "details"],
    "additionalProperties": False,
}

SUBJECTS = (
    "the red fox, the Eiffel Tower, sourdough bread, the printing press, Marie Curie, the Mona "
    "Lisa, the blue whale, Mount Fuji, sushi, the telephone, Ada Lovelace, The Starry Night, the "
    "honey bee, the Great Wall of China, paella, the steam engine, Nelson Mandela, the Venus de "
    "Milo, the emperor penguin, Machu Picchu, kimchi, the light bulb, Isaac Newton, Guernica, the "
    "octopus, Venice, croissants, the bicycle, Frida Kahlo, the Sistine Chapel ceiling, the "
    "African elephant, the Sahara Desert, tacos, the compass, Leonardo da Vinci, The Scream, the "
    "snow leopard, Kyoto, chocolate, the radio, Alan Turing, the Parthenon, the monarch butterfly, "
    "Iceland, ramen, the airplane, Mahatma Gandhi, The Thinker, the koala, the Amazon rainforest, "
    "pizza Margherita, the telescope, Rosalind Franklin, Girl with a Pearl Earring, the cheetah, "
    "Petra, falafel, the microscope, Wolfgang Amadeus Mozart, the Taj Mahal, the giant panda, "
    "the Grand Canyon, pho, the World Wide Web"
).split(", ")

ASKS = (
    "Describe {} as a JSON object with its name, a year, a category, a few tags and details.",
    "Give me a short JSON description of {}.",
    "Reply with JSON only: name, year, category, tags and details (origin, summary) for {}.",
    "I am building a catalogue. Write one JSON record about {}, with a one-line summary.",
)


def json_prompts(count: int) -> list[str]:
    """`count` prompts asking for a JSON description, subjects and wordings varied."""
    return [ASKS[i % len(ASKS)].format(SUBJECTS[i % len(SUBJECTS)]) for i in range(count)]


def build(config, prompts: list[str], new_tokens: int, guided: bool):
    """One side, in its own process: load, warm up (which compiles the grammar), return the
    timed work. The work returns the tokens generated and checks the guided replies."""
    import jsonschema

    engine = create_engine(config)
    grammar_s = _time_grammar() if guided else [0.0]
    params = GenerationParams(
        max_new_tokens=new_tokens,
        guided_decoding={"json": SCHEMA, "disable_any_whitespace": True} if guided else None,
    )
    requests = [Request(str(i), [Message("user", p)], params) for i, p in enumerate(prompts)]
    validator = jsonschema.Draft202012Validator(SCHEMA)

    def work(requests: list[Request] = requests) -> int:
        grammar_s[0] = 0.0
        started = time.perf_counter()
        results = engine.generate(requests)
        wall_s = time.perf_counter() - started
        assert all(r.ok for r in results), [r.error for r in results if not r.ok][:1]
        if guided:
            valid = sum(_valid(validator, r.text) for r in results)
            print(
                f"  guided: {valid}/{len(results)} replies valid against the schema; "
                f"grammar work {grammar_s[0]:.2f} s of {wall_s:.1f} s "
                f"({100 * grammar_s[0] / wall_s:.1f}%)",
                flush=True,
            )
        return sum(r.usage.completion_tokens for r in results)

    work(requests[: engine.batch_size])  # warm up
    return work


def _time_grammar() -> list[float]:
    """Make the grammar's per-step work (masking a row's logits, following its token) add its
    seconds to the one-element list returned: what guided decoding costs, measured directly,
    so a noisy machine that blurs the tokens/s ratio does not hide it."""
    from lmpress.engines.local import guided as grammar
    from lmpress.engines.local.native import sampling

    spent = [0.0]

    def timed(function):
        def wrapper(*args):
            started = time.perf_counter()
            try:
                return function(*args)
            finally:
                spent[0] += time.perf_counter() - started

        return wrapper

    # NATIVE masks in BatchControl._constrain, LLAMACPP in Matcher.mask_logits; both accept.
    grammar.Matcher.mask_logits = timed(grammar.Matcher.mask_logits)
    grammar.Matcher.accept = timed(grammar.Matcher.accept)
    sampling.BatchControl._constrain = timed(sampling.BatchControl._constrain)
    return spent


def _valid(validator, text: str) -> bool:
    try:
        return validator.is_valid(json.loads(text))
    except json.JSONDecodeError:
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=["NATIVE", "LLAMACPP"], required=True)
    parser.add_argument("--model", default="smollm2:135m-instruct")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    config = load_config(
        overrides={
            "engine": args.engine,
            "model.model_name": args.model,
            "generation.batch_size": args.batch_size,
        }
    )
    prompts = json_prompts(args.prompts)
    sides = {
        "free": SideProcess("free", build, config, prompts, args.new_tokens, False),
        "guided": SideProcess("guided", build, config, prompts, args.new_tokens, True),
    }
    rounds = Rounds()
    tokens: dict[str, list[int]] = {name: [] for name in sides}
    for round_no in range(1, args.rounds + 1):
        for name in ("free", "guided", "guided", "free"):
            produced, wall_s, cpu_s = sides[name].run()
            tokens[name].append(produced)
            rounds.record(round_no, name, produced, wall_s, cpu_s)
    for side in sides.values():
        side.close()
    print(
        f"\n{args.engine}, model {args.model}, {args.prompts} prompts, batch {args.batch_size}, "
        f"at most {args.new_tokens} new tokens, greedy, EOS honoured"
    )
    for name in sides:
        per_row = statistics.mean(tokens[name]) / args.prompts
        rates = [rate for _, rate in rounds.wall[name]]
        print(
            f"{name:6}: best {max(rates):.1f} tok/s, median {statistics.median(rates):.1f} "
            f"(runs {min(rates):.1f} to {max(rates):.1f}), {per_row:.1f} tokens a row"
        )
    rounds.report("guided", "free")


if __name__ == "__main__":
    main()
