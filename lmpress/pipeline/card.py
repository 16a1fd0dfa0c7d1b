"""STAND-IN (branch core only): the dataset card, to be replaced by the `card` helper's module
of the same name (`write_card(path, facts)`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_card(path: Path, facts: dict[str, Any]) -> None:
    lines = ["---", "tags: [lmpress, synthetic]", "---", "", "# Dataset made by lmpress", ""]
    lines += ["```json", json.dumps(facts, indent=2, default=str), "```", ""]
    Path(path).write_text("\n".join(lines), encoding="utf-8")
