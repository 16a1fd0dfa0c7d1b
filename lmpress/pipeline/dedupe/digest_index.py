"""The exact deduplicator's memory: each kept row's 128-bit digest and its key, in about 30 bytes
a row, where a Python dict of bytes to str takes over 150 (a pipeline can see tens of millions of
rows, and this memory grows with every row kept).

New entries go to a small dict; once it holds a fraction of what is stored, they are merged into
two sorted uint64 arrays (the digest's halves) and a fixed-width bytes array of keys, which a
lookup binary-searches. Growing the dict by a fraction of the whole keeps the merges' total cost
at a few copies of the arrays per doubling, and the dict itself a small part of the memory."""

from __future__ import annotations

import numpy as np

# The dict is merged when it holds this many entries, or a sixteenth of the sorted ones if more:
# its ~140 bytes an entry then add at most 9 a row to the arrays' 25, and the merges copy the
# arrays about 11 times each time they double.
MERGE_AT = 1024
MERGE_FRACTION = 16


class DigestIndex:
    """Digest (16 bytes) -> the key of the first row that had it."""

    def __init__(self) -> None:
        self._recent: dict[bytes, str] = {}
        self._high = np.empty(0, dtype=np.uint64)
        self._low = np.empty(0, dtype=np.uint64)
        self._keys = np.empty(0, dtype="S1")

    def __len__(self) -> int:
        return len(self._recent) + len(self._high)

    def get(self, digest: bytes) -> str | None:
        found = self._recent.get(digest)
        if found is not None:
            return found
        # As numpy scalars: a Python int below 2**63 would make numpy convert the whole array.
        high, low = (np.uint64(half) for half in _halves(digest))
        start = int(np.searchsorted(self._high, high, side="left"))
        end = int(np.searchsorted(self._high, high, side="right"))
        # Equal high halves are as rare as a 64-bit collision: the range is almost always 0 or 1.
        for i in range(start, end):
            if self._low[i] == low:
                return self._keys[i].decode("ascii")
        return None

    def add(self, digest: bytes, key: str) -> None:
        self._recent[digest] = key
        if len(self._recent) >= max(MERGE_AT, len(self._high) // MERGE_FRACTION):
            self._merge()

    def _merge(self) -> None:
        halves = [_halves(d) for d in self._recent]
        high = np.fromiter((h for h, _ in halves), dtype=np.uint64, count=len(halves))
        low = np.fromiter((lo for _, lo in halves), dtype=np.uint64, count=len(halves))
        width = max(self._keys.dtype.itemsize, *(len(k) for k in self._recent.values()))
        keys = np.array([k.encode("ascii") for k in self._recent.values()], dtype=f"S{width}")
        order = np.argsort(high, kind="stable")
        high, low, keys = high[order], low[order], keys[order]
        # Inserting a sorted block at its sorted places is one pass over the stored arrays.
        at = np.searchsorted(self._high, high, side="right")
        self._high = np.insert(self._high, at, high)
        self._low = np.insert(self._low, at, low)
        self._keys = np.insert(self._keys.astype(f"S{width}"), at, keys)
        self._recent.clear()


def _halves(digest: bytes) -> tuple[int, int]:
    return int.from_bytes(digest[:8], "little"), int.from_bytes(digest[8:16], "little")
