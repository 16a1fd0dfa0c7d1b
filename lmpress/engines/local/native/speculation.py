"""How many of its drafts each row carries in one NATIVE step when rows draft
(engines/local/speculation.py gives the rule): the counts that emit the most tokens for the
step's cost; and the step's drafting itself, which scheduling.py calls: each row's drafts
(`row_drafts`), their verification (`verify`) and what each row kept (`settle`).

A NATIVE step is one forward pass over every row, each row carrying its next token and its
drafts; the pass's fixed work (reading the weights, the per-layer and per-step overheads) is
paid once, and a ragged step lays rows out as wide as the widest for attention. So a row's
drafts are worth carrying while what they are expected to emit beats what they cost, and a
lone row's drafts seldom pay for widening every row's attention (llamacpp/speculation.py plans
the same step over llama.cpp's micro-batches).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from lmpress.engines.local.speculation import SpeculationCounts

# What a decode step's fixed work (reading the weights, the per-layer and per-step overheads)
# is worth in tokens carried, for draft_counts. SmolLM2 at float32 on a 2-core
# CPU, 16 rows after 300-token prompts: a step carrying 5 tokens a row took 1.95 times one
# carrying 1 (1.30 for 2, 1.36 for 3), about 50 tokens' worth, measured under load; taken
# lower, since a loaded machine inflates the fixed part.
STEP_COST = 32
# What one more place in every row's attention costs, in tokens carried, each place the widest
# row carries past the first (a ragged step lays rows out as wide as the widest for
# attention). 16 rows after chat prompts: 16 tokens in 65 ms; 32 tokens as 2 a row 93 ms, as 5
# in 4 rows 105, as 3 in 8 rows 100 (about 1.75 ms a token, 3.5 to 4 ms a place of every row).
WIDEN = 0.15


def draft_counts(
    chances: Sequence[float], drafts: Sequence[int], step_cost: float, widen: float = 0.0
) -> list[int]:
    """How many of its drafts each row carries in a step where every row carries its own count
    (its next token, then its drafts): the counts that emit the most tokens for the step's
    cost. A step costs `step_cost` tokens' worth of fixed work (reading the weights, the step's
    own overheads), one per token carried, and `widen` per row for each place the widest row
    carries past the first (attention lays every row out as wide as the widest). A row's j-th
    draft is emitted with chance**j, so for each width the drafts worth carrying are the best
    ones while they beat the step's tokens per cost so far: with many rows, a lone row's
    drafts seldom pay for widening every row's attention. Decided from acceptance counts and
    row counts only, never from timings."""
    rows = len(drafts)
    worth = sorted(
        (
            (chance**j, j, b)
            for b, (chance, d) in enumerate(zip(chances, drafts, strict=True))
            for j in range(1, d + 1)
        ),
        reverse=True,
    )
    best, best_rate = [0] * rows, rows / (step_cost + rows)
    for width in range(1, max(drafts, default=0) + 1):
        counts = [0] * rows
        emitted, cost = float(rows), step_cost + rows + widen * rows * width
        for value, j, b in worth:
            if j > width:
                continue
            if value * cost <= emitted:  # value <= emitted / cost: it would lower the rate
                break
            counts[b] += 1
            emitted, cost = emitted + value, cost + 1
        if emitted / cost > best_rate:
            best, best_rate = counts, emitted / cost
    return best


def row_drafts(rows: list, drafter: Any) -> list[list[int]]:
    """Each row's drafts this step ([] for none): as many as its acceptance asks for and its
    budget leaves, cut to the counts that pay for their place in the step (`draft_counts`);
    `drafter`: the draft model's (drafting.py), None for prompt lookup."""
    rooms = [row.limit - row.generated - 1 for row in rows]
    chances = [row.drafts.chance if row.drafts else 0.0 for row in rows]
    if drafter is not None:
        # A draft model's drafts cost passes of their own: decide their number first.
        wanted = [
            row.drafts.wanted(room) if row.drafts else 0
            for row, room in zip(rows, rooms, strict=True)
        ]
        if not any(wanted):
            return [[] for _ in rows]
        return drafter.propose(draft_counts(chances, wanted, STEP_COST, WIDEN))
    drafts = [
        row.drafts.propose(room) if row.drafts else []
        for row, room in zip(rows, rooms, strict=True)
    ]
    if any(drafts):
        counts = draft_counts(chances, [len(d) for d in drafts], STEP_COST, WIDEN)
        drafts = [d[:n] for d, n in zip(drafts, counts, strict=True)]
    return drafts


def verify(
    rows: list, drafts: list[list[int]], logits: Any, pick: Callable[[list, Any], None]
) -> list[list[int]]:
    """Each row's tokens from a step that verified drafts: at each position, every row still
    going picks its token as a plain step would (`pick`), and goes on only while that token is
    the one it drafted there (engines/local/speculation.py gives the rule)."""
    emitted: list[list[int]] = [[] for _ in rows]
    going = list(range(len(rows)))
    for j in range(logits.shape[1]):
        going = [b for b in going if rows[b].finish_reason is None]
        if not going:
            break
        picked = [rows[b] for b in going]
        pick(picked, logits[going, j] if len(going) < len(rows) else logits[:, j])
        for b, row in zip(going, picked, strict=True):
            emitted[b].append(row.last)
        going = [b for b in going if j < len(drafts[b]) and rows[b].last == drafts[b][j]]
    return emitted


def settle(
    rows: list, drafts: list[list[int]], emitted: list[list[int]], counts: SpeculationCounts
) -> list[int]:
    """Tell each drafting row what it drafted and kept, and count it; returns how many drafts
    each row kept."""
    kept_all = []
    for row, d, e in zip(rows, drafts, emitted, strict=True):
        kept = 0
        while kept < min(len(d), len(e)) and d[kept] == e[kept]:
            kept += 1
        kept_all.append(kept)
        if row.drafts is None:
            continue
        row.drafts.settle(len(d), kept, e)
        counts.add(len(d), kept)
    return kept_all
