"""The suite's checks on itself (docs/contributing.md, "The test budget").

- No test outside the `slow` marker takes more than a minute, setup and teardown included: a
  longer one fails the run, named with its time, so the whole `make test` stays within its
  20 minutes as tests are added. LMPRESS_TEST_BUDGET_S sets another limit (0: no limit). The
  minute is the faster kind of these machines'; the check measures the test, not the machine:
  - on a slower CPU the limit grows by how much longer a fixed piece of single-threaded work
    takes there (`CpuSpeed`, measured once a run, in CPU time, so other work on the
    machine does not count in it);
  - on a machine busier than its cores (the 1-minute load average per core above 1) it grows
    in proportion to that load too.
- No process a test started outlives the suite: every pytest process (each xdist worker too)
  lists its children when its session ends, stops any still running and fails naming them.
  A run stopped by SIGTERM tears down as a Ctrl-C'd one does.
"""

from __future__ import annotations

import os
import subprocess
import sys
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


# The CPU seconds SPEED_WORK takes on the kind of machine the budget is set on (an Intel Xeon
# with AVX-512): the least of its repeats. It mixes float32 matrix products of a small model's
# decoding step with plain Python, as the suite's time does. Derived, as no such machine was to hand
# when it was written: 0.265 s on an AMD EPYC with AVX2 only, where the whole suite's pytest took
# 1.86 times as long as on the Xeon (2065 s against 1109), so 0.265 / 1.86.
REFERENCE_SPEED_S = 0.142
SPEED_WORK = """
import time, torch
torch.set_num_threads(1)
x, w = torch.randn(16, 576), torch.randn(576, 1536)
def once():
    start = time.process_time()
    for _ in range(260):
        x @ w
    counts = {}
    for i in range(1_000_000):
        counts[i % 97] = counts.get(i % 97, 0) + 1
    return time.process_time() - start
print(min(once() for _ in range(4)))
"""


class CpuSpeed:
    """How many times slower than the reference this machine's CPU runs SPEED_WORK, at least 1:
    started in a process of its own when the run starts, read when first needed."""

    def __init__(self) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        self._work = subprocess.Popen([sys.executable, "-c", SPEED_WORK], env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)  # fmt: skip
        self._factor: float | None = None
        self.seconds: float | None = None

    def factor(self) -> float:
        if self._factor is None:
            out, _ = self._work.communicate()
            try:
                self.seconds = float(out)
            except ValueError:  # the work could not run: the limit stays as it is
                self._factor = 1.0
            else:
                self._factor = max(1.0, self.seconds / REFERENCE_SPEED_S)
        return self._factor


class Budget:
    """Adds up each test's phases as their reports arrive (on xdist's controller, from every
    worker) and keeps those over budget."""

    def __init__(self, limit_s: float, speed: CpuSpeed) -> None:
        self.limit_s = limit_s
        self.speed = speed
        self.spent: dict[str, float] = defaultdict(float)
        self.over: list[tuple[str, float, float]] = []

    def limit_now(self) -> float:
        return self.limit_s * self.speed.factor() * load_factor()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if "slow" in report.keywords:
            return
        self.spent[report.nodeid] += report.duration
        if report.when == "teardown":
            seconds = self.spent.pop(report.nodeid)
            limit = self.limit_now()
            if seconds > limit:
                self.over.append((report.nodeid, seconds, limit))

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if self.speed.factor() > 1:
            terminalreporter.line(
                f"test budget: {self.limit_s:g} s a test, times {self.speed.factor():.2f} for"
                f" this CPU ({self.speed.seconds:.2f} CPU-s of fixed work against"
                f" {REFERENCE_SPEED_S:.2f}), times the load per core above 1 when each ended"
            )
        if not self.over:
            return
        terminalreporter.section("tests over the budget", sep="=", red=True, bold=True)
        terminalreporter.line(
            f"{len(self.over)} test(s) without the `slow` marker took more than"
            f" {self.limit_s:g} s ({BUDGET_ENV}); make them faster, or mark them slow and"
            " say why (docs/contributing.md):"
        )
        for nodeid, seconds, limit in sorted(self.over, key=lambda o: -o[1]):
            terminalreporter.line(f"  {seconds:6.1f} s (limit {limit:.3g} s)  {nodeid}")

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.over and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    # pytest-random-order names its seed in the header, which -q (as `make test` runs) hides. It
    # shuffles on --random-order, and on a seed or bucket given without it.
    if hasattr(config, "workerinput") or config.pluginmanager.get_plugin("random_order") is None:
        return
    from random_order.config import Config

    order = Config(config)
    if order.is_enabled:
        terminalreporter.line(
            f"tests ran in a random order: repeat it with --random-order-seed={order.seed}"
        )


def pytest_configure(config: pytest.Config) -> None:
    limit = budget_s()
    if limit > 0 and not hasattr(config, "workerinput"):  # xdist's workers report to the controller
        config.pluginmanager.register(Budget(limit, CpuSpeed()), "lmpress-test-budget")
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
