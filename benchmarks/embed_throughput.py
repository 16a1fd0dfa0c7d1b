"""NATIVE embeddings against sentence-transformers' `encode`, and NATIVE's memory on 10x rows.

Throughput: both sides embed the same `--texts` texts of mixed length (2 to 400 words,
log-uniform, the same for the same seed) with MiniLM, each in a process of its own
(rounds.SideProcess), in rounds there and back (ABBA):

- sentence-transformers: `SentenceTransformer(dir).encode(texts, batch_size=32)`;
- lmpress: `LLM("minilm", task="embed", batch_size=32).embed(texts)`.

Both cut each text at MiniLM's 256 tokens; tok/s counts the tokens the model read. encode
sorts its texts by length before batching them too, so neither side pads much more than the
other: the ratio is about the two paths' own cost around the same forward passes.

`--memory`: the peak resident memory (after loading and warm-up) of embedding `--rows` texts
and 10x as many through `LLM.embed`, a chunk of 1,000 at a time as a script streaming over a
file would, each count in a process of its own; the ratio of the two peaks.

    .venv/bin/python benchmarks/embed_throughput.py [--texts 10000] [--rounds 3]
    .venv/bin/python benchmarks/embed_throughput.py --memory [--rows 10000]
"""

from __future__ import annotations

import argparse
import math
import random

from rounds import WORDS, Rounds, SideProcess

MODEL = "minilm"
BATCH_SIZE = 32
CHUNK = 1000


def mixed_texts(count: int, seed: int = 0) -> list[str]:
    """`count` texts of 2 to 400 words, log-uniform: many short, a few long."""
    rng = random.Random(seed)
    return [
        " ".join(rng.choice(WORDS) for _ in range(int(math.exp(rng.uniform(0.7, 6.0)))))
        for _ in range(count)
    ]


def tokens_read(texts: list[str]) -> int:
    """The tokens MiniLM reads of these texts: each cut at its limit."""
    from sentence_transformers import SentenceTransformer

    from lmpress.builtin_models.packaged import resolve_packaged_name

    model = SentenceTransformer(resolve_packaged_name(MODEL), device="cpu")
    limit = model.max_seq_length
    return sum(min(len(ids), limit) for ids in model.tokenizer(texts)["input_ids"])


def build_sentence_transformers(texts: list[str], tokens: int):
    from sentence_transformers import SentenceTransformer

    from lmpress.builtin_models.packaged import resolve_packaged_name

    model = SentenceTransformer(resolve_packaged_name(MODEL), device="cpu")
    model.encode(texts[:64], batch_size=BATCH_SIZE)  # warm-up

    def work() -> int:
        model.encode(texts, batch_size=BATCH_SIZE)
        return tokens

    return work


def build_lmpress(texts: list[str], tokens: int):
    from lmpress import LLM

    llm = LLM(MODEL, task="embed", batch_size=BATCH_SIZE)
    llm.embed(texts[:64])  # loads, and warms up

    def work() -> int:
        llm.embed(texts)
        return tokens

    return work


def build_streaming(rows: int):
    """Embed `rows` texts a chunk at a time, keeping nothing, as a script over a file would."""
    from lmpress import LLM

    llm = LLM(MODEL, task="embed", batch_size=BATCH_SIZE)
    llm.embed(mixed_texts(64))

    def work() -> int:
        done = 0
        for seed, start in enumerate(range(0, rows, CHUNK)):
            done += len(llm.embed(mixed_texts(min(CHUNK, rows - start), seed=seed)))
        return done

    return work


def throughput(texts: int, rounds_count: int) -> None:
    chosen = mixed_texts(texts)
    tokens = tokens_read(chosen)
    print(f"{texts} texts, {tokens} tokens read", flush=True)
    sides = [
        SideProcess("sentence-transformers", build_sentence_transformers, chosen, tokens),
        SideProcess("lmpress", build_lmpress, chosen, tokens),
    ]
    rounds = Rounds()
    try:
        for round_no in range(rounds_count):
            order = sides if round_no % 2 == 0 else sides[::-1]
            for side in order:
                rounds.run_side(round_no, side)
    finally:
        for side in sides:
            side.close()
    rounds.report("lmpress", "sentence-transformers")


def memory(rows: int) -> None:
    peaks = {}
    for count in (rows, 10 * rows):
        side = SideProcess(f"{count} rows", build_streaming, count)
        try:
            done, wall_s, _ = side.run()
            _, since_loaded = side.peak_rss_mib()
        finally:
            side.close()
        peaks[count] = since_loaded
        print(f"{done} rows in {wall_s:.1f} s: peak RSS after loading {since_loaded:.0f} MiB")
    print(f"peak RSS ratio, {10 * rows} rows / {rows} rows: {peaks[10 * rows] / peaks[rows]:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--memory", action="store_true", help="peak RSS at 10x rows instead")
    parser.add_argument("--rows", type=int, default=10_000, help="with --memory: the smaller run")
    args = parser.parse_args()
    if args.memory:
        memory(args.rows)
    else:
        throughput(args.texts, args.rounds)


if __name__ == "__main__":
    main()
