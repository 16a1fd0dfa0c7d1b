"""A set of row-id keys that costs 8 bytes a row, so a job's memory stays flat in practice
however many rows its input holds.

A Python `set` of 64-bit ints costs about 100 bytes a key (the int object plus the table
slot); at ten million rows that is a gigabyte just to know which rows are done. `IdKeys`
keeps the keys in `array('Q')`s, 256 of them split by the key's top byte: keys are added in
any order, `freeze()` sorts each array once, and lookups are binary searches.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Iterable, Iterator

_BUCKETS = 256
_SHIFT = 56  # the top byte of a 64-bit key picks its bucket


class IdKeys:
    def __init__(self, keys: Iterable[int] = ()):
        self._buckets = [array("Q") for _ in range(_BUCKETS)]
        self._frozen = False
        for key in keys:
            self.add(key)

    def add(self, key: int) -> None:
        if self._frozen:
            raise RuntimeError("IdKeys is frozen")
        self._buckets[key >> _SHIFT].append(key)

    def freeze(self) -> int | None:
        """Sort the keys for lookups; returns a key that was added twice, if any (the keys
        are kept as added, repeats included)."""
        repeated = None
        for index, bucket in enumerate(self._buckets):
            ordered = sorted(bucket)  # one bucket at a time: 1/256 of the keys as objects
            if repeated is None and len(set(ordered)) != len(ordered):
                repeated = next(a for a, b in zip(ordered, ordered[1:], strict=False) if a == b)
            self._buckets[index] = array("Q", ordered)
        self._frozen = True
        return repeated

    def repeats(self) -> int:
        """How many keys were added again after their first time, found as `freeze` finds
        one, one bucket at a time, without freezing: more keys may be added after."""
        count = 0
        for bucket in self._buckets:
            ordered = sorted(bucket)
            count += sum(1 for a, b in zip(ordered, ordered[1:], strict=False) if a == b)
        return count

    def __contains__(self, key: int) -> bool:
        if not self._frozen:
            self.freeze()
        bucket = self._buckets[key >> _SHIFT]
        at = bisect_left(bucket, key)
        return at < len(bucket) and bucket[at] == key

    def __len__(self) -> int:
        return sum(len(bucket) for bucket in self._buckets)

    def __bool__(self) -> bool:
        return any(self._buckets)

    def __iter__(self) -> Iterator[int]:
        for bucket in self._buckets:
            yield from bucket
