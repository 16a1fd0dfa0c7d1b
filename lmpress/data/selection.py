"""Which of the input's rows a job runs: a shard (`--shard I/N`), the first N (`--limit N`), or
a reproducible random N (`--sample N --seed S`).

A row's place is counted within its shard, so `--shard 0/4 --limit 100` is the first hundred
rows of that shard. Sampling is reservoir sampling over the scan every job makes before it
starts: one pass, and memory for the N rows picked, not for the input. The same seed picks the
same rows from the same input. Neither limit nor sample is part of a job's fingerprint: a job
tried on `--limit 10` resumes into the whole input, its first ten rows already done.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from lmpress.vocabulary.errors import InputError


@dataclass
class RowSelection:
    shard: tuple[int, int] | None = None  # (I, N): every N-th row starting at I
    limit: int | None = None
    sample: int | None = None
    seed: int = 0
    _picked: set[int] | None = field(default=None, init=False, repr=False)
    _reservoir: list[int] = field(default_factory=list, init=False, repr=False)
    _rng: random.Random | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.limit is not None and self.limit < 1:
            raise InputError(f"--limit {self.limit}: must be at least 1")
        if self.sample is not None and self.sample < 1:
            raise InputError(f"--sample {self.sample}: must be at least 1")
        if self.limit is not None and self.sample is not None:
            raise InputError("--limit and --sample: give one of them")

    @property
    def shard_label(self) -> str | None:
        return f"{self.shard[0]}/{self.shard[1]}" if self.shard else None

    def in_shard(self, ordinal: int) -> bool:
        """Whether the input's row at `ordinal` (0-based, blank lines not counted) is this
        shard's."""
        return self.shard is None or ordinal % self.shard[1] == self.shard[0]

    def place(self, ordinal: int) -> int:
        """A shard's row's place within the shard (0-based)."""
        return ordinal if self.shard is None else ordinal // self.shard[1]

    # --- the scan --------------------------------------------------------------------------

    def offer(self, place: int) -> int | None:
        """The scan offers each shard row's place, in order. Returns whether the row is
        picked: its place, or, when sampling, the place of the row it pushed out of the
        reservoir (-1 for none), or None when the row is not picked."""
        if self.sample is None:
            return place if self.limit is None or place < self.limit else None
        if self._rng is None:
            self._rng = random.Random(self.seed)
        if place < self.sample:
            self._reservoir.append(place)
            return -1
        slot = self._rng.randrange(place + 1)
        if slot >= self.sample:
            return None
        pushed, self._reservoir[slot] = self._reservoir[slot], place
        return pushed

    def scanned(self) -> None:
        """The scan is over: the sample is fixed."""
        if self.sample is not None:
            self._picked = set(self._reservoir)
            self._reservoir = []

    def picks(self, ordinal: int) -> bool:
        """Whether the job runs the input's row at `ordinal`."""
        if not self.in_shard(ordinal):
            return False
        place = self.place(ordinal)
        if self.limit is not None:
            return place < self.limit
        if self.sample is not None:
            assert self._picked is not None, "scanned() comes first"
            return place in self._picked
        return True
