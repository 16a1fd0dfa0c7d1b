"""What a step is at run time: given one row (and its key), an Outcome. The runner owns the
queues, the journal and the keys; a step only turns a row into rows, a drop or a failure.

A failure is data (`Outcome.error`), never an exception through the job: the row goes to the
rejects and the job goes on, as a failed request does in `lmpress batch`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any

from lmpress.vocabulary.types import Usage


@dataclass
class Outcome:
    rows: list[dict[str, Any]] = field(default_factory=list)  # what goes on (none: dropped)
    dropped: str | None = None  # why the row was dropped (a filter, a dedupe) -> rejects
    error: str | None = None  # the row failed (engine error, unparsable reply) -> rejects
    usage: Usage | None = None  # tokens spent


class Step(ABC):
    """One step of a running pipeline."""

    # A step that can make several rows of one gives each a child key (KEY/0003), whatever
    # the count a row happens to get, so a key says the same thing in every run.
    fans_out: bool = False
    # A barrier takes all its input before it decides anything (dedupe): `decide` is called
    # in key order, so its result does not depend on which row arrived first.
    barrier: bool = False

    def __init__(self, name: str, concurrency: int = 64):
        self.name = name
        self.concurrency = concurrency

    @abstractmethod
    async def run(self, key: str, row: dict[str, Any]) -> Outcome:
        """The step's outcome for one row; exceptions only for bugs."""

    async def run_all(
        self, items: Iterable[tuple[str, dict[str, Any]]]
    ) -> AsyncIterator[tuple[str, dict[str, Any], Outcome]]:
        """A barrier's (key, row, outcome) for each of its rows, decided in their (key) order:
        one at a time unless the step does better (a dedupe embedding many rows a call).
        `items` is streamed (read from the journal): a step keeps only what it must."""
        for key, row in items:
            yield key, row, await self.run(key, row)


def exploded(rows: list[dict[str, Any]], column: str | None) -> list[dict[str, Any]]:
    """Each row with a list in `column` becomes one row per item (the column holding the
    item); a row whose column is no list stays one row."""
    if column is None:
        return rows
    out = []
    for row in rows:
        items = row.get(column)
        if isinstance(items, list):
            out.extend({**row, column: item} for item in items)
        else:
            out.append(row)
    return out
