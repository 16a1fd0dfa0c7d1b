"""How many of its drafts each row carries in one NATIVE step when rows draft
(engines/local/speculation.py gives the rule; scheduling.py applies it): the counts that emit
the most tokens for the step's cost.

A NATIVE step is one forward pass over every row, each row carrying its next token and its
drafts; the pass's fixed work (reading the weights, the per-layer and per-step overheads) is
paid once, and a ragged step lays rows out as wide as the widest for attention. So a row's
drafts are worth carrying while what they are expected to emit beats what they cost, and a
lone row's drafts seldom pay for widening every row's attention (llamacpp/speculation.py plans
the same step over llama.cpp's micro-batches).
"""

from __future__ import annotations

from collections.abc import Sequence

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
