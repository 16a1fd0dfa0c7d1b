"""Where the suite's time goes: runs pytest with a timing plugin and writes a report.

    .venv/bin/python benchmarks/suite_time.py --out suite-time            # the whole main suite
    .venv/bin/python benchmarks/suite_time.py --out t -- tests/serve -n 2  # pytest's arguments

It writes `<out>.json` (one record a test, with what its time was spent on) and `<out>.md`:
the wall time, the time by test file, by fixture (model loads, server starts, a Ray cluster:
every fixture's setup, with its scope), by kind of wait (`lmpress` and other subprocesses,
`time.sleep` on the test's own thread, polling), and the 40 slowest tests.

The same file is the plugin (`-p suite_time`, with benchmarks/ on the path): each process of
the run, xdist's workers too, appends its records to the file named by SUITE_TIME_RECORDS.
The wrappers around subprocess and time.sleep only add up time; they change no behaviour.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest

RECORDS_ENV = "SUITE_TIME_RECORDS"
REPO = Path(__file__).resolve().parent.parent


# --- the plugin ---------------------------------------------------------------------------------


class _Current:
    """The test this process is running, and what its time went on so far."""

    nodeid: str | None = None
    waits: dict[str, float] = defaultdict(float)
    fixtures: dict[str, float] = {}
    phases: dict[str, object] = {}
    cpu_start: tuple[float, float] = (0.0, 0.0)


def _cpu() -> tuple[float, float]:
    """CPU seconds (user + system) of this process, and of its children it has waited for."""
    t = os.times()
    # lmpress runs forked by the test process's warm interpreter (tests/forked_cli.py) are the
    # zygote's children, not this process's: the zygote reports each one's CPU as it ends.
    forked = sys.modules.get("tests.forked_cli")
    forked_cpu = forked.CHILD_CPU if forked is not None else 0.0
    return t.user + t.system, t.children_user + t.children_system + forked_cpu


_current = _Current()


_inside: set[str] = set()  # kinds being timed now: subprocess.run waits through Popen.wait


def _timed(kind: str, function):
    def wrapper(*args, **kwargs):
        if kind in _inside or threading.current_thread() is not threading.main_thread():
            return function(*args, **kwargs)
        _inside.add(kind)
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            _inside.discard(kind)
            if _current.nodeid is not None:
                _current.waits[kind] += time.perf_counter() - start

    wrapper.__wrapped__ = function
    return wrapper


def _install_wrappers() -> None:
    subprocess.run = _timed("subprocess", subprocess.run)
    subprocess.Popen.wait = _timed("subprocess", subprocess.Popen.wait)
    subprocess.Popen.communicate = _timed("subprocess", subprocess.Popen.communicate)
    time.sleep = _timed("sleep", time.sleep)


def pytest_configure(config) -> None:
    # Under xdist the controller sees every test's reports too: the workers write the records.
    controller = bool(config.getoption("numprocesses", None)) and not hasattr(config, "workerinput")
    if os.environ.get(RECORDS_ENV) and not controller:
        _install_wrappers()
        config.pluginmanager.register(_Recorder(), "suite-time-recorder")


def _write(record: dict) -> None:
    path = os.environ.get(RECORDS_ENV)
    if path:
        # One short line a write, opened for appending: the workers' lines never interleave.
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps(record) + "\n")


class _Recorder:
    """The hooks that write one record a test."""

    def pytest_runtest_logstart(self, nodeid, location) -> None:
        _current.nodeid = nodeid
        _current.waits = defaultdict(float)
        _current.fixtures = {}
        _current.phases = {}
        _current.cpu_start = _cpu()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_fixture_setup(self, fixturedef, request):
        start = time.perf_counter()
        yield
        seconds = time.perf_counter() - start
        name = f"{fixturedef.argname} [{fixturedef.scope}]"
        _current.fixtures[name] = _current.fixtures.get(name, 0.0) + seconds

    def pytest_runtest_logreport(self, report) -> None:
        phases = _current.phases
        phases[report.when] = report.duration
        if report.when == "call" or (report.when == "setup" and not report.passed):
            phases["outcome"] = report.outcome

    def pytest_runtest_logfinish(self, nodeid, location) -> None:
        phases = _current.phases
        own, children = (now - then for now, then in zip(_cpu(), _current.cpu_start, strict=True))
        _write(
            {
                "test": nodeid,
                "file": nodeid.split("::")[0],
                "outcome": phases.get("outcome", "passed"),
                "setup": phases.get("setup", 0.0),
                "call": phases.get("call", 0.0),
                "teardown": phases.get("teardown", 0.0),
                "fixtures": _current.fixtures,
                "waits": dict(_current.waits),
                "cpu": own,
                "child_cpu": children,
                "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
            }
        )
        _current.nodeid = None


# --- the report ---------------------------------------------------------------------------------


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.1f} s"


def _test_cpu(record: dict) -> float:
    return record.get("cpu", 0.0) + record.get("child_cpu", 0.0)


def report(records: list[dict], wall: float, command: str, rc: int, cpu: float) -> str:
    total = sum(r["setup"] + r["call"] + r["teardown"] for r in records)
    lines = [
        "# Where the suite's time goes",
        "",
        f"`{command}`: exit {rc}, **{_minutes(wall)} wall**, **{_minutes(cpu)} CPU**"
        f" (every process of the run), {len(records)} tests, {_minutes(total)} of test time"
        " (setup + call + teardown, summed over workers).",
        "",
        "A test's CPU is its worker's own, plus that of the subprocesses the worker waited for"
        " while the test ran. A server a module- or session-scoped fixture started counts"
        " where it is stopped: the module's last test, or nowhere for the session's.",
        "",
    ]

    by_file: dict[str, list[float]] = defaultdict(lambda: [0.0, 0, 0.0])
    for r in records:
        by_file[r["file"]][0] += r["setup"] + r["call"] + r["teardown"]
        by_file[r["file"]][1] += 1
        by_file[r["file"]][2] += _test_cpu(r)
    lines += [
        "## By test file (top 40 by CPU)",
        "",
        "| file | tests | time | share | CPU |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, (seconds, count, cpu_s) in sorted(by_file.items(), key=lambda kv: -kv[1][2])[:40]:
        lines.append(
            f"| {name} | {count} | {_minutes(seconds)} | {seconds / total:.1%}"
            f" | {_minutes(cpu_s)} |"
        )

    by_fixture: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for r in records:
        for name, seconds in r["fixtures"].items():
            by_fixture[name][0] += seconds
            by_fixture[name][1] += 1
    lines += [
        "",
        "## By fixture: setup time (top 30)",
        "",
        "A session- or module-scoped fixture is set up once per worker (or module); a"
        " function-scoped one once per test.",
        "",
        "| fixture [scope] | set up | time |",
        "|---|---:|---:|",
    ]
    for name, (seconds, count) in sorted(by_fixture.items(), key=lambda kv: -kv[1][0])[:30]:
        lines.append(f"| {name} | {count}x | {_minutes(seconds)} |")

    waits: dict[str, float] = defaultdict(float)
    for r in records:
        for kind, seconds in r["waits"].items():
            waits[kind] += seconds
    fixture_total = sum(seconds for seconds, _ in by_fixture.values())
    lines += [
        "",
        "## By kind of wait",
        "",
        "| kind | time | share of test time |",
        "|---|---:|---:|",
        f"| fixture setup | {_minutes(fixture_total)} | {fixture_total / total:.1%} |",
    ]
    for kind, seconds in sorted(waits.items(), key=lambda kv: -kv[1]):
        label = {
            "subprocess": "subprocesses (`lmpress` runs and others), waited for",
            "sleep": "time.sleep on the test's thread (fixed sleeps and polling)",
        }.get(kind, kind)
        lines.append(f"| {label} | {_minutes(seconds)} | {seconds / total:.1%} |")

    lines += ["", "## The 40 slowest tests", ""]
    lines.append("| test | time | setup | subprocess | sleep | CPU |")
    lines.append("|---|---:|---:|---:|---:|---:|")
    for r in sorted(records, key=lambda r: -(r["setup"] + r["call"] + r["teardown"]))[:40]:
        seconds = r["setup"] + r["call"] + r["teardown"]
        lines.append(
            f"| {r['test']} | {seconds:.1f} s | {r['setup']:.1f} s"
            f" | {r['waits'].get('subprocess', 0.0):.1f} s | {r['waits'].get('sleep', 0.0):.1f} s"
            f" | {_test_cpu(r):.1f} s |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="suite-time", help="writes OUT.json and OUT.md")
    parser.add_argument("--python", default=sys.executable, help="the Python whose pytest runs")
    parser.add_argument("pytest_args", nargs="*", help="after --: pytest's arguments")
    args = parser.parse_args()

    out = Path(args.out)
    records_path = out.with_suffix(".json")
    records_path.unlink(missing_ok=True)
    env = {
        **os.environ,
        RECORDS_ENV: str(records_path.resolve()),
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(REPO / "benchmarks"), os.environ.get("PYTHONPATH")])
        ),
    }
    command = [args.python, "-m", "pytest", "-p", "suite_time", *args.pytest_args]
    start = time.perf_counter()
    rc = subprocess.call(command, cwd=REPO, env=env)
    wall = time.perf_counter() - start
    cpu = _cpu()[1]  # pytest, its workers and what they waited for

    records = []
    if records_path.exists():
        records = [json.loads(line) for line in records_path.read_text().splitlines() if line]
    shown = "pytest " + " ".join(args.pytest_args)
    out.with_suffix(".md").write_text(report(records, wall, shown, rc, cpu))
    print(
        f"suite_time: {len(records)} tests, {_minutes(wall)} wall, {_minutes(cpu)} CPU; wrote {out.with_suffix('.md')}"
    )
    return rc


if __name__ == "__main__":
    sys.exit(main())
