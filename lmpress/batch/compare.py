"""`--compare`: a short report on how a `--models` job's models answered the same rows.

- Agreement: a row's replies agree when they are equal once whitespace is normalised (runs of
  spaces and newlines made one space, ends stripped); the report gives the rows where every
  model agrees, and each pair's share.
- Per model: rows answered, the mean reply length in characters, and the refusal rate. A
  reply is a refusal when its first sentence opens with a refusal phrase (`REFUSALS`: "I
  can't", "I'm sorry", "As an AI" ...) or the API said `content_filter`: a cheap screen,
  not a classifier; it misses a refusal phrased otherwise.
- Scored rows (loglikelihood and perplexity rows, `lmpress eval`'s tasks): each metric's mean
  per model, side by side (accuracy where rows carry `gold`).

Only hashes of the replies and running sums are kept, so memory grows by a few bytes a row.
"""

from __future__ import annotations

import hashlib
import re
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

REFUSALS = re.compile(
    r"^(i\s*(?:'m|am)\s*(?:sorry|unable|not able)|i\s*(?:can(?:'|no)t|cannot|won't|will not)"
    r"|sorry,? (?:but )?i|as an ai\b|i apologi[sz]e)",
    re.IGNORECASE,
)
METRICS = ("logprob", "perplexity", "is_greedy", "correct")  # a scored row's, averaged


def normalised(text: str) -> str:
    return " ".join(text.split())


def is_refusal(text: str, finish_reason: str | None = None) -> bool:
    return finish_reason == "content_filter" or bool(REFUSALS.match(text.strip()))


@dataclass
class ModelTally:
    rows: int = 0
    chars: int = 0
    refusals: int = 0
    metrics: dict[str, list[float]] = field(default_factory=lambda: defaultdict(lambda: [0, 0]))

    def add_metric(self, name: str, value: Any) -> None:
        if isinstance(value, (bool, int, float)):
            sums = self.metrics[name]
            sums[0] += float(value)
            sums[1] += 1


@dataclass
class Comparison:
    """What --compare reports, gathered a row at a time."""

    models: list[str]
    tallies: dict[str, ModelTally] = field(default_factory=dict)
    replies: dict[str, dict[str, bytes]] = field(default_factory=lambda: defaultdict(dict))

    def __post_init__(self) -> None:
        self.tallies = {m: ModelTally() for m in self.models}

    def add(self, model: str, row_id: str, line: dict[str, Any]) -> None:
        tally = self.tallies[model]
        for name in METRICS:
            tally.add_metric(name, _scores(line).get(name))
        reply = reply_of(line)
        if reply is None:
            return
        text, finish = reply
        tally.rows += 1
        tally.chars += len(text)
        tally.refusals += is_refusal(text, finish)
        digest = hashlib.blake2b(normalised(text).encode(), digest_size=8).digest()
        self.replies[row_id][model] = digest

    def markdown(self) -> str:
        lines = ["# Model comparison", ""]
        lines += self._agreement()
        lines += ["", "| model | rows | mean length (chars) | refusals |", "|---|---:|---:|---:|"]
        for model, t in self.tallies.items():
            mean = t.chars / t.rows if t.rows else 0.0
            rate = f"{t.refusals} ({t.refusals / t.rows:.0%})" if t.rows else "0"
            lines.append(f"| {model} | {t.rows} | {mean:.1f} | {rate} |")
        lines += self._metrics()
        return "\n".join(lines) + "\n"

    def _agreement(self) -> list[str]:
        shared = [r for r in self.replies.values() if len(r) == len(self.models)]
        same = sum(1 for r in shared if len(set(r.values())) == 1)
        out = [f"Replies that agree across all models (whitespace normalised): {same} of "
               f"{len(shared)} rows answered by every model."]  # fmt: skip
        if len(self.models) > 2:
            out += ["", "| pair | agree |", "|---|---:|"]
            for a, b in combinations(self.models, 2):
                both = [r for r in self.replies.values() if a in r and b in r]
                agree = sum(1 for r in both if r[a] == r[b])
                out.append(f"| {a} / {b} | {agree} of {len(both)} |")
        return out

    def _metrics(self) -> list[str]:
        names = [n for n in METRICS if any(t.metrics[n][1] for t in self.tallies.values())]
        if not names:
            return []
        out = ["", "| metric | " + " | ".join(self.models) + " |"]
        out.append("|---|" + "---:|" * len(self.models))
        for name in names:
            means = [t.metrics[name] for t in self.tallies.values()]
            cells = [f"{s / n:.4f}" if n else "-" for s, n in means]
            out.append(f"| {'accuracy' if name == 'correct' else name} | {' | '.join(cells)} |")
        return out


def compare(models: list[str], rows: Iterable[tuple[str, str, dict[str, Any]]]) -> Comparison:
    """The comparison of (model, row id, output line) triples."""
    comparison = Comparison(models)
    for model, row_id, line in rows:
        comparison.add(model, row_id, line)
    return comparison


def reply_of(line: dict[str, Any]) -> tuple[str, str | None] | None:
    """A generated row's reply and finish reason, from an lmpress row, a Parquet row or an
    OpenAI Batch output line; None for a row with no reply (scored, failed)."""
    response = line.get("response")
    if isinstance(response, str):  # a Parquet row
        return response, line.get("finish_reason")
    if not isinstance(response, dict):
        return None
    body = response.get("body")
    if isinstance(body, dict):
        choices = body.get("choices") or [{}]
        choice = choices[0] if isinstance(choices[0], dict) else {}
        message = choice.get("message")
        text = message.get("content") if isinstance(message, dict) else choice.get("text")
        return (text, choice.get("finish_reason")) if isinstance(text, str) else None
    text = response.get("text")
    return (text, response.get("finish_reason")) if isinstance(text, str) else None


def _scores(line: dict[str, Any]) -> dict[str, Any]:
    """A scored row's scores: the row's own columns, or an OpenAI line's body."""
    response = line.get("response")
    body = response.get("body") if isinstance(response, dict) else None
    return body if isinstance(body, dict) and "object" in body else line


def part_rows(models: list[tuple[str, Iterator[dict[str, Any]]]], id_of: Any) -> Iterator:
    for model, lines in models:
        for line in lines:
            rid = id_of(line)
            if rid is not None:
                yield model, rid, line
