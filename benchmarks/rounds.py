"""What the throughput benchmarks share: prompts of mixed lengths, lmpress's side of a run, and
rounds that time each side in turn so drift in the machine's load hits both alike.

These machines are shared, so one run of a side says little. `Rounds` keeps every run and
reports two ratios: best against best (each side at its least disturbed), and the median of
the per-round ratios (each round's sides ran back to back, under much the same load).
"""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Callable

from lmpress.vocabulary.types import GenerationParams, Message, Request

WORDS = "the quick brown fox jumps over a lazy dog while rivers run to the sea".split()

# Chat prompts for a real model: tasks whose replies run from a few tokens to hundreds, some
# behind a block of notes, so prompts and replies both vary in length.
TOPICS = ["cats", "tea", "snow", "iron", "rain", "bread", "the moon", "volcanoes", "bees",
          "the ocean", "trains", "chess", "coffee", "rivers", "music", "glass"]  # fmt: skip
TASKS = [
    "What is {t}?",
    "Tell me a fact about {t}.",
    "Write a haiku about {t}.",
    "Explain {t} to a child in two sentences.",
    "Write a short story about {t}.",
    "List five facts about {t}.",
    "Write an essay about the history of {t}.",
    "Is {t} useful? Answer yes or no.",
]
NOTES = [
    "I visited my grandmother last week and we talked for hours.",
    "The weather has been cold and grey since the start of the month.",
    "My team at work is planning a trip to the mountains in spring.",
    "I have been reading a lot about science and nature lately.",
    "Our neighbours keep bees and sometimes give us honey.",
    "The library near my house has a good collection of old maps.",
    "I am trying to learn to cook simple meals at home.",
    "Last summer we took a train along the coast and saw the sea.",
]


def mixed_prompts(count: int, max_words: int, seed: int = 0) -> list[str]:
    """`count` prompts of 4 to `max_words` words, the same ones for the same seed."""
    rng = random.Random(seed)
    return [
        " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, max_words))) for _ in range(count)
    ]


def chat_prompts(count: int, seed: int = 0) -> list[str]:
    """`count` chat prompts: a task about a topic, a third of them after 2 to 8 sentences of
    notes; the same ones for the same seed."""
    rng = random.Random(seed)
    prompts = []
    for _ in range(count):
        task = rng.choice(TASKS).format(t=rng.choice(TOPICS))
        if rng.random() < 1 / 3:
            notes = " ".join(rng.sample(NOTES, rng.randint(2, len(NOTES))))
            task = f"Some notes about me: {notes} Now, {task[0].lower()}{task[1:]}"
        prompts.append(task)
    return prompts


# Copy-heavy prompts (speculative decoding's workload): a paragraph of templated sentences
# about a payment, with typos in it, to return fixed in full or to pull fields out of.
NAMES = ["Hannah Lee", "Marcus Brown", "Priya Patel", "Tomas Novak", "Grace Okafor", "Liam Walsh"]
CITIES = ["Boston", "Lisbon", "Nairobi", "Osaka", "Toronto", "Krakow", "Denver", "Seville"]
MONTHS = ["January", "March", "April", "June", "August", "October", "November", "December"]
SENTENCES = [
    "On {date} the committee met in {city} to discuss the annual budget.",
    "{name} presented the figures, which showed a payment of {amount} dollars.",
    "Everyone agreed that the payment should be reviewed before the end of the month.",
    "The meeting lasted longer than planned because several members asked questions.",
    "After a short break the group looked at the travel costs of the last quarter.",
    "{name} said the office in {city} would send a full report within two weeks.",
    "Some members thought the amount was too high for a project of this size.",
    "Others pointed out that prices in {city} had risen sharply during the year.",
    "In the end the committee approved the payment of {amount} dollars to the contractor.",
    "The next meeting will take place in the same building at the usual time.",
    "Minutes of the meeting were written by {name} and shared with every member.",
    "Questions about the budget should be sent to the finance office by email.",
]
COPY_TASKS = [
    "Fix the typos in this paragraph and return it in full:\n\n{text}",
    "Extract the name, date, city and amount from this text as JSON:\n\n{text}",
]


def copy_prompts(count: int, seed: int = 0) -> list[str]:
    """`count` copy-heavy prompts: a paragraph of about 150 words from templated sentences, with
    a letter swapped in about one word in eight; half ask for it back with the typos fixed, half
    for its name, date, city and amount as JSON. The same ones for the same seed."""
    rng = random.Random(seed)
    prompts = []
    for i in range(count):
        fields = {
            "name": rng.choice(NAMES),
            "city": rng.choice(CITIES),
            "date": f"{rng.choice(MONTHS)} {rng.randint(1, 28)}",
            "amount": f"{rng.randint(1, 99)},{rng.randint(0, 999):03d}",
        }
        sentences = rng.sample(SENTENCES, 10)
        words = " ".join(s.format(**fields) for s in sentences).split()
        for j, word in enumerate(words):
            if len(word) > 3 and word.isalpha() and rng.random() < 1 / 8:
                k = rng.randrange(len(word) - 1)
                words[j] = word[:k] + word[k + 1] + word[k] + word[k + 2 :]
        prompts.append(COPY_TASKS[i % 2].format(text=" ".join(words)))
    return prompts


def lmpress_generate(
    engine,
    prompts: list[str],
    new_tokens: int,
    eos: bool = False,
    system: str | None = None,
    temperature: float = 0.0,
) -> int:
    """Every prompt through the engine (as a user message after `system`, where given), exactly
    `new_tokens` tokens each (EOS held off), or up to `new_tokens` with `eos`, greedy or sampled
    at `temperature` (row i seeded with i); returns the tokens generated."""
    min_tokens = 0 if eos else new_tokens
    opening = [Message("system", system)] if system else []
    requests = [
        Request(
            str(i),
            [*opening, Message("user", p)],
            GenerationParams(
                max_new_tokens=new_tokens,
                min_tokens=min_tokens,
                temperature=temperature,
                seed=i if temperature else None,
            ),
        )
        for i, p in enumerate(prompts)
    ]
    results = engine.generate(requests)
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
        self.record(round_no, name, *timed(work))

    def run_side(self, round_no: int, side: SideProcess) -> None:
        """Run a side in its own process (see SideProcess) and print the run's line."""
        self.record(round_no, side.name, *side.run())

    def record(self, round_no: int, name: str, tokens: int, wall_s: float, cpu_s: float) -> None:
        wall, cpu = tokens / wall_s, tokens / cpu_s
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


def timed(work: Callable[[], int]) -> tuple[int, float, float]:
    """Tokens `work` generated, the wall seconds and this process's CPU seconds it took."""
    started, cpu_started = time.perf_counter(), time.process_time()
    tokens = work()
    return tokens, time.perf_counter() - started, time.process_time() - cpu_started


class SideProcess:
    """One side of a comparison, loaded once in a process of its own and run on request.

    Two sides that use OpenMP (llama.cpp, PyTorch) in one process keep two thread teams; on a
    machine with as many cores as one team has threads, libgomp sees more threads than cores
    and stops spinning at barriers, which slows both sides (llama.cpp's per-token path most)
    in a way neither shows when run alone, as users run them. `build(*args)` runs in the
    child: it loads the side, warms it up and returns the work to time.
    """

    def __init__(self, name: str, build: Callable[..., Callable[[], int]], *args: object):
        import multiprocessing

        self.name = name
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self._process = context.Process(target=_serve, args=(build, args, child), daemon=True)
        self._process.start()
        child.close()
        self._answer()  # loaded and warmed up

    def run(self) -> tuple[int, float, float]:
        self._conn.send("run")
        return self._answer()

    def peak_rss_mib(self) -> tuple[float, float]:
        """The most memory the side's process has held (its peak resident set): over its
        whole life, loading included, and since it was loaded and warmed up, where Linux can
        tell (NaN elsewhere)."""
        self._conn.send("rss")
        return self._answer()

    def close(self) -> None:
        self._conn.send(None)
        self._process.join()

    def _answer(self):
        answer = self._conn.recv()
        if isinstance(answer, BaseException):
            raise RuntimeError(f"{self.name} failed in its process") from answer
        return answer


def _serve(build: Callable[..., Callable[[], int]], args: tuple, conn) -> None:
    try:
        work = build(*args)
        since_loaded = reset_peak_rss()
        conn.send("ready")
        while (command := conn.recv()) is not None:
            if command == "rss":
                conn.send((peak_rss_mib(), running_peak_rss_mib() if since_loaded else math.nan))
            else:
                conn.send(timed(work))
    except BaseException as exc:  # shown by the parent
        conn.send(exc)


def peak_rss_mib() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def reset_peak_rss() -> bool:
    """Start this process's peak resident set again from what it holds now (Linux: VmHWM),
    so that loading a model stops counting; False where that cannot be done."""
    try:
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")
        return True
    except OSError:
        return False


def running_peak_rss_mib() -> float:
    """The peak resident set since `reset_peak_rss`."""
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


def _best(runs: list[tuple[int, float]]) -> float:
    return max(rate for _, rate in runs)


def _by_round(runs: list[tuple[int, float]]) -> dict[int, float]:
    """A side's mean rate in each round (it may run more than once a round, as in ABBA)."""
    rounds: dict[int, list[float]] = {}
    for round_no, rate in runs:
        rounds.setdefault(round_no, []).append(rate)
    return {round_no: statistics.mean(rates) for round_no, rates in rounds.items()}
