"""The hostile-input corpus: every file in tests/hostile/ is one kind of bad input (a file, a row,
a recipe, a command line, an HTTP body for serve). For each, a user must see one clear line that
names where and what, no traceback, and nothing that existed before the run changed.

Adding a case is adding a file. A command case:
    {"args": [...], "files": {NAME: TEXT}, "expect": "text of the one line", "exit": 2,
     "where": "in.jsonl:2:" (optional: also on that line)}
where "{tmp}" in args is the case's directory, and a file's TEXT may instead be
{"latin1": TEXT} (written as Latin-1) or {"gzip_cut": TEXT} (gzipped, then cut short).
A serve case:
    {"http": {"path": "/v1/...", "body": BODY, "raw": false}, "status": 400, "expect": "..."}
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import httpx
import pytest

from tests.conftest import run_lmpress, with_plugin

CASES = sorted((Path(__file__).parent / "hostile").glob("*.json"))


def _write(root: Path, files: dict) -> dict[str, bytes]:
    written = {}
    for name, text in files.items():
        if isinstance(text, dict) and "latin1" in text:
            data = text["latin1"].encode("latin-1")
        elif isinstance(text, dict) and "gzip_cut" in text:
            whole = gzip.compress(text["gzip_cut"].encode())
            data = whole[: len(whole) // 2]
        else:
            data = text.encode()
        (root / name).write_bytes(data)
        written[name] = data
    return written


@pytest.fixture(scope="module")
def served(echo_plugin):
    from tests.serve.conftest import Served

    server = Served(["--engine", "ECHO"], env=with_plugin(echo_plugin))
    yield server
    server.proc.terminate()
    server.proc.wait(30)


def test_the_corpus_has_at_least_40_cases():
    assert len(CASES) >= 40


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_hostile_input(path: Path, tmp_path: Path, request):
    case = json.loads(path.read_text(encoding="utf-8"))
    if "http" in case:
        _check_http(case, request.getfixturevalue("served"))
        return
    before = _write(tmp_path, case["files"])
    args = [a.replace("{tmp}", str(tmp_path)) for a in case["args"]]
    env = with_plugin(request.getfixturevalue("echo_plugin"))
    run = run_lmpress(*args, input=case.get("stdin", ""), env=env, cwd=tmp_path)
    assert run.returncode == case["exit"], run.stderr
    assert "Traceback" not in run.stderr and "internal error" not in run.stderr
    shown = run.stderr + (run.stdout if case.get("stdout_too") else "")
    where = case.get("where", "")
    lines = [line for line in shown.splitlines() if case["expect"] in line and where in line]
    assert lines, f"no line with {where!r} and {case['expect']!r} in:\n{shown}"
    for name, data in before.items():  # nothing already written is lost
        assert (tmp_path / name).read_bytes() == data, name


def _check_http(case: dict, served) -> None:
    spec = case["http"]
    body = spec["body"]
    content = body if spec.get("raw") else json.dumps(body)
    reply = httpx.post(
        f"{served.url}{spec['path']}",
        content=content,
        headers={"content-type": "application/json"},
        timeout=60,
    )
    assert reply.status_code == case["status"], reply.text
    message = reply.json()["error"]["message"]
    assert case["expect"] in message and "\n" not in message, message
    assert "Traceback" not in served.log
    assert httpx.get(f"{served.url}/health", timeout=30).status_code == 200
