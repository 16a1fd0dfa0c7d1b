"""The longest test files start first.

`make test` hands whole files to its two xdist workers (`--dist loadfile`, so a file's tests
share its loaded models and servers) in collection order, and xdist's own default order is by
number of tests. The files that take longest have few tests (a Ray cluster's, lm-eval's), so
by that order they started last, and the run ended on one of them in one worker while the
other worker sat idle. Started first, as longest-processing-time-first scheduling does, they
overlap the many short files instead.

Each file's time is read from tests/file_times.json (`benchmarks/suite_time.py --times`); a
file it does not list counts as the median file. Only the order of whole files changes: a
file's own tests keep theirs, and `--random-order` (which runs after this) shuffles as before.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

TIMES = Path(__file__).with_name("file_times.json")


def file_times() -> dict[str, float]:
    try:
        return json.loads(TIMES.read_text())
    except (OSError, ValueError):
        return {}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items) -> None:
    times = file_times()
    if not times:
        return
    unknown = statistics.median(times.values())

    def longest_first(item) -> tuple[float, str]:
        path = item.nodeid.split("::", 1)[0]
        return (-times.get(path, unknown), path)

    items.sort(key=longest_first)  # stable: a file's tests keep their order
