"""The real-vLLM tests run where vLLM itself imports and runs: .venv-vllm, with vLLM's CPU build
(`make test-vllm`). Anywhere else they are skipped, unless LMPRESS_REQUIRE_VLLM is set (as the
Makefile sets it), when a vLLM that cannot run fails them instead: a green run of the target
means they ran.

vLLM takes about 20 s to start on these machines, so each module starts as few engines as it
can: one raw `vllm.LLM` in a process of its own for the reference answers (raw_vllm.py, its
engine in that one process), one lmpress engine in this process (its model worker in its
engine-core process, worker_in_the_engine_core), and one `lmpress` subprocess per front it
checks.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from unittest.mock import patch

import httpx
import pytest

HERE = Path(__file__).resolve().parent
REQUIRED = bool(os.environ.get("LMPRESS_REQUIRE_VLLM"))
# vLLM's CPU backend otherwise reserves most of the machine's memory (gpu_memory_utilization
# 0.92 of it) and refuses to start when other processes hold some. One GiB of KV cache holds
# tens of thousands of SmolLM2 tokens.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
VLLM_TEST_TIMEOUT_S = 1800


def vllm_problem() -> str | None:
    """Why real vLLM cannot run here, or None."""
    try:
        import vllm
        from vllm.platforms import current_platform
    except Exception as exc:
        return f"vllm does not import here ({type(exc).__name__}: {exc}); run make test-vllm"
    if "standin" in str(Path(vllm.__file__)):
        return "the vLLM stand-in is on the path, not vLLM"
    if not getattr(current_platform, "device_type", ""):
        return "vLLM found no device it can run on"
    return None


def pytest_collection_modifyitems(config, items):
    for item in items:
        if HERE in Path(item.path).parents:
            # Each test waits for at least one vLLM engine to start (20-60 s on 2 cores); the
            # suite's per-test budget is for the tests that start none.
            item.add_marker(pytest.mark.slow)
            # pytest-timeout is a hang guard, and these tests' time follows the machine's load:
            # batch --ray, a local Ray with vLLM in its replica, took 180 s beside the main suite
            # and more than the suite's 600 s with two busy processes added (issue 50's loaded run).
            item.add_marker(pytest.mark.timeout(VLLM_TEST_TIMEOUT_S))
    problem = vllm_problem() if any(HERE in Path(i.path).parents for i in items) else None
    if problem is None:
        return
    if REQUIRED:
        raise pytest.UsageError(f"the real-vLLM tests cannot run: {problem}")
    for item in items:
        if HERE in Path(item.path).parents:
            item.add_marker(pytest.mark.skip(reason=problem))


# vLLM's engine in the reference's own process: by default `vllm.LLM` starts an engine-core
# process and, on a CPU, a worker process under it, each importing vLLM and torch again: one
# process spends about a third less CPU per reference here (25 s, not 37, on tiny:llama-head32).
# The answers are the same, token for token and logprob for logprob; lmpress's side keeps
# vLLM's default processes, as users run it.
RAW_VLLM_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


def worker_in_the_engine_core():
    """An lmpress engine started in this process, within the block, runs vLLM's model worker
    in its engine-core process rather than in a third process of its own (vLLM's CPU default):
    one import of vLLM and torch and one model load fewer per engine, ~10 s of CPU here. Its
    answers are the same, as the raw reference's are; lmpress's own path (AsyncLLM, its
    engine-core process, the logs) is unchanged. Of the `lmpress` subprocesses the tests
    start, serve and the failures keep vLLM's default processes, as users run it; the batch
    jobs (test_tiny, Ray's replica) pass RAW_VLLM_ENV on."""
    return patch.dict(os.environ, RAW_VLLM_ENV)


@contextmanager
def raw_vllm_beside(cases: dict, tmp_dir: Path) -> Iterator[Callable[[], dict]]:
    """raw_vllm started in the background, so that the test starts its own engine meanwhile:
    call what this yields for the answers. Leaving the block stops the process."""
    cases_file, out_file = tmp_dir / "cases.json", tmp_dir / "raw.json"
    cases_file.write_text(json.dumps(cases))
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "raw_vllm.py"), str(cases_file), str(out_file)],
        env={**os.environ, **RAW_VLLM_ENV},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )

    def answers() -> dict:
        _, stderr = proc.communicate(timeout=600)
        assert proc.returncode == 0, stderr[-3000:]
        return json.loads(out_file.read_text())

    try:
        yield answers
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


@contextmanager
def vllm_server_beside(
    model_dir: str, args: list[str], tmp_dir: Path
) -> Iterator[Callable[[], str]]:
    """vLLM's own OpenAI server (`vllm serve`) on `model_dir` with its command-line `args`,
    started in the background (its log in `tmp_dir`): call what this yields for its base URL
    once it answers. Leaving the block stops it."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # The api_server module, not the `vllm serve` command: that asks for the version of a
    # distribution named vllm, and the CPU build's is named vllm-cpu, so it exits at once.
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir]
    log_file = tmp_dir / "vllm-serve.log"
    with log_file.open("w") as log:  # a file, not a pipe: vLLM logs more than a pipe holds
        proc = subprocess.Popen(
            [*command, "--host", "127.0.0.1", "--port", str(port), *args],
            env={**os.environ, **RAW_VLLM_ENV},  # the reference: its worker in-process
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"

    def ready() -> str:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                tail = log_file.read_text()[-3000:]
                raise AssertionError(f"vllm serve exited {proc.returncode}: {tail}")
            try:
                if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                    return url
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise AssertionError("vllm serve did not answer within 600 s")

    try:
        yield ready
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
