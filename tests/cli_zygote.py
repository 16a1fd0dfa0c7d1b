"""A warm interpreter that `lmpress` test runs fork from (tests/forked_cli.py is its client).

Run as `python tests/cli_zygote.py SOCKET`. It imports the heavy libraries an `lmpress` process
imports (torch, transformers, the providers' SDKs, pyarrow, llama.cpp's bindings) and lmpress's
own modules (all but LMPRESS_PRELOAD_SKIPS), then answers on a Unix socket. Each request names
argv, the environment and the working directory, and passes three file descriptors (stdin,
stdout, stderr). The zygote forks; the child takes those descriptors, that environment and
directory, and runs `python -m lmpress` as the interpreter would (`lmpress.__main__` run afresh,
atexit, non-daemon threads joined), then exits with its status. The zygote answers the child's
pid at once and its exit status when it ends (negative: the signal that killed it, as
subprocess reports it) with its CPU time.

What a child does not get afresh is the preloaded libraries' import-time state: tests/forked_cli.py
runs `lmpress` by exec instead whenever the environment differs where those libraries read it.
"""

from __future__ import annotations

import atexit
import ctypes
import gc
import importlib
import json
import os
import pkgutil
import runpy
import selectors
import signal
import socket
import sys
import threading
import traceback

# Imported once here, so that no child pays for them. Each is a library that reads nothing of
# the environment at import that a test changes (tests/forked_cli.py checks), and starts no
# thread: a fork keeps only the thread that forks.
PRELOAD = [
    "numpy",
    "torch",
    "safetensors.torch",
    "tokenizers",
    "transformers",
    "transformers.modeling_utils",
    "transformers.generation",
    "transformers.models.auto.modeling_auto",
    "transformers.models.auto.tokenization_auto",
    "transformers.models.llama.modeling_llama",
    "openai",
    "anthropic",
    "google.genai",
    "httpx",
    "pyarrow",
    "pyarrow.parquet",
    "llama_cpp",
]
MAX_REQUEST = 1 << 20


# lmpress's own modules, all but those that import a library which reads its environment as it
# is imported (Ray, lm-eval). No lmpress module reads the environment, the clock or the working
# directory at import (tests/test_forked_cli.py checks), so a module imported here is the one a
# fresh interpreter would import; a run's own work starts in `lmpress.__main__`, run afresh in
# each child. They cost a child 0.1-0.2 s of CPU otherwise, most of what a run on a tiny model
# or a remote engine spends.
LMPRESS_PRELOAD_SKIPS = ("lmpress.__main__", "lmpress.batch.cluster", "lmpress.integrations")


def preload() -> None:
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            pass  # an environment without it (the vLLM one): its runs import it themselves
    packages = [importlib.import_module("lmpress")]
    while packages:
        package = packages.pop()
        for module in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
            if module.name not in LMPRESS_PRELOAD_SKIPS:
                imported = importlib.import_module(module.name)
                if module.ispkg:
                    packages.append(imported)


def run_child(request: dict, fds: list[int], own: list) -> None:
    """In the forked child: become `python -m lmpress ARGS` and never return."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    # Dies with the zygote, as the zygote dies with the pytest process that started it.
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    for thing in own:  # the zygote's sockets, selector and pipe
        if isinstance(thing, int):
            os.close(thing)
        else:
            thing.close()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.path[:] = [os.getcwd(), *python_path(os.environ), *BASE_PATH]
    importlib.invalidate_caches()
    sys.argv = ["-m", *request["args"]]
    code, interrupted = 0, False
    try:
        runpy.run_module("lmpress", run_name="__main__", alter_sys=True)
    except SystemExit as stop:
        code = exit_code(stop.code)
    except KeyboardInterrupt:
        traceback.print_exc()
        interrupted = True
    except BaseException:
        traceback.print_exc()
        code = 1
    # What the interpreter does as it exits: join non-daemon threads, then run atexit.
    try:
        threading._shutdown()  # type: ignore[attr-defined]
    except BaseException:
        traceback.print_exc()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    if interrupted:  # an uncaught Ctrl-C ends Python by the signal itself
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code & 0xFF)


def python_path(env) -> list[str]:
    """PYTHONPATH's folders as the interpreter puts them on sys.path."""
    return [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]


# sys.path without the zygote's own first entries (this script's folder and its PYTHONPATH):
# what follows them in every interpreter of this environment.
BASE_PATH = [p for p in sys.path[1:] if p not in python_path(os.environ)]


def exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def serve(path: str) -> None:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(64)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so the wakeup fd hears it
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "accept")
    selector.register(wake_r, selectors.EVENT_READ, "child")
    children: dict[int, socket.socket] = {}
    conns: set[socket.socket] = set()
    print("ready", flush=True)

    while True:
        for key, _ in selector.select():
            if key.data == "accept":
                conn, _ = listener.accept()
                conns.add(conn)
                selector.register(conn, selectors.EVENT_READ, "request")
            elif key.data == "child":
                os.read(wake_r, 4096)
                reap(children, conns, selector)
            else:
                conn = key.fileobj
                selector.unregister(conn)
                data, fds, _, _ = socket.recv_fds(conn, MAX_REQUEST, 3)
                if not data:  # the client went away before asking
                    conns.discard(conn)
                    conn.close()
                    continue
                request = json.loads(data)
                if request.get("stop"):
                    os._exit(0)  # nothing to clean up: skip finalizing torch and the rest
                own = [listener, selector, wake_r, wake_w, *conns]
                # Everything the zygote holds out of the child's garbage collections: a child
                # that traversed the preloaded objects would write to every page holding one,
                # and copy it (the runs of tests/cli took half as much CPU again without this).
                gc.freeze()
                pid = os.fork()
                if pid == 0:
                    run_child(request, fds, own)
                for fd in fds:
                    os.close(fd)
                children[pid] = conn
                conn.send(json.dumps({"pid": pid}).encode())
        reap(children, conns, selector)


def reap(children: dict[int, socket.socket], conns: set, selector) -> None:
    while children:
        try:
            pid, status, usage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is None:
            continue
        try:
            done = {
                "returncode": os.waitstatus_to_exitcode(status),
                "cpu": usage.ru_utime + usage.ru_stime,  # with its children waited for
            }
            conn.send(json.dumps(done).encode())
        except OSError:
            pass  # the client gave up on it (a timeout) and closed its end
        conns.discard(conn)
        conn.close()


def main() -> None:
    preload()
    serve(sys.argv[1])


if __name__ == "__main__":
    main()
