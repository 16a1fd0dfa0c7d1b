"""The suite's per-test budget (tests/suite_checks.py), as a contributor meets it: a test over
the limit fails the run and is named with its time; a `slow` test is not held to it; and the
limit grows on a CPU slower than the reference and under load."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

from tests.conftest import REPO

TESTS = """
import time
import pytest

def test_quick():
    pass

def test_sleepy():
    time.sleep(1.5)

@pytest.mark.slow
def test_sleepy_and_marked_slow():
    time.sleep(1.5)
"""

BUDGET = "0.1"  # seconds, as LMPRESS_TEST_BUDGET_S takes it and the summary prints it


def test_a_test_over_the_budget_fails_the_run_and_a_slow_one_does_not(tmp_path):
    (tmp_path / "test_inner.py").write_text(textwrap.dedent(TESTS))
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    slow: takes long\n")
    # A limit of 0.1 s: 1.5 s is over it on any CPU under any load short of 7 per core (the
    # limit grows by the CPU's speed factor, about 2 on the slowest kind here, and the load),
    # and the empty test under it unless its process waits 0.2 s for a core in a few microseconds.
    env = {**os.environ, "PYTHONPATH": str(REPO), "LMPRESS_TEST_BUDGET_S": BUDGET}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.suite_checks",
         "-p", "no:randomly", "-p", "no:random_order", "test_inner.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 1, run.stdout + run.stderr
    assert "3 passed" in run.stdout
    over = run.stdout.split("tests over the budget", 1)[1]
    assert f"1 test(s) without the `slow` marker took more than {BUDGET} s" in over
    assert "test_inner.py::test_sleepy\n" in over
    # The limit applied is the budget times this CPU's factor (named above the list where
    # it is over 1) and the load.
    factor = re.search(rf"test budget: {BUDGET} s a test, times ([0-9.]+) for this CPU", run.stdout)
    limit = float(re.search(r"\(limit ([0-9.]+) s\)", over)[1])
    # printed to 3 figures
    assert limit >= float(BUDGET) * (float(factor[1]) if factor else 1.0) * 0.99
    assert "test_sleepy_and_marked_slow" not in over and "test_quick" not in over
