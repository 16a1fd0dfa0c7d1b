"""What the throughput benchmarks share: prompts of mixed lengths, lmpress's side of a run, and
rounds that time each side in turn so drift in the machine's load hits both alike.

These machines are shared, so one run of a side says little. `Rounds` keeps every run and
reports two ratios: best against best (each side at its least disturbed), and the median of
the per-round ratios (each round's sides ran back to back, under much the same load).
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable

from lmpress.types import GenerationParams

WORDS = "the quick brown fox jumps over a lazy dog while rivers run to the sea".split()


def mixed_prompts(count: int, max_words: int, seed: int = 0) -> list[str]:
    """`count` prompts of 4 to `max_words` words, the same ones for the same seed."""
    rng = random.Random(seed)
    return [
        " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, max_words))) for _ in range(count)
    ]


def lmpress_generate(engine, prompts: list[str], new_tokens: int) -> int:
    """Every prompt through the engine, exactly `new_tokens` tokens each (EOS held off);
    returns the tokens generated."""
    params = GenerationParams(max_new_tokens=new_tokens, min_tokens=new_tokens)
    results = engine.generate(prompts, params)
    assert all(r.ok for r in results), [r.error for r in results if not r.ok][:1]
    return sum(r.usage.completion_tokens for r in results)


class Rounds:
    """Tokens per wall second and per CPU second of each named side, run by run."""

    def __init__(self) -> None:
        # name -> [(round number, rate)]
        self.wall: dict[str, list[tuple[int, float]]] = {}
        self.cpu: dict[str, list[tuple[int, float]]] = {}

    def run(self, round_no: int, name: str, work: Callable[[], int]) -> None:
        """Time `work` (which returns the tokens it generated) and print the run's line."""
        started, cpu_started = time.perf_counter(), time.process_time()
        tokens = work()
        wall = tokens / (time.perf_counter() - started)
        cpu = tokens / (time.process_time() - cpu_started)
        self.wall.setdefault(name, []).append((round_no, wall))
        self.cpu.setdefault(name, []).append((round_no, cpu))
        print(
            f"round {round_no} {name:17} {tokens} tokens  {wall:8.1f} tok/s  {cpu:8.1f} tok/CPU-s",
            flush=True,
        )

    def best(self, name: str) -> float:
        return _best(self.wall[name])

    def report(self, ours: str, theirs: str) -> None:
        """Print the ratios of `ours` to `theirs` by wall time and by CPU time."""
        for label, rates in (("wall time", self.wall), ("CPU time", self.cpu)):
            best = _best(rates[ours]) / _best(rates[theirs])
            ours_by_round, theirs_by_round = _by_round(rates[ours]), _by_round(rates[theirs])
            per_round = [
                ours_by_round[r] / theirs_by_round[r] for r in ours_by_round if r in theirs_by_round
            ]
            print(
                f"ratio {ours}/{theirs} ({label}): best {best:.2f}, median of rounds "
                f"{statistics.median(per_round):.2f} (rounds: "
                f"{', '.join(f'{r:.2f}' for r in per_round)})"
            )


def _best(runs: list[tuple[int, float]]) -> float:
    return max(rate for _, rate in runs)


def _by_round(runs: list[tuple[int, float]]) -> dict[int, float]:
    """A side's mean rate in each round (it may run more than once a round, as in ABBA)."""
    rounds: dict[int, list[float]] = {}
    for round_no, rate in runs:
        rounds.setdefault(round_no, []).append(rate)
    return {round_no: statistics.mean(rates) for round_no, rates in rounds.items()}
