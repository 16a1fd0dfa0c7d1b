"""The `lmpress` the docs' examples find first on their PATH (tests/test_doc_examples.py): it runs
the command in a child forked from the test process's warm interpreter (tests/cli_zygote.py),
as tests/forked_cli.py runs the other tests' commands, instead of a fresh interpreter that
imports torch again for each of the examples' forty-odd commands.

The child gets this process's stdin, stdout and stderr, environment, directory and arguments;
a signal sent here (the examples' server is stopped with SIGTERM) is passed on to it; and this
process ends as the child ended: its exit status, or the signal that killed it. Where the
zygote would not run the command as a fresh interpreter would (`forked_cli.Zygote.takes`),
this process becomes `python -m lmpress` itself.

`write_shim(folder, zygote)` puts the executable in a folder, with `zygote.json` beside it:
the zygote's socket and its own environment.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PASSED_ON = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


def write_shim(folder: Path, zygote) -> None:
    """Write `folder/lmpress` for this zygote."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "zygote.json").write_text(json.dumps({"socket": zygote.path, "env": zygote.env}))
    shim = folder / "lmpress"
    # -S: the shim needs no site-packages (forked_cli's imports are the standard library's),
    # and starts in milliseconds; what it execs where the zygote cannot serve has them.
    shim.write_text(
        f"#!{sys.executable} -S\n"
        f"import sys; sys.path.insert(0, {str(REPO)!r})\n"
        f"from tests.doc_shim import main; main({str(folder)!r})\n"
    )
    shim.chmod(0o755)


def main(folder: str) -> None:
    from tests import forked_cli

    args, env = sys.argv[1:], dict(os.environ)
    try:
        zygote = json.loads((Path(folder) / "zygote.json").read_text())
    except (OSError, ValueError):
        _exec(args, env)
    if not _takes(args, env, zygote["env"]):
        _exec(args, env)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        conn.connect(zygote["socket"])
    except OSError:  # the zygote has stopped: a fresh interpreter it is
        _exec(args, env)
    request = {"args": args, "env": env, "cwd": os.getcwd()}
    socket.send_fds(conn, [json.dumps(request).encode()], [0, 1, 2])
    pid = json.loads(conn.recv(4096))["pid"]
    for number in PASSED_ON:
        signal.signal(number, lambda sig, _frame: _pass_on(pid, sig))
    code = forked_cli.ended(conn.recv(4096))  # a signal handled meanwhile resumes the wait
    if code < 0:  # killed by a signal: end the same way
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(code)


def _takes(args: list[str], env: dict[str, str], zygote_env: dict[str, str]) -> bool:
    """As `forked_cli.Zygote.takes`, with HF_HOME set to where the zygote's libraries already
    look (the examples' HOME is a scratch folder, so their HF_HOME names the real cache) taken
    as the same."""
    from tests import forked_cli

    if args and args[0] in forked_cli.EXEC_COMMANDS:
        return False
    home = zygote_env.get("HOME", str(Path.home()))
    default = zygote_env.get("HF_HOME", os.path.join(home, ".cache", "huggingface"))
    if env.get("HF_HOME") == default:
        env = {k: v for k, v in env.items() if k != "HF_HOME"}
        zygote_env = {k: v for k, v in zygote_env.items() if k != "HF_HOME"}
    return not forked_cli.read_at_start_differ(env, zygote_env)


def _pass_on(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _exec(args: list[str], env: dict[str, str]) -> None:
    os.execve(sys.executable, [sys.executable, "-m", "lmpress", *args], env)
