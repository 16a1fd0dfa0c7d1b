"""The order `make test` hands test files to its two xdist workers.

`--dist loadfile` gives each worker whole files (a file's tests share its loaded models and
servers), in collection order; xdist's own default order is by number of tests. The files
that take longest have few tests (a Ray cluster's, lm-eval's), so by that order they started
last, and the run ended on one of them in one worker while the other sat idle (2.5 min).
Started first instead, they overlapped the real-vLLM suite, which runs beside the main one for
its first 40% or so: memory ran short (a Ray cluster, lm-eval's three SmolLM2 runs and vLLM's
engines at once), the kernel reclaimed page cache, and the main suite took 18:29, not 16.

So the files go in three parts, by their times in tests/file_times.json
(`benchmarks/suite_time.py --times`):
1. short and medium files, longest first, until they make WARM_UP_SHARE of the suite's time:
   what runs beside the vLLM suite;
2. the long files (over LONG_S each), longest first, once the vLLM suite is done;
3. the remaining files, longest first, so the run ends on the shortest.
A file the times do not list counts as the median file. A file's own tests keep their order,
and `--random-order` (which runs after this) shuffles as before.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

TIMES = Path(__file__).with_name("file_times.json")
LONG_S = 60.0
WARM_UP_SHARE = 0.4


def file_times() -> dict[str, float]:
    try:
        return json.loads(TIMES.read_text())
    except (OSError, ValueError):
        return {}


def file_order(files: list[str], times: dict[str, float]) -> list[str]:
    unknown = statistics.median(times.values())
    time_of = {f: times.get(f, unknown) for f in files}
    by_time = sorted(files, key=lambda f: (-time_of[f], f))
    long = [f for f in by_time if time_of[f] > LONG_S]
    rest = [f for f in by_time if time_of[f] <= LONG_S]
    budget, warm_up = WARM_UP_SHARE * sum(time_of.values()), []
    while rest and sum(time_of[f] for f in warm_up) < budget:
        warm_up.append(rest.pop(0))
    return warm_up + long + rest


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items) -> None:
    times = file_times()
    if not times:
        return
    files = list(dict.fromkeys(item.nodeid.split("::", 1)[0] for item in items))
    rank = {f: i for i, f in enumerate(file_order(files, times))}
    items.sort(key=lambda item: rank[item.nodeid.split("::", 1)[0]])  # stable within a file
