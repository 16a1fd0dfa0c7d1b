"""`lmpress` runs forked from a warm interpreter (tests/cli_zygote.py) instead of exec'd.

Most of an `lmpress` test run's CPU is the imports of a fresh interpreter: about 0.6 s for a
remote engine's run (the SDKs) and 4 s for NATIVE's (torch and transformers), against
milliseconds for what the test runs on a tiny model. Each pytest process starts one zygote that
has imported those libraries once; `run` asks it to fork a child that runs `python -m lmpress`
with the test's arguments, environment, directory and stdin, and hands back what
`subprocess.run` would: the exit status, stdout and stderr.

The child is a process of its own, with its own pid, signals and exit; `lmpress.__main__` runs
afresh in it, and what a module outside the zygote's preload imports is imported afresh. What
it shares with the other runs is only the preloaded modules' import-time state (lmpress's own
read nothing there: tests/test_forked_cli.py checks), so `takes` says no (the caller then execs, as
before) when that state could differ from a fresh interpreter's:
- the environment differs from the zygote's in a variable those libraries or the interpreter
  read as they start (ENV_READ_AT_START);
- the command is one whose own code sets such a variable before it imports (EXEC_COMMANDS);
- LMPRESS_TEST_EXEC=1 asks for exec everywhere (a whole run as before, to compare), the
  zygote could not start, or this is vLLM's environment (VLLM below).
Tests of what a fresh interpreter does (what `lmpress --help` imports, a plugin found on a
PYTHONPATH of its own) start their processes themselves and are untouched.
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import locale
import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
EXEC_ENV = "LMPRESS_TEST_EXEC"
# Read by the interpreter, the preloaded libraries or their runtimes (OpenMP, llama.cpp) as they
# start. A run whose environment differs from the zygote's in one of these is exec'd.
ENV_READ_AT_START = (
    "PYTHON",
    "HF_",
    "HUGGINGFACE",
    "TRANSFORMERS_",
    "TOKENIZERS_",
    "TORCH",
    "PYTORCH_",
    "OMP_",
    "KMP_",
    "MKL_",
    "OPENBLAS_",
    "CUDA",
    "GGML_",
    "LLAMA_",
    "TQDM_",
    "LD_",
    "MALLOC_",
    "ARROW_",
    "NUMPY_",
    "PROMETHEUS_",
    "prometheus_",
)
# Under those prefixes but read when used, not at start: a forked child that sets them reads them
# as a fresh one would. Libraries set them in the test process as they run (transformers'
# generate sets TOKENIZERS_PARALLELISM where it compiles, Ray's init PYTHONBREAKPOINT, and
# torch.compile TORCHINDUCTOR_CACHE_DIR to its default, read again at each compile): held
# against the zygote's, they made every later run of that worker an exec.
ENV_READ_AT_USE = {"TOKENIZERS_PARALLELISM", "PYTHONBREAKPOINT", "TORCHINDUCTOR_CACHE_DIR"}
# `lmpress eval` sets TQDM_DISABLE before lm-eval imports tqdm, which a preloaded tqdm would
# already have read.
EXEC_COMMANDS = {"eval"}


def read_at_start_differ(env: dict[str, str], other: dict[str, str]) -> list[str]:
    """The variables read at start whose values the two environments differ in (PYTHONPATH
    aside: the child sets its sys.path from it)."""
    keys = (set(env) | set(other)) - {"PYTHONPATH"} - ENV_READ_AT_USE
    return sorted(k for k in keys if k.startswith(ENV_READ_AT_START) and env.get(k) != other.get(k))


class Zygote:
    """One warm interpreter for this process's runs, started at the first."""

    def __init__(self) -> None:
        self._dir = tempfile.mkdtemp(prefix="lmpress-zygote-")
        self.path = os.path.join(self._dir, "socket")
        self.env = {**(_session_env or os.environ), "PYTHONPATH": str(REPO)}
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "cli_zygote.py"), self.path],
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            text=True,
            preexec_fn=dies_with_parent,
        )
        ready = self.proc.stdout.readline()
        if ready.strip() != "ready":
            self.stop()
            raise RuntimeError(f"the zygote did not start: {ready!r}")

    def takes(self, args: tuple[str, ...], env: dict[str, str]) -> bool:
        if args and args[0] in EXEC_COMMANDS:
            return False
        return not read_at_start_differ(env, self.env)

    def run(
        self,
        args: tuple[str, ...],
        *,
        input: str | None,
        env: dict[str, str],
        cwd: str | Path | None,
        timeout: float,
    ) -> subprocess.CompletedProcess:
        """What `subprocess.run([python, -m, lmpress, *args], capture_output=True, text=True,
        ...)` returns, or raises (TimeoutExpired)."""
        command = [sys.executable, "-m", "lmpress", *args]
        encoding = locale.getpreferredencoding(False)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        in_r, in_w = os.pipe() if input is not None else (os.dup(0), None)
        request = {"args": list(args), "env": env, "cwd": str(cwd or os.getcwd())}
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            conn.connect(self.path)
            socket.send_fds(conn, [json.dumps(request).encode()], [in_r, out_w, err_w])
        finally:
            for fd in (in_r, out_w, err_w):
                os.close(fd)
        pid = json.loads(conn.recv(4096))["pid"]
        deadline = time.monotonic() + timeout
        if in_w is not None:
            threading.Thread(target=feed, args=(in_w, input.encode(encoding)), daemon=True).start()
        try:
            out, err = drain({out_r: "out", err_r: "err"}, deadline)
            conn.settimeout(max(0.0, deadline - time.monotonic()))
            reply = conn.recv(4096)
        except TimeoutError:
            kill(pid)
            raise subprocess.TimeoutExpired(command, timeout) from None
        finally:
            conn.close()
        returncode = ended(reply)
        return subprocess.CompletedProcess(
            command, returncode, text(out, encoding), text(err, encoding)
        )

    def busy(self) -> bool:
        """Whether a run it forked is still going (it would die with its zygote)."""
        import psutil

        try:
            children = psutil.Process(self.proc.pid).children()
        except psutil.NoSuchProcess:
            return False
        return any(c.status() != psutil.STATUS_ZOMBIE for c in children if c.is_running())

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                conn.connect(self.path)
                conn.send(json.dumps({"stop": True}).encode())
                conn.close()
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        os.rmdir(self._dir)


class Forked:
    """What `subprocess.Popen([python, -m, lmpress, *args], ...)` gives, for a child the zygote
    forked: pid, poll, wait, communicate, send_signal/terminate/kill, returncode, and stdin,
    stdout and stderr as pipes (PIPE), /dev/null (DEVNULL), a file, or this process's own."""

    def __init__(
        self,
        zygote: Zygote,
        args: tuple[str, ...],
        *,
        env: dict[str, str],
        cwd: str | Path | None = None,
        stdin=None,
        stdout=None,
        stderr=None,
        text: bool = False,
    ) -> None:
        self.args = [sys.executable, "-m", "lmpress", *args]
        self.returncode: int | None = None
        self.stdin = self.stdout = self.stderr = None
        encoding = locale.getpreferredencoding(False) if text else None
        child_fds, mine = [], []
        for target, (how, mode) in enumerate([(stdin, "w"), (stdout, "r"), (stderr, "r")]):
            if how is None:
                fd = os.dup(target)
            elif how == subprocess.DEVNULL:
                fd = os.open(os.devnull, os.O_RDWR)
            elif how == subprocess.STDOUT:
                fd = os.dup(child_fds[1])
            elif how == subprocess.PIPE:
                read, write = os.pipe()
                fd, ours = (read, write) if mode == "w" else (write, read)
                stream = open(ours, mode + ("" if text else "b"), encoding=encoding)  # noqa: SIM115 (closed by communicate or __exit__, as Popen's)
                setattr(self, ("stdin", "stdout", "stderr")[target], stream)
            else:
                fd = os.dup(how if isinstance(how, int) else how.fileno())
            child_fds.append(fd)
            mine.append(fd)
        request = {"args": list(args), "env": env, "cwd": str(cwd or os.getcwd())}
        self._conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._conn.connect(zygote.path)
            socket.send_fds(self._conn, [json.dumps(request).encode()], child_fds)
        finally:
            for fd in mine:
                os.close(fd)
        self.pid = json.loads(self._conn.recv(4096))["pid"]

    def _status(self, timeout: float | None) -> int | None:
        if self.returncode is None:
            self._conn.settimeout(timeout)
            try:
                reply = self._conn.recv(4096)
            except (TimeoutError, BlockingIOError):
                return None
            self.returncode = ended(reply)
            self._conn.close()
        return self.returncode

    def poll(self) -> int | None:
        return self._status(0)

    def wait(self, timeout: float | None = None) -> int:
        code = self._status(timeout)
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return code

    def communicate(self, input=None, timeout: float | None = None):
        """As Popen's: feed stdin, read stdout and stderr to their end, wait."""
        if self.stdin is not None:
            if input:
                try:
                    self.stdin.write(input)
                except BrokenPipeError:
                    pass
            try:
                self.stdin.close()
            except BrokenPipeError:
                pass
        results: dict[str, object] = {}
        readers = [
            threading.Thread(target=lambda n=name, s=stream: results.update({n: s.read()}))
            for name, stream in (("out", self.stdout), ("err", self.stderr))
            if stream is not None
        ]
        for reader in readers:
            reader.daemon = True
            reader.start()
        deadline = None if timeout is None else time.monotonic() + timeout
        for reader in readers:
            reader.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if reader.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout)
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        self.wait(left)
        for stream in (self.stdout, self.stderr):
            if stream is not None:
                stream.close()
        return results.get("out"), results.get("err")

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # never a pid the zygote has reaped and the kernel reused
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        for stream in (self.stdin, self.stdout, self.stderr):
            if stream is not None:
                stream.close()
        self.wait()


# CPU seconds of the forked runs that have ended (benchmarks/suite_time.py counts them as a test
# process's children's, which an exec'd run's are).
CHILD_CPU = 0.0


def ended(reply: bytes) -> int:
    """The exit status in the zygote's last word on a run."""
    global CHILD_CPU
    if not reply:
        raise RuntimeError("the zygote went away before the run ended")
    done = json.loads(reply)
    CHILD_CPU += done["cpu"]
    return done["returncode"]


def dies_with_parent() -> None:
    """The kernel kills this process when the one that started it dies, however it dies."""
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def feed(fd: int, data: bytes) -> None:
    try:
        with open(fd, "wb") as pipe:
            pipe.write(data)
    except BrokenPipeError:
        pass  # the command ended without reading it all, as subprocess allows


def drain(fds: dict[int, str], deadline: float) -> tuple[bytes, bytes]:
    """Everything written to both pipes until each is closed by every process holding it."""
    chunks: dict[str, list[bytes]] = {"out": [], "err": []}
    with selectors.DefaultSelector() as selector:
        for fd, name in fds.items():
            selector.register(fd, selectors.EVENT_READ, name)
        try:
            while selector.get_map():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError
                for key, _ in selector.select(left):
                    data = os.read(key.fd, 1 << 16)
                    if data:
                        chunks[key.data].append(data)
                    else:
                        selector.unregister(key.fd)
                        os.close(key.fd)
        finally:
            for key in list(selector.get_map().values()):
                os.close(key.fd)
    return b"".join(chunks["out"]), b"".join(chunks["err"])


def text(data: bytes, encoding: str) -> str:
    """As subprocess decodes with text=True: universal newlines."""
    return data.decode(encoding).replace("\r\n", "\n").replace("\r", "\n")


def kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


# vLLM's environment: its runs start engine processes of their own, as users run them; they are
# few, and each costs tens of seconds beside which the imports are nothing.
VLLM = importlib.util.find_spec("vllm") is not None
_zygote: Zygote | None = None
_failed = False
# The environment the zygote starts in: the session's, as tests/conftest.py leaves it. Copied
# at the first run instead, it would hold whatever that test had patched, and every later run
# would differ from it and be exec'd.
_session_env: dict[str, str] | None = None
_retired: list[Zygote] = []  # zygotes of an environment since moved, kept for their runs


def keep_session_environment() -> None:
    global _session_env
    _session_env = dict(os.environ)


def adopt_drift() -> list[str]:
    """Take the process's environment as the session's where it has moved since in a variable
    read at start, and retire the zygote started in the old one (the next run starts
    another). Called as each test starts, before its own patches: what moved there was set
    for longer than a test, by a library as it was imported or ran (scikit-learn sets
    KMP_DUPLICATE_LIB_OK, torch.compile TORCH_WARM_POOL; tests/conftest.py sets those known
    ahead) or by a module's fixture, and every later run of the worker would otherwise be
    exec'd. A retired zygote stays while runs it forked do (a module's server),
    since they die with it. Returns the variables that moved."""
    global _session_env, _zygote
    for old in [z for z in _retired if not z.busy()]:
        _retired.remove(old)
        old.stop()
    if _session_env is None:
        return []
    current = {**os.environ}
    moved = read_at_start_differ(current, _session_env)
    if moved:
        _session_env = current
        if _zygote is not None:
            if _zygote.busy():
                _retired.append(_zygote)
            else:
                _zygote.stop()
            _zygote = None
    return moved


def zygote() -> Zygote | None:
    """This process's zygote, started at the first call; None where runs are exec'd."""
    global _zygote, _failed
    if _zygote is None and not _failed and os.environ.get(EXEC_ENV) != "1" and not VLLM:
        try:
            _zygote = Zygote()
        except (OSError, RuntimeError) as error:
            _failed = True
            print(f"tests/forked_cli.py: lmpress runs are exec'd: {error}", file=sys.stderr)
    return _zygote


def zygote_pids() -> set[int]:
    """This process's zygote and the retired ones still held by their runs."""
    return {z.proc.pid for z in (_zygote, *_retired) if z is not None}


def stop() -> None:
    """Stop this process's zygote (at the session's end, before its leftover check)."""
    global _zygote
    for old in _retired:
        old.stop()
    _retired.clear()
    if _zygote is not None:
        _zygote.stop()
        _zygote = None
