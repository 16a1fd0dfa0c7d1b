"""Schemathesis against `lmpress serve` (the tiny Llama on NATIVE, Files and Batch routes on):
requests generated from the server's own /openapi.json, valid and malformed, to every route,
and each route's documented example. No answer may be a 5xx, and every answer must be what the
document says: a status it lists, its content type, a body of its schema (the `openai` types,
or the API's error object); a method a path does not take gets 405 naming the ones it does.

Short and repeatable, derandomized (the same requests every run): each operation's example and 5
generated requests, then the valid requests of the coverage phase (about 500), one at a time:
with four workers the same requests took 15 s rather than 35, but schemathesis' own generation
is not safe across its worker threads (fresh run AD: a KeyError in its schema cache, reported as
an inconsistent test case). `make fuzz` runs the longer search (benchmarks/fuzz_serve.py).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

CHECKS = (
    "not_a_server_error,status_code_conformance,content_type_conformance,"
    "response_schema_conformance,unsupported_method,allow_header_conformance"
)


def schemathesis_run(
    url: str, *options: str, cwd: Path, timeout: float
) -> subprocess.CompletedProcess:
    """`schemathesis run` (its CLI, as a person runs it) against the server at `url`, in `cwd`
    (where it keeps its cache)."""
    command = [
        sys.executable, "-m", "schemathesis.cli", "run", f"{url}/openapi.json",
        "--checks", CHECKS, "--generation-deterministic", "--workers", "1",
        "--request-timeout", "60", "--suppress-health-check", "all", "--no-color", *options,
    ]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=cwd)


def assert_passed(run: subprocess.CompletedProcess, served) -> None:
    assert run.returncode == 0, run.stdout + run.stderr
    selected = re.search(r"Operations: +(\d+) selected / (\d+) total", run.stdout)
    assert selected and selected[1] == selected[2] and int(selected[1]) >= 21, run.stdout
    assert "Traceback" not in served.log


def test_no_generated_request_gets_a_5xx_or_an_undocumented_answer(llama_server, tmp_path):
    """Each operation's example, then 5 requests generated from its schema, valid or not."""
    run = schemathesis_run(
        llama_server.url, "--phases", "examples,fuzzing", "--max-examples", "5",
        cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert_passed(run, llama_server)


def test_no_valid_request_at_a_boundary_gets_a_5xx(llama_server, tmp_path):
    """Schemathesis' coverage phase, valid requests only: each field at its edges (empty
    strings and lists, each enum value, each member of a union), about 500 requests. This is
    what finds `reasoning.generate_summary: ""` answering 500 without the fix."""
    run = schemathesis_run(
        llama_server.url, "--phases", "coverage", "--mode", "positive",
        cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert_passed(run, llama_server)
