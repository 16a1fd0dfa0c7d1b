"""Real `lmpress serve` processes for the serve tests: the CLI in a subprocess on 127.0.0.1 and a
free port, its stderr (the request log) collected as it comes."""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager

import httpx
import pytest
from openai import AsyncOpenAI, OpenAI

from tests.conftest import REPO, dies_with_its_parent, lmpress_process, with_plugin

LISTENING = re.compile(r"listening on (http://\S+)/v1")


class Served:
    """A running `lmpress serve`."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None, start_timeout=300):
        inherited = {k: v for k, v in os.environ.items() if k != "LMPRESS_API_KEY"}
        full_env = {**inherited, "PYTHONPATH": str(REPO), **(env or {})}
        self.args = args
        self.proc = lmpress_process(
            "serve",
            "--port",
            "0",
            *args,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=full_env,
            preexec_fn=dies_with_its_parent,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        line = self.wait_for_log(lambda line: LISTENING.search(line), start_timeout)
        self.url = LISTENING.search(line).group(1)

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))

    @property
    def log(self) -> str:
        return "\n".join(self.lines)

    def wait_for_log(self, predicate: Callable[[str], object], timeout: float = 60) -> str:
        """The first log line matching `predicate`, waiting for it to be written."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if predicate(line):
                    return line
            if self.proc.poll() is not None and not self._reader.is_alive():
                raise AssertionError(f"lmpress serve exited {self.proc.returncode}:\n{self.log}")
            time.sleep(0.02)
        raise AssertionError(f"no such log line within {timeout}s; the log:\n{self.log}")

    def request_line(self, request_id: str) -> str:
        return self.wait_for_log(lambda line: f" {request_id} " in line)

    def client(self, api_key: str = "unused", **kwargs) -> OpenAI:
        return OpenAI(base_url=f"{self.url}/v1", api_key=api_key, max_retries=0, **kwargs)

    def async_client(self, api_key: str = "unused", **kwargs) -> AsyncOpenAI:
        return AsyncOpenAI(base_url=f"{self.url}/v1", api_key=api_key, max_retries=0, **kwargs)

    def http(self, **kwargs) -> httpx.Client:
        return httpx.Client(base_url=self.url, **{"timeout": 60, **kwargs})

    def in_flight(self) -> int:
        return httpx.get(f"{self.url}/health").json()["requests_in_flight"]

    def wait_until_idle(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while self.in_flight() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert self.in_flight() == 0, f"requests still in flight; the log:\n{self.log}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(timeout=5)


@contextmanager
def serving(*args: str, env: dict[str, str] | None = None) -> Iterator[Served]:
    """A `lmpress serve` with these arguments, stopped when the block ends."""
    served = Served(list(args), env)
    try:
        yield served
    finally:
        served.stop()


@pytest.fixture(scope="module")
def serve_process() -> Iterator[Callable[..., Served]]:
    """Start `lmpress serve` with some arguments; every server started is stopped when the test
    file is done, so a worker holds no file's servers past it (a SmolLM2 server is 1.5 GB)."""
    with ExitStack() as stack:
        yield lambda *args, env=None: stack.enter_context(serving(*args, env=env))


@pytest.fixture(scope="session")
def llama_server(tiny_llama, tmp_path_factory) -> Iterator[Served]:
    """The tiny Llama on the NATIVE engine; replies are random text, greedy and repeatable, cut
    at 16 tokens. The Files and Batch routes are on (a state directory of its own)."""
    with serving(
        "--engine", "NATIVE", "--model.model_name", tiny_llama,
        "--serve.served_model_name", "tiny-llama",
        "--generation.max_new_tokens", "16", "--generation.batch_size", "8",
        "--state-dir", str(tmp_path_factory.mktemp("state")),
    ) as served:  # fmt: skip
        yield served


@pytest.fixture(scope="session")
def echo_server(echo_plugin) -> Iterator[Served]:
    """ECHO: the reply is a transcript of what reached the engine. Small body limit (413)."""
    with serving(
        "--engine", "ECHO", "--model.model_name", "echo-model",
        "--serve.max_body_bytes", "4096", "--log-content",
        env=with_plugin(echo_plugin),
    ) as served:  # fmt: skip
        yield served


@pytest.fixture(scope="session")
def slow_echo_server(echo_plugin) -> Iterator[Served]:
    """ECHO slowed to 20 words a second, with room for one request at a time (503 beyond)."""
    with serving(
        "--engine", "ECHO", "--model.model_name", "echo-model", "--serve.queue_limit", "1",
        "--generation.max_new_tokens", "100000",
        env={**with_plugin(echo_plugin), "ECHO_DELAY_S": "0.05"},
    ) as served:  # fmt: skip
        yield served


@pytest.fixture(scope="session")
def llava_server() -> Iterator[Served]:
    """The tiny LLaVA-style model on NATIVE, served as "tiny-llava": it reads images."""
    with serving(
        "--engine", "NATIVE", "--model.model_name", "tiny:llava",
        "--serve.served_model_name", "tiny-llava", "--generation.max_new_tokens", "8",
    ) as served:  # fmt: skip
        yield served


@pytest.fixture(scope="session")
def think_server() -> Iterator[Served]:
    """tiny:think on NATIVE, served as "think": a reasoning model's template and marks, its
    thinking cut at 4 tokens unless a request says otherwise."""
    with serving(
        "--engine", "NATIVE", "--model.model_name", "tiny:think",
        "--serve.served_model_name", "think", "--generation.max_new_tokens", "12",
        "--generation.max_reasoning_tokens", "4",
    ) as served:  # fmt: skip
        yield served


@pytest.fixture(scope="session")
def remote_server() -> Iterator[Served]:
    """REMOTE in front of the loopback OpenAI server (tests/servers/llm_server.py), served as
    "test-model"."""
    from tests.servers.llm_server import LLMServer

    with LLMServer() as upstream, serving(
        "--engine", "REMOTE", "--remote_params.api_url", upstream.openai_url,
        "--model.model_name", "test-model", "--remote_params.max_retries", "0",
    ) as served:  # fmt: skip
        yield served
