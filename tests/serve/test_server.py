"""The `lmpress serve` command itself: where it listens, its one-line errors, a light --help."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys

from tests.conftest import REPO, run_lmpress, with_plugin


def test_it_listens_on_127_0_0_1_by_default(echo_server):
    assert echo_server.url.startswith("http://127.0.0.1:")
    assert "no API key" in echo_server.log


def test_a_port_in_use_is_a_one_line_error(echo_plugin):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        run = run_lmpress(
            "serve", "--engine", "ECHO", "--port", str(port), env=with_plugin(echo_plugin)
        )
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        f"lmpress: error: cannot listen on 127.0.0.1:{port}: Address already in use; "
        f"pick another --port"
    ]


def test_bad_settings_are_one_line_errors():
    run = run_lmpress("serve", "--port", "70000")
    assert run.returncode == 2
    assert "serve.port: 70000 must be in [0, 65535]" in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1
    run = run_lmpress("serve", "--serve.queue_limit", "0")
    assert "serve.queue_limit: 0 must be at least 1" in run.stderr
    run = run_lmpress("serve", "extra-word")
    assert run.stderr.strip() == "lmpress: error: unexpected argument 'extra-word'"


def test_help_imports_neither_torch_nor_fastapi():
    code = (
        "import sys\n"
        "from lmpress.cli.app import main\n"
        "for argv in (['--help'], ['serve', '--help']):\n"
        "    assert main(argv) == 0\n"
        "heavy = {'torch', 'fastapi', 'uvicorn', 'openai', 'transformers'} & set(sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )
    assert run.returncode == 0, run.stderr
    assert "--api-key" in run.stdout and "LMPRESS_API_KEY" in run.stdout


def test_ctrl_c_stops_the_server_cleanly(serve_process, echo_plugin):
    served = serve_process("--engine", "ECHO", env=with_plugin(echo_plugin))
    served.proc.send_signal(signal.SIGINT)
    assert served.proc.wait(timeout=60) == 0
    served.wait_for_log(lambda line: line == "lmpress serve: stopped")


def test_sigterm_lets_a_stream_in_flight_finish_and_stops_cleanly(serve_process, echo_plugin):
    served = serve_process(
        "--engine", "ECHO", "--model.model_name", "echo-model",
        "--generation.max_new_tokens", "100000",
        env={**with_plugin(echo_plugin), "ECHO_DELAY_S": "0.05"},
    )  # fmt: skip
    words = " ".join(f"w{i}" for i in range(40))  # about 2 s of reply, well within the grace
    stream = served.client().chat.completions.create(
        model="echo-model", messages=[{"role": "user", "content": words}], stream=True
    )
    pieces = [next(stream).choices[0].delta.content or ""]  # the reply has begun
    served.proc.send_signal(signal.SIGTERM)
    chunks = list(stream)
    pieces += [c.choices[0].delta.content or "" for c in chunks if c.choices]
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert "".join(pieces) == "ECHO " + json.dumps([{"role": "user", "content": words}])
    assert served.proc.wait(timeout=60) == 0
    served.wait_for_log(lambda line: line.startswith("lmpress serve: stopping: no new requests"))
    served.wait_for_log(lambda line: line == "lmpress serve: stopped")
    assert "Traceback" not in served.log
