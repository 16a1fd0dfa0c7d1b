"""The suite's `lmpress` runs forked from a warm interpreter (tests/forked_cli.py) are the runs
an exec gives: the same exit status, stdout and stderr, stdin read, a timeout kills the run."""

from __future__ import annotations

import ast
import os
import subprocess
import sys

import psutil
import pytest

from tests import forked_cli
from tests.conftest import REPO

TINY = ["--cache", "off", "--engine", "NATIVE", "--model.model_name", "tiny:llama"]
CASES = {
    "help": (["--help"], None),
    "a bad key": (["infer", "--engine", "NATIVE", "--model.bogus", "1", "hi"], None),
    "a prompt on stdin": (["infer", *TINY, "--generation.max_new_tokens", "6"], "hello there\n"),
    "a reply on stdout": (["infer", *TINY, "--generation.max_new_tokens", "6", "hi"], None),
    "a plugin on PYTHONPATH": (["infer", "--cache", "off", "--engine", "ECHO", "hi"], None),
}


@pytest.fixture(scope="module")
def warm():
    zygote = forked_cli.Zygote()
    yield zygote
    zygote.stop()


def env(plugin: str = "") -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{plugin}" if plugin else str(REPO)}


@pytest.mark.parametrize("case", CASES)
def test_a_forked_run_prints_and_exits_as_an_execd_one(warm, case, tmp_path, echo_plugin):
    args, stdin = CASES[case]
    run_env = env(echo_plugin if "ECHO" in args else "")
    execd = subprocess.run(
        [sys.executable, "-m", "lmpress", *args],
        input=stdin, capture_output=True, text=True, env=run_env, cwd=tmp_path, timeout=120,
    )  # fmt: skip
    forked = warm.run(tuple(args), input=stdin, env=run_env, cwd=tmp_path, timeout=120)
    assert (forked.returncode, forked.stdout, forked.stderr) == (
        execd.returncode,
        execd.stdout,
        execd.stderr,
    )
    assert execd.stdout or execd.stderr  # each case prints something


def test_a_run_past_its_timeout_is_killed(warm, tmp_path):
    args = ("serve", *TINY, "--port", "0")
    with pytest.raises(subprocess.TimeoutExpired):
        warm.run(args, input=None, env=env(), cwd=tmp_path, timeout=3)
    zygote = psutil.Process(warm.proc.pid)
    psutil.wait_procs(zygote.children(), timeout=10)
    assert not [c for c in zygote.children() if c.status() != psutil.STATUS_ZOMBIE]


def test_runs_whose_start_a_fresh_interpreter_would_read_differently_are_execd(warm):
    same = env()
    assert warm.takes(("batch",), {**same, "LMPRESS_RESPONSE_CACHE": "/elsewhere"})
    assert not warm.takes(("batch",), {**same, "HF_HOME": "/elsewhere"})
    assert not warm.takes(("batch",), {**same, "OMP_NUM_THREADS": "7"})
    # The child puts PYTHONPATH's folders on its sys.path, as the interpreter would.
    assert warm.takes(("batch",), {**same, "PYTHONPATH": f"{REPO}{os.pathsep}/plugins"})
    assert not warm.takes(("eval",), same)
    # Read when used, and set by libraries in the test process as it runs (transformers'
    # compiled generate): the worker's later runs are still forked.
    assert warm.takes(("batch",), {**same, "TOKENIZERS_PARALLELISM": "0"})


def test_the_zygote_starts_in_the_sessions_environment_not_the_first_tests(monkeypatch):
    """A test that patches a variable read at start (HF_HUB_OFFLINE) and makes the first run
    of its worker leaves the zygote as the session had it: later runs are still forked."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "patched-by-this-test")
    zygote = forked_cli.Zygote()
    try:
        assert zygote.env.get("HF_HUB_OFFLINE") != "patched-by-this-test"
        monkeypatch.undo()
        assert zygote.takes(("batch",), env())
    finally:
        zygote.stop()


def test_a_variable_a_library_set_for_good_moves_the_zygote_not_every_run_to_exec(monkeypatch):
    """A library sets KMP_DUPLICATE_LIB_OK in the test process, for the rest of it: as the
    next test starts, the session's environment takes it, and its runs fork from a zygote
    started in it; the one before, still holding a run, stays until that run ends."""
    before = forked_cli.zygote()
    assert before is not None
    running = forked_cli.Forked(before, ("infer", "--help"), env=env(), stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    monkeypatch.setenv("KMP_DUPLICATE_LIB_OK", "TRUE")  # another value than the session's
    try:
        assert forked_cli.adopt_drift() == ["KMP_DUPLICATE_LIB_OK"]
        after = forked_cli.zygote()
        assert after is not before and after.takes(
            ("batch",), {**os.environ, "PYTHONPATH": str(REPO)}
        )
        assert before.proc.pid in forked_cli.zygote_pids()  # held by its run
        running.communicate(timeout=60)
    finally:
        monkeypatch.undo()
        forked_cli.adopt_drift()  # back to the session's own, for the tests after this one
    # Its run has ended: it is stopped, unless a run of another test still holds it (a
    # session's server forked from it, in a random order: seed 361514 of fresh run V).
    assert before.proc.pid not in forked_cli.zygote_pids() or before.busy()


def reads_at_import(tree: ast.Module) -> list[int]:
    """Lines of a module's import-time code (its top level and class bodies, default values and
    decorators, not function bodies) that read the environment, the clock or the directory."""
    found, todo = [], list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            todo += [d for d in (*node.args.defaults, *node.args.kw_defaults) if d is not None]
            todo += getattr(node, "decorator_list", [])
            continue
        name = ast.unparse(node) if isinstance(node, ast.Attribute | ast.Name) else ""
        if name in IMPORT_TIME_READS:
            found.append(node.lineno)
        todo += ast.iter_child_nodes(node)
    return sorted(found)


IMPORT_TIME_READS = {
    "os.environ", "os.getenv", "getenv", "environ", "os.getcwd", "Path.cwd", "Path.home",
    "os.path.expanduser", "time.time", "datetime.now", "os.getpid",
}  # fmt: skip


def test_no_lmpress_module_reads_the_environment_as_it_is_imported():
    """The zygote imports lmpress's modules once, in the session's environment: a module that read
    a variable, the clock or the directory as it is imported would give every forked run the
    zygote's value, not its own."""
    offenders = [
        f"{path.relative_to(REPO)}:{line}"
        for path in sorted((REPO / "lmpress").rglob("*.py"))
        for line in reads_at_import(ast.parse(path.read_text()))
    ]
    assert not offenders, f"read at import (read where used instead): {offenders}"
    planted = ast.parse("import os\nHOME = os.environ['HOME']\ndef f(x=os.getcwd()):\n    pass\n")
    assert reads_at_import(planted) == [2, 3]  # the check sees what it looks for


def test_the_zygote_imports_no_library_that_reads_the_environment_as_it_is_imported():
    """Ray and lm-eval read their variables as they are imported (and tests set them), so the
    zygote leaves the modules that import them to the run; the preload starts no thread, which a
    fork would lose."""
    check = (
        "import sys, threading; sys.path.insert(0, 'tests'); import cli_zygote; "
        "cli_zygote.preload(); "
        "print(sorted({'ray', 'lm_eval', 'vllm', 'datasets'} & set(sys.modules)), "
        "threading.active_count())"
    )
    done = subprocess.run(
        [sys.executable, "-c", check], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["[]", "1"]
