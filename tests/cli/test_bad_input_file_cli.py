"""A file that is not what it claims stops the job early, in one line (issue 48): 200 KB of
random bytes given as `-i binary.jsonl` used to print 799 `not valid UTF-8` lines (a `.so`
3,359), exit 1, and print them all again on every re-run. Now random bytes, a shared library,
a Parquet file named .jsonl and a page of prose each give one line naming the file and what it
looks like, exit 2, with nothing written. A good file's scattered bad lines still fail alone,
and the terminal shows a few of them and a count, the errors file keeping every one."""

from __future__ import annotations

import importlib.util
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import REPO, run_lmpress, with_plugin

ECHO = ["--engine", "ECHO", "--generation.max_new_tokens", "4"]


def random_bytes(path: Path) -> str:
    path.write_bytes(random.Random(48).randbytes(200_000))
    return "binary data"


def shared_library(path: Path) -> str:
    origin = importlib.util.find_spec("_ctypes").origin  # a .so of Python's own
    assert origin and origin.endswith(".so"), origin
    shutil.copy(origin, path)
    return "an executable or shared library"


def parquet_named_jsonl(path: Path) -> str:
    table = pa.table({"id": [f"r{i}" for i in range(50)], "prompt": ["hi"] * 50})
    pq.write_table(table, path)
    return "a Parquet file"


def prose(path: Path) -> str:
    path.write_text("".join(f"Chapter {i}. It was a dark and stormy night.\n" for i in range(40)))
    return "the first 20 lines cannot be read"


KINDS = {
    "random.jsonl": random_bytes,
    "libthing.so": shared_library,
    "table.jsonl": parquet_named_jsonl,
    "story.jsonl": prose,
}


def check_refused(run, name: str, says: str, folder: Path, keep: set[str]) -> None:
    stderr = run.stderr if isinstance(run.stderr, str) else run.stderr.decode()
    assert run.returncode == 2, stderr
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr  # one line, not one per bad line
    assert name in lines[0] and says in lines[0], lines[0]
    assert {p.name for p in folder.iterdir()} == keep  # nothing written: no output, no side files


@pytest.mark.parametrize("name", list(KINDS))
def test_a_file_that_is_not_what_it_claims_is_refused_in_one_line(tmp_path, echo_plugin, name):
    src = tmp_path / name
    says = KINDS[name](src)
    out = tmp_path / "out.jsonl"
    env = with_plugin(echo_plugin)
    run = run_lmpress("batch", *ECHO, "-i", str(src), "-o", str(out), env=env)
    check_refused(run, str(src), says, tmp_path, {name})
    again = run_lmpress("batch", *ECHO, "-i", str(src), "-o", str(out), env=env)
    check_refused(again, str(src), says, tmp_path, {name})  # and so on every re-run


def test_piped_binary_data_is_refused_in_one_line_and_leaves_nothing(tmp_path, echo_plugin):
    src = tmp_path / "random.bin"
    random_bytes(src)
    out = tmp_path / "out" / "out.jsonl"
    out.parent.mkdir()
    run = subprocess.run(
        [sys.executable, "-m", "lmpress", "batch", *ECHO, "-i", "-", "-o", str(out)],
        input=src.read_bytes(), capture_output=True, cwd=REPO, timeout=300,
        env={**os.environ, **with_plugin(echo_plugin)},
    )  # fmt: skip
    check_refused(run, "-: looks like binary data", "not JSON lines", out.parent, set())


def test_scattered_bad_lines_fail_alone_and_a_few_are_shown(tmp_path, echo_plugin):
    rows = [json.dumps({"id": f"r{i}", "prompt": f"say {i}"}) for i in range(60)]
    bad = [2, 9, 17, 25, 31, 38, 44, 50, 57]  # never 20 in a row
    for i in bad:
        rows[i] = '{"id": "broken", "prompt": '
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(rows) + "\n")
    out = tmp_path / "out.jsonl"
    run = run_lmpress("batch", *ECHO, "-i", str(src), "-o", str(out), env=with_plugin(echo_plugin))
    assert run.returncode == 1, run.stderr
    written = [json.loads(line)["id"] for line in out.read_text().splitlines()]
    assert sorted(written) == sorted(f"r{i}" for i in range(60) if i not in bad)
    errors = [json.loads(line) for line in (tmp_path / "out.jsonl.errors.jsonl").open()]
    assert sorted(e["line"] for e in errors) == [i + 1 for i in bad]  # the file keeps all
    said = [line for line in run.stderr.splitlines() if "not valid JSON" in line]
    assert len(said) == 5  # a few on the terminal...
    assert f"4 more failed rows not shown; every failed row is in {out}.errors.jsonl" in run.stderr
