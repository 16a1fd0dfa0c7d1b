"""The steps that run no model: a filter (a sandboxed expression, or a function returning
truthy to keep) and a map (a function returning the new row, or None to drop it). A function
that raises fails that row alone, the exception's first line its reason."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lmpress.pipeline.steps.base import Outcome, Step, exploded
from lmpress.vocabulary.errors import first_line


class Filter(Step):
    def __init__(self, name: str, keep: Callable[[dict[str, Any]], Any], says: str):
        super().__init__(name, concurrency=1)
        self.keep = keep
        self.says = says  # the expression or module:function, for the rejects' reason

    async def run(self, key: str, row: dict[str, Any]) -> Outcome:
        try:
            kept = self.keep(row)
        except Exception as exc:
            return Outcome(error=f"{self.says}: {first_line(exc)}")
        if kept:
            return Outcome(rows=[row])
        return Outcome(dropped=f"filter {self.says} is false")


class Map(Step):
    def __init__(self, name: str, function: Callable[[dict[str, Any]], Any], says: str,
                 explode: str | None):  # fmt: skip
        super().__init__(name, concurrency=1)
        self.function = function
        self.says = says
        self.explode = explode
        self.fans_out = explode is not None

    async def run(self, key: str, row: dict[str, Any]) -> Outcome:
        try:
            new = self.function(dict(row))
        except Exception as exc:
            return Outcome(error=f"{self.says} raised {type(exc).__name__}: {first_line(exc)}")
        if new is None:
            return Outcome(dropped=f"{self.says} returned None")
        if not isinstance(new, dict):
            return Outcome(error=f"{self.says} returned {type(new).__name__}, not a row (dict)")
        return Outcome(rows=exploded([new], self.explode))
