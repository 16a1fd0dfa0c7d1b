"""How many tokens each row being generated carries in one LLAMACPP step when it drafts
(engines/local/speculation.py): its next token, then up to its drafts, then maybe fillers.

The engine's KV cache is split by sequence (`kv_unified` false: a step costs the same
whatever the other sequences hold), and over a split cache llama.cpp cuts a batch into
micro-batches that each take a run of consecutive sequence ids and the same number of tokens
from each; every micro-batch is a pass over all the weights. Rows carrying 1, 5, 1, 5 tokens
therefore cost one pass for the first token of each and one more for each drafting row, while
rows all carrying 5 cost one. Measured on SmolLM2-135M F16 here (16 rows after 250-token
prompts, the quietest of four runs): 16 tokens 55 ms, 48 tokens 135 ms, 80 tokens 224 ms in
one pass each, but 1, 5, 1, 5... (48 tokens, 9 passes) 272 ms. A unified cache has no such
split but makes every token attend over every sequence's cells: 16 one-token rows then took
190–300 ms, so the engine keeps its split cache and plans each step instead.

`plan` weighs, for each draft length k, two shapes of the step: every drafting row carrying
up to k of its drafts (more passes when the counts differ), and every row carrying exactly k
(rows short of k filled with filler tokens, which are verified like drafts and mostly
rejected: one pass). It picks the shape that emits the most tokens for its cost, counted in
tokens with a pass worth PASS_COST more, from each row's kept share of the draft positions it
tried. The step's shape depends on acceptance counts and row counts only, never on timings.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# What one more micro-batch costs, in tokens decoded: a pass's fixed part (reading the
# weights, the graph) over one token's share, from the figures above (about 13 ms a pass,
# 2.6 ms a token).
PASS_COST = 5
# A row's chance that a draft position is kept, before it has tried any, counted as
# PRIOR_KEPT kept of PRIOR_TRIED: hopeful enough that a row's drafts are tried at all.
PRIOR_KEPT, PRIOR_TRIED = 4, 5


@dataclass
class Candidate:
    """A row being generated, as the planner sees it."""

    seq_id: int
    drafts: int  # drafted tokens it proposes this step
    room: int  # the most tokens it may carry after its next one (drafts and fillers)
    kept: int = 0  # draft positions it had kept, all steps
    tried: int = 0  # draft positions it had verified, all steps (each kept one and a miss)

    @property
    def chance(self) -> float:
        return (self.kept + PRIOR_KEPT) / (self.tried + PRIOR_TRIED)


def micro_batches(parts: Sequence[tuple[int, int]], n_ubatch: int) -> int:
    """How many micro-batches llama.cpp's split over a per-sequence cache
    (`split_equal(sequential=true)`) cuts a batch into; `parts` are (sequence id, tokens) in
    sequence-id order, each sequence's tokens together."""
    left = [[seq, count] for seq, count in parts if count > 0]
    passes = 0
    while left:
        run = [left[0]]  # the lowest sequence and the consecutive ids after it
        for part in left[1:]:
            if part[0] != run[-1][0] + 1:
                break
            run.append(part)
        taken = min(part[1] for part in run)
        taken = max(1, min(taken, n_ubatch // len(run)))
        for part in run:
            part[1] -= taken
        left = [part for part in left if part[1] > 0]
        passes += 1
    return passes


def plan(
    rows: Sequence[Candidate], chunks: Sequence[tuple[int, int]], n_ubatch: int
) -> list[tuple[int, int]]:
    """For each row, how many of its drafts it carries this step and how many fillers after
    them; `chunks` are the (sequence id, tokens) of the prompts read in the same batch."""
    longest = max((row.drafts for row in rows), default=0)
    best = [(0, 0)] * len(rows)
    best_rate = _rate(rows, best, chunks, n_ubatch)
    for k in range(1, longest + 1):
        carried = [min(k, row.drafts) for row in rows]
        for shape in (
            [(d, 0) for d in carried],
            [(d, max(0, min(k, row.room) - d)) for row, d in zip(rows, carried, strict=True)],
        ):
            rate = _rate(rows, shape, chunks, n_ubatch)
            if rate > best_rate:
                best, best_rate = shape, rate
    return best


def _rate(
    rows: Sequence[Candidate],
    shape: Sequence[tuple[int, int]],
    chunks: Sequence[tuple[int, int]],
    n_ubatch: int,
) -> float:
    """Expected tokens emitted per unit of cost for one shape of the step."""
    emitted = 0.0
    for row, (drafts, _) in zip(rows, shape, strict=True):
        chance = row.chance
        emitted += 1 + sum(chance**j for j in range(1, drafts + 1))
    parts = [(row.seq_id, 1 + d + f) for row, (d, f) in zip(rows, shape, strict=True)]
    parts = sorted(parts + list(chunks))
    tokens = sum(count for _, count in parts)
    return emitted / (tokens + PASS_COST * micro_batches(parts, n_ubatch))
