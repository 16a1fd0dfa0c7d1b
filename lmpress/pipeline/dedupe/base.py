"""What every dedupe method shares: the text a row is compared by, and deciding a stream of
rows one at a time (a method that can batch, as embedding does, overrides `decide_all`)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from lmpress.pipeline.dedupe.settings import DedupeSettings

# The step's embedding function (its model's vectors): texts -> a float32 array, a row a text (unit length or not).
Embed = Callable[[list[str]], Awaitable[Any]]


class RowDeduplicator:
    def __init__(self, settings: DedupeSettings) -> None:
        self.settings = settings

    def needs(self) -> set[str]:
        """The columns the step reads; empty when it reads every string column."""
        return set(self.settings.columns or ())

    def values(self, row: dict) -> list[tuple[str, Any]]:
        """The compared columns' names and values; a missing column's value is None. Without
        `columns`, the string columns by name: the same row gives the same values whatever
        order its columns came in."""
        names = self.settings.columns or sorted(k for k, v in row.items() if isinstance(v, str))
        return [(name, row.get(name)) for name in names]

    def text(self, row: dict) -> str:
        """What minhash shingles and the embedding model reads: the values, a line each."""
        return "\n".join(self.as_text(value) for _, value in self.values(row))

    def as_text(self, value: Any) -> str:
        """A string normalised if asked; any other value (null for a missing column) as its
        canonical JSON."""
        if not isinstance(value, str):
            return json.dumps(value, sort_keys=True, ensure_ascii=False)
        return " ".join(value.casefold().split()) if self.settings.normalize else value

    async def duplicate_of(self, key: str, row: dict) -> str | None:
        """None: keep the row (and remember it); else why it is dropped, naming the kept key."""
        raise NotImplementedError

    async def decide_all(
        self, items: AsyncIterator[tuple[str, dict]]
    ) -> AsyncIterator[tuple[str, str | None]]:
        """Each (key, row) as (key, reason or None), in the order given."""
        async for key, row in items:
            yield key, await self.duplicate_of(key, row)
