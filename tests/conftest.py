"""Shared fixtures: tiny real models built offline (cached across runs), and a way to run the
real `lmpress` command in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import tempfile
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests import forked_cli

# The suite's checks on itself: the per-test budget, and no process left behind.
pytest_plugins = ["tests.suite_checks"]

# OpenMP's threads (llama.cpp's, torch's) sleep while they wait for work instead of spinning,
# here and in every process a test starts: set before anything loads an OpenMP runtime. The
# replies are the same; on a loaded 2-core machine a spinning thread took the CPU the work
# needed: `lmpress batch -c smollm2` on examples/sample.jsonl at load 7-10 took 33-63 s of CPU
# (67-186 s wall) as it is, 7.3 s (23 s wall) with PASSIVE. A policy already set is kept.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# A process of the suite's that dies of a fault (SIGSEGV, SIGABRT, ...) prints every thread's
# Python stack to its stderr, which the failing test shows: a fresh run once saw a `--ray` job
# exit -11 after writing its summary (tests/batch/test_cluster_cli.py), and nothing said where.
# Set before the warm interpreter (tests/cli_zygote.py) starts, so its children have it too.
os.environ.setdefault("PYTHONFAULTHANDLER", "1")

REPO = Path(__file__).resolve().parent.parent
PACKAGE = str(REPO / "lmpress") + os.sep

# The response cache (lmpress/cache/) is on by default: the suite's runs keep their replies in a
# directory of this session's (each test gets its own, below), never in the user's cache, so no
# test is answered by a reply an earlier test or an earlier run of the suite kept.
os.environ["LMPRESS_RESPONSE_CACHE"] = tempfile.mkdtemp(prefix="lmpress-responses-")
# Libraries the suite imports set these for the rest of their process, to these values and only
# where unset: scikit-learn and threadpoolctl (through sentence-transformers) the two KMP_ ones,
# lm-eval HF_XET_HIGH_PERFORMANCE. Each is read as an interpreter starts, so each arrival moved a
# worker's warm interpreter (forked_cli.adopt_drift): 3-4 restarts a worker, about 8 CPU-s each.
# Set here first, the warm interpreter starts in the environment the workers reach anyway, and
# which test files a worker happened to run first no longer decides the one a run gets. (vLLM's
# environment starts no warm interpreter, and vLLM's processes are left the environment it gets.)
SET_BY_LIBRARIES = {
    "KMP_DUPLICATE_LIB_OK": "True",
    "KMP_INIT_AT_FORK": "FALSE",
    "HF_XET_HIGH_PERFORMANCE": "1",
}
if not forked_cli.VLLM:
    for name, value in SET_BY_LIBRARIES.items():
        os.environ.setdefault(name, value)
forked_cli.keep_session_environment()  # the warm interpreter's, whatever the first test patches


@pytest.fixture(autouse=True)
def _own_response_cache(tmp_path_factory, monkeypatch) -> None:
    forked_cli.adopt_drift()  # before this test patches anything
    monkeypatch.setenv(
        "LMPRESS_RESPONSE_CACHE", str(tmp_path_factory.mktemp("response-cache", numbered=True))
    )


# --- a deprecated call in lmpress's own code fails the test that makes it ----------------------
#
# pytest records warnings; this also looks at where each deprecation warning came from. The
# frame a library blames (its `stacklevel`) is often its own wrapper (transformers' renamed
# arguments blame torch's Module.__call__), so a filter on the warning's module cannot tell
# whose call it was. The stack can: a DeprecationWarning, PendingDeprecationWarning or
# FutureWarning is lmpress's to fix when lmpress's code (on any thread: NATIVE's worker too)
# called into the library that warned, directly or through torch's Module.__call__ (which
# passes its caller's arguments on). Not when another library made the call (PEFT calling a
# method transformers deprecated, with lmpress further out), nor while a library imports itself.

DEPRECATIONS = (DeprecationWarning, PendingDeprecationWarning, FutureWarning)


@dataclass
class DeprecationSpy:
    """Stands in front of the recorder pytest installs for a test's warnings."""

    seen: list[str] = field(default_factory=list)

    def wrap(self, record):
        def spy(message: warnings.WarningMessage) -> None:
            if issubclass(message.category, DEPRECATIONS):
                caller = lmpress_caller(traceback.extract_stack()[:-2])
                if caller is not None:
                    self.seen.append(
                        f"{message.category.__name__}: {message.message} (called from {caller})"
                    )
            record(message)

        return spy


def lmpress_caller(stack: list[traceback.FrameSummary]) -> str | None:
    """The lmpress frame that made the deprecated call, if lmpress's code made it: walking out
    from the warning past the warning library's own frames (and torch's Module.__call__), the
    first frame met."""
    if not stack:
        return None
    warner = library(stack[-1].filename)
    for frame in reversed(stack):
        if frame.filename.startswith("<frozen importlib"):
            return None  # a library warning about itself as it is imported
        if frame.filename.startswith(PACKAGE):
            return f"{os.path.relpath(frame.filename, REPO)}:{frame.lineno}"
        if library(frame.filename) != warner and not frame.filename.endswith(MODULE_CALL):
            return None  # another library's call
    return None


MODULE_CALL = os.path.join("torch", "nn", "modules", "module.py")
STDLIB = sysconfig.get_paths()["stdlib"] + os.sep


def library(filename: str) -> str:
    """The installed package or standard module a file belongs to (its path, for any other)."""
    for root in ("site-packages" + os.sep, "dist-packages" + os.sep):
        if root in filename:
            return filename.split(root, 1)[1].split(os.sep, 1)[0]
    if filename.startswith(STDLIB):
        return filename[len(STDLIB) :].split(os.sep, 1)[0]
    return filename


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item):
    # Inside pytest's own warnings wrapper, which has installed this test's recorder.
    spy = DeprecationSpy()
    item.stash[DEPRECATION_SPY] = spy
    record = warnings._showwarnmsg_impl
    warnings._showwarnmsg_impl = spy.wrap(record)
    try:
        yield
    finally:
        warnings._showwarnmsg_impl = record


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    spy = item.stash.get(DEPRECATION_SPY, None)
    if call.when == "teardown" or spy is None or not spy.seen or report.failed:
        return
    report.outcome = "failed"
    report.longrepr = "lmpress's own code made a deprecated call:\n" + "\n".join(
        dict.fromkeys(spy.seen)
    )
    spy.seen.clear()


DEPRECATION_SPY = pytest.StashKey[DeprecationSpy]()


@pytest.fixture(scope="session")
def tiny_llama() -> str:
    """A Llama-shaped model with a byte-level BPE tokenizer and a ChatML template."""
    from lmpress.builtin_models.tiny import tiny_model

    return str(tiny_model("llama"))


@pytest.fixture(scope="session")
def tiny_gpt2() -> str:
    """A GPT-2 model with a Unigram (SentencePiece-family) tokenizer and an [INST] template."""
    from lmpress.builtin_models.tiny import tiny_model

    return str(tiny_model("gpt2"))


def dies_with_its_parent() -> None:
    """A `preexec_fn` for a long-lived process a test starts (a server): the kernel kills it
    when the pytest process that started it dies, however that dies. A pytest killed by a
    signal runs no teardown, and the servers it left held gigabytes for the next run."""
    import ctypes
    import signal

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


@dataclass
class CliRun:
    returncode: int
    stdout: str
    stderr: str


def run_lmpress(
    *args: str,
    input: str | None = None,
    env: dict | None = None,
    cwd: str | Path | None = None,
    timeout: float = 300,
) -> CliRun:
    """Run the real CLI (`python -m lmpress ...`) with this checkout first on the path, in a
    process of its own: forked from this worker's warm interpreter where that is the same as
    a fresh one (tests/forked_cli.py), exec'd otherwise."""
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    warm = forked_cli.zygote()
    if warm is not None and warm.takes(args, full_env):
        done = warm.run(args, input=input, env=full_env, cwd=cwd, timeout=timeout)
        return CliRun(done.returncode, done.stdout, done.stderr)
    proc = subprocess.run(
        [sys.executable, "-m", "lmpress", *args],
        input=input,
        capture_output=True,
        text=True,
        env=full_env,
        cwd=cwd,
        timeout=timeout,
    )
    return CliRun(proc.returncode, proc.stdout, proc.stderr)


def lmpress_process(
    *args: str, env: dict | None = None, cwd: str | Path | None = None, **popen
) -> subprocess.Popen | forked_cli.Forked:
    """`python -m lmpress ARGS` started in the background, as `subprocess.Popen` starts it
    (`env` the whole environment; stdin, stdout, stderr and text as Popen takes them): forked
    from this worker's warm interpreter where that is the same as a fresh one, exec'd
    otherwise. Either answers Popen's pid, poll, wait, communicate and signals."""
    full_env = env if env is not None else {**os.environ, "PYTHONPATH": str(REPO)}
    warm = forked_cli.zygote()
    # A forked child dies with the zygote, which dies with this process: dies_with_its_parent.
    own_preexec = popen.get("preexec_fn") not in (None, dies_with_its_parent)
    if warm is not None and not own_preexec and warm.takes(args, full_env):
        popen.pop("preexec_fn", None)
        return forked_cli.Forked(warm, args, env=full_env, cwd=cwd, **popen)
    return subprocess.Popen(
        [sys.executable, "-m", "lmpress", *args], env=full_env, cwd=cwd, **popen
    )


@pytest.fixture
def lmpress_cli():
    return run_lmpress


@pytest.fixture(scope="session")
def echo_plugin(tmp_path_factory) -> str:
    """A directory to put on PYTHONPATH that installs the ECHO test engine the way a real
    plugin does: a package plus dist-info declaring an `lmpress.engines` entry point."""
    root = tmp_path_factory.mktemp("echo-plugin")
    dist = root / "lmpress_echo-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: lmpress-echo\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[lmpress.engines]\nECHO = lmpress_echo:EchoEngine\n")
    return f"{REPO / 'tests' / 'plugins'}{os.pathsep}{root}"


def with_plugin(plugin_path: str) -> dict[str, str]:
    """Environment for a subprocess that sees this checkout and the ECHO plugin."""
    return {"PYTHONPATH": f"{REPO}{os.pathsep}{plugin_path}"}
