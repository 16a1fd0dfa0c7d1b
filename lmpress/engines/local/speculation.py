"""Speculative decoding, shared by the local engines that batch (NATIVE, LLAMACPP).

A row whose reply copies its prompt (fixing typos, extracting fields, rewriting) can be decoded
several tokens a step: `RowDrafts` proposes the tokens that followed the longest recent n-gram
matching the row's last tokens (prompt lookup: no second model), the engine verifies the row's
last token and its drafts in one forward pass of the batch, and the row keeps its drafts up to
the first one the model would not have chosen, plus the model's own token at that position.
With `model.draft_model` the drafts are a smaller model's greedy tokens instead
(native/drafting.py), and `RowDrafts` only decides how many a row asks for.

The rule an engine applies at each drafted position j, for a row's draft d_j:
- the row's own sampler picks y_j from the target's distribution at j, exactly as it would
  without speculation (greedy: the argmax; sampled: one draw from the row's generator);
- y_j is emitted; if y_j == d_j the row goes on to j + 1, else it stops there.

With a one-hot draft this is the standard speculative-sampling rule (accept d with probability
p(d), else sample from p with d removed), so sampled rows keep their distribution; and since
each emitted token takes exactly one draw, a seeded row gives the same tokens with speculation
on and off. Everything per row that follows the reply (penalties, grammars, stop strings,
budgets, logprobs) advances on emitted tokens only, one at a time, so nothing is rolled back but
the KV cache past the last emitted token.

A row whose drafts keep failing (free text) stops drafting, and tries a draft again a dozen or
so steps later, so it costs next to nothing: decisions use acceptance counts only, never
timings, so a job's choices do not depend on the machine's load. How many of its drafts a row
carries in a step is each engine's own plan, since it depends on how the engine batches
(native/speculation.py, llamacpp/speculation.py); a draft model's drafts are each engine's own
too (native/drafting.py, llamacpp/drafting.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lmpress.configs.schema import speculative_method
from lmpress.vocabulary.errors import ConfigError

if TYPE_CHECKING:
    from lmpress.configs.schema import ModelParams

# A new row's chance that a drafted token is kept: hopeful enough that its drafts are tried.
PRIOR_CHANCE = 0.8
# How far a step's kept share of its drafts moves the row's chance: recent steps count most,
# since a reply turns from copying its prompt to free text and back.
RECENT_WEIGHT = 0.3
# A row's j-th draft is drafted only while chance**j is at least this: a row whose drafts keep
# failing drafts none...
MIN_WORTH = 0.3
# ...and each step it drafts nothing, its chance moves this share of the way back to the
# prior, so that it tries again; a draft refused then drops it back at once, so a row whose
# reply does not copy drafts a token about every eight steps where it finds a match at all.
RECOVERY = 0.02


@dataclass(frozen=True)
class Speculation:
    """A model's speculative decoding settings (`model.speculative_method` and the fields
    after it), checked; `of` gives None when it is off."""

    method: str  # "ngram" or "draft_model"
    tokens: int  # drafted tokens a row may carry a step, at most
    lookup_min: int  # the shortest n-gram looked up
    lookup_max: int  # the longest n-gram looked up, tried first
    draft_model: str | None = None  # the model drafting, for "draft_model"

    @classmethod
    def of(cls, model: ModelParams) -> Speculation | None:
        method = speculative_method(model)
        if method == "off":
            return None
        if model.prompt_lookup_min > model.prompt_lookup_max:
            raise ConfigError(
                f"model.prompt_lookup_min: {model.prompt_lookup_min} is more than "
                f"model.prompt_lookup_max ({model.prompt_lookup_max}); lower it or raise the max"
            )
        return cls(
            method=method,
            tokens=model.num_speculative_tokens,
            lookup_min=model.prompt_lookup_min,
            lookup_max=model.prompt_lookup_max,
            draft_model=model.draft_model,
        )

    def row(self, prompt_ids: Iterable[int]) -> RowDrafts:
        """The drafting state of a row that starts from these prompt tokens."""
        return RowDrafts(self, prompt_ids)


class NgramIndex:
    """Where each n-gram of a growing token list last occurred, for n in [shortest, longest]:
    adding a token and looking up the list's own last n-gram both cost O(longest)."""

    def __init__(self, shortest: int, longest: int):
        self.shortest, self.longest = shortest, longest
        self.ids: list[int] = []
        # n-gram -> the position just after its latest occurrence whose next token is known
        self._after: dict[tuple[int, ...], int] = {}

    def extend(self, ids: Iterable[int]) -> None:
        ids_ = self.ids
        after = self._after
        for token in ids:
            end = len(ids_)  # the n-grams ending just before this token now have a successor
            for n in range(self.shortest, min(self.longest, end) + 1):
                after[tuple(ids_[end - n : end])] = end
            ids_.append(token)

    def continuation(self, count: int) -> list[int]:
        """Up to `count` tokens that followed the latest earlier occurrence of the longest
        n-gram the list ends with; [] when none occurred before."""
        ids_ = self.ids
        end = len(ids_)
        for n in range(min(self.longest, end), self.shortest - 1, -1):
            start = self._after.get(tuple(ids_[end - n :]))
            if start is not None:
                return ids_[start : start + count]
        return []


class RowDrafts:
    """One row's drafting: proposes tokens from its prompt and reply so far, and keeps its own
    chance that a draft is kept, to decide how many to draft, or whether to draft at all."""

    def __init__(self, speculation: Speculation, prompt_ids: Iterable[int]):
        self.speculation = speculation
        # Prompt lookup's n-grams; a draft model's row needs none.
        self.index: NgramIndex | None = None
        if speculation.method == "ngram":
            self.index = NgramIndex(speculation.lookup_min, speculation.lookup_max)
            self.index.extend(prompt_ids)
        self.chance = PRIOR_CHANCE  # that its next draft is kept, from its recent steps

    def wanted(self, room: int) -> int:
        """How many tokens the row drafts this step, at most `room` (what the row's budget and
        the context leave): those whose chance of being kept is worth drafting, none while
        its drafts keep failing."""
        wanted = 0
        while wanted < min(self.speculation.tokens, room) and (
            self.chance ** (wanted + 1) >= MIN_WORTH
        ):
            wanted += 1
        return wanted

    def propose(self, room: int) -> list[int]:
        """The tokens to verify after the row's last one by prompt lookup, at most `room`;
        [] while the row is not drafting."""
        wanted = self.wanted(room)
        if not wanted or self.index is None:
            return []
        return self.index.continuation(wanted)

    def settle(self, drafts: int, kept: int, emitted: Sequence[int]) -> None:
        """Record a step: `drafts` tokens were drafted and the first `kept` of them were kept;
        `emitted` are the tokens the row emitted this step (the kept drafts and the model's own
        token after them, or just its token when it drafted nothing)."""
        if self.index is not None:
            self.index.extend(emitted)
        if not drafts:
            self.chance += RECOVERY * max(0.0, PRIOR_CHANCE - self.chance)
            return
        self.chance += RECENT_WEIGHT * (kept / drafts - self.chance)


@dataclass
class SpeculationCounts:
    """A scheduler's running totals over all rows: tokens drafted and kept (read by tests and
    benchmarks)."""

    drafted: int = 0
    accepted: int = 0

    def add(self, drafts: int, kept: int) -> None:
        self.drafted += drafts
        self.accepted += kept
