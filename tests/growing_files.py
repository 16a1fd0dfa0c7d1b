"""Reading a file that a running (or just killed) `lmpress` job is still writing: whole lines
only. The job appends a line at a time, so the last line may be half-written when the test
looks; counting or parsing it would make the test depend on how far the write had got."""

from __future__ import annotations

import json
from pathlib import Path


def whole_lines(path: Path) -> list[str]:
    """The lines of `path` that end in a newline; none while it does not exist yet."""
    if not path.exists():
        return []
    data = path.read_bytes()
    return data[: data.rfind(b"\n") + 1].decode("utf-8").splitlines()


def whole_rows(path: Path) -> list[dict]:
    """Each whole line of a JSONL file, parsed."""
    return [json.loads(line) for line in whole_lines(path)]
