"""STAND-IN (branch core only): exact deduplication, to be replaced by the `dedupe` helper's
package of the same name and contract (theirs is a package too: the merge takes theirs)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from lmpress.vocabulary.errors import ConfigError


class ExactDeduplicator:
    def __init__(self, columns: list[str]):
        self.columns = columns
        self.seen: dict[str, str] = {}

    async def duplicate_of(self, key: str, row: dict[str, Any]) -> str | None:
        values = [row.get(c) for c in self.columns] if self.columns else row
        digest = hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()
        if digest in self.seen:
            return f"exact duplicate of {self.seen[digest]}"
        self.seen[digest] = key
        return None


def build_deduplicator(settings: dict[str, Any], embed: Any = None) -> ExactDeduplicator:
    if settings.get("method", "exact") != "exact":
        raise ConfigError(f"method: {settings['method']!r} is not in this stand-in")
    return ExactDeduplicator(list(settings.get("columns", [])))
