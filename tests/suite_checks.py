"""The suite's checks on itself (docs/contributing.md, "The test budget").

- No test outside the `slow` marker takes more than a minute, setup and teardown included: a
  longer one fails the run, named with its time, so the whole `make test` stays within its
  20 minutes as tests are added. LMPRESS_TEST_BUDGET_S sets another limit (0: no limit). On a
  machine busier than its cores (the 1-minute load average per core above 1) the limit grows
  in proportion, so the check measures the test and not what else the machine runs.
- No process a test started outlives the suite: every pytest process (each xdist worker too)
  lists its children when its session ends, stops any still running and fails naming them.
  A run stopped by SIGTERM tears down as a Ctrl-C'd one does.
"""

from __future__ import annotations

import os
from collections import defaultdict

import psutil
import pytest

from tests import forked_cli

BUDGET_ENV = "LMPRESS_TEST_BUDGET_S"
DEFAULT_BUDGET_S = 60.0
# A child still stopping when the session ends (a server told to stop by the test's own
# teardown) is given this long to go before it counts as left behind.
EXIT_GRACE_S = 10.0


def load_factor() -> float:
    """How many times over its cores the machine is busy now, at least 1."""
    return max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))


def budget_s() -> float:
    return float(os.environ.get(BUDGET_ENV, DEFAULT_BUDGET_S))


class Budget:
    """Adds up each test's phases as their reports arrive (on xdist's controller, from every
    worker) and keeps those over budget."""

    def __init__(self, limit_s: float) -> None:
        self.limit_s = limit_s
        self.spent: dict[str, float] = defaultdict(float)
        self.over: list[tuple[str, float, float]] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if "slow" in report.keywords:
            return
        self.spent[report.nodeid] += report.duration
        if report.when == "teardown":
            seconds = self.spent.pop(report.nodeid)
            limit = self.limit_s * load_factor()
            if seconds > limit:
                self.over.append((report.nodeid, seconds, limit))

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.over:
            return
        terminalreporter.section("tests over the budget", sep="=", red=True, bold=True)
        terminalreporter.line(
            f"{len(self.over)} test(s) without the `slow` marker took more than"
            f" {self.limit_s:.0f} s ({BUDGET_ENV}); make them faster, or mark them slow and"
            " say why (docs/contributing.md):"
        )
        for nodeid, seconds, limit in sorted(self.over, key=lambda o: -o[1]):
            terminalreporter.line(f"  {seconds:6.1f} s (limit {limit:.0f} s)  {nodeid}")

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.over and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    # pytest-random-order names its seed in the header, which -q (as `make test` runs) hides.
    if config.getoption("random_order_enabled", False) and not hasattr(config, "workerinput"):
        seed = str(config.getoption("random_order_seed")).removeprefix("default:")
        terminalreporter.line(
            f"tests ran in a random order: repeat it with --random-order-seed={seed}"
        )


def pytest_configure(config: pytest.Config) -> None:
    limit = budget_s()
    if limit > 0 and not hasattr(config, "workerinput"):  # xdist's workers report to the controller
        config.pluginmanager.register(Budget(limit), "lmpress-test-budget")
    _terminate_as_interrupt()


def _terminate_as_interrupt() -> None:
    """SIGTERM stops the run as Ctrl-C does, running the fixtures' teardown (the servers and
    engines they started stop with it). `make test` stopped early terminates its background
    real-vLLM pytest; killed outright, that pytest would leave vLLM's processes running. A
    handler someone else set is kept."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)


# Helpers the interpreter itself starts for multiprocessing (vLLM and Ray use it) and stops when
# it exits: not a test's to stop.
INTERPRETER_HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")


def running_children() -> list[psutil.Process]:
    children = []
    warm = forked_cli.zygote_pids()
    for child in psutil.Process().children(recursive=True):
        try:
            if child.pid in warm:
                continue  # stopped after the check, so that its children count in it
            if child.status() == psutil.STATUS_ZOMBIE:
                continue
            if not any(helper in " ".join(child.cmdline()) for helper in INTERPRETER_HELPERS):
                children.append(child)
        except psutil.NoSuchProcess:
            pass
    return children


def described(process: psutil.Process) -> str:
    try:
        return f"pid {process.pid}: {' '.join(process.cmdline())[:200]}"
    except psutil.Error:
        return f"pid {process.pid}"


@pytest.fixture(scope="session", autouse=True)
def _no_process_outlives_the_suite():
    yield
    try:
        check_no_process_left()
    finally:
        forked_cli.stop()


def check_no_process_left() -> None:
    _, alive = psutil.wait_procs(running_children(), timeout=EXIT_GRACE_S)
    if not alive:
        return
    names = [described(p) for p in alive]
    for process in alive:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=EXIT_GRACE_S)
    pytest.fail(
        f"{len(names)} process(es) the tests started were still running when the session"
        " ended (now killed); the test that starts each must stop it, even when it fails:\n  "
        + "\n  ".join(names),
        pytrace=False,
    )
