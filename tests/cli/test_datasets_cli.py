"""Datasets in and out from the command line (issue 17): Parquet, JSONL, CSV and a saved Hugging
Face dataset, each carried to Parquet or JSONL with its ids, columns and row count, and each
killed with SIGKILL mid-job and resumed with nothing lost or duplicated."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import REPO, lmpress_process, run_lmpress, with_plugin
from tests.growing_files import whole_lines

ROWS = 48
ECHO = ["--engine", "ECHO", "--model.model_name", "echo", "--generation.max_new_tokens", "6",
        "--generation.batch_size", "2"]  # fmt: skip


def table_rows() -> list[dict]:
    return [
        {"uid": i, "text": f"question {i}", "score": i / 4, "tags": ["x"] * (i % 3)}
        for i in range(ROWS)
    ]


def kill_and_resume(args: list[str], record: Path, env: dict[str, str]) -> int:
    """Run the job, kill -9 it each time its record has grown by a few rows, until it finishes
    or has been killed twice (a resumed job killed again: each start costs a second or more of
    CPU, and more kills take the same paths); then run it once more to completion. The number
    of kills that landed mid-job."""
    full_env = {**os.environ, **env, "ECHO_DELAY_S": "0.01"}
    kills = 0
    for attempt in range(12):
        target = len(whole_lines(record)) + 3 + attempt % 4
        proc = lmpress_process("batch", *args, env=full_env, cwd=REPO,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        deadline = time.time() + 60
        while proc.poll() is None and len(whole_lines(record)) < target and time.time() < deadline:
            time.sleep(0.005)
        if proc.poll() is not None:
            assert proc.returncode == 0, proc.stderr.read()
            break
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stderr.close()
        kills += 1
        for line in record.read_bytes().split(b"\n")[:-1]:  # whole lines stay whole
            json.loads(line)
        if kills >= 2:
            break
    finish = run_lmpress("batch", *args, env=env)
    assert finish.returncode == 0, finish.stderr
    return kills


@pytest.fixture
def env(echo_plugin) -> dict[str, str]:
    return with_plugin(echo_plugin)


def check_parquet(out: Path, id_name: str, expected: dict[str, dict]) -> list[dict]:
    got = pq.read_table(out).to_pylist()
    ids = [str(row[id_name]) for row in got]
    assert len(ids) == len(set(ids)) == len(expected)
    for row in got:
        want = expected[str(row[id_name])]
        assert {k: row[k] for k in want} == want
        assert row["response"].startswith("ECHO") and row["error_kind"] is None
        assert row["prompt_tokens"] > 0 and row["completion_tokens"] == 6
    return got


def test_parquet_to_jsonl_keeps_ids_and_columns_through_kills(tmp_path, env):
    pq.write_table(pa.Table.from_pylist(table_rows()), tmp_path / "in.parquet", row_group_size=10)
    out = tmp_path / "out.jsonl"
    args = ["-i", str(tmp_path / "in.parquet"), "-o", str(out), "--prompt-template",
            "Answer: {text}", "--id-column", "uid", *ECHO]  # fmt: skip
    assert kill_and_resume(args, out, env) >= 2
    got = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(row["uid"] for row in got) == list(range(ROWS))
    for row in got:
        want = table_rows()[row["uid"]]
        assert {k: row[k] for k in want} == want
        assert row["messages"][0] == {"role": "user", "content": f"Answer: {want['text']}"}
        assert row["response"]["text"].startswith("ECHO")


def test_jsonl_to_parquet_keeps_ids_and_columns_through_kills(tmp_path, env):
    rows = [{"id": f"r{i}", "prompt": f"hello {i}", "meta": {"n": i}} for i in range(ROWS)]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out.parquet"
    args = ["-i", str(tmp_path / "in.jsonl"), "-o", str(out), *ECHO]
    assert kill_and_resume(args, tmp_path / "out.parquet.journal.jsonl", env) >= 2
    check_parquet(out, "id", {r["id"]: r for r in rows})


def test_csv_to_parquet_keeps_ids_and_columns_through_kills(tmp_path, env):
    with (tmp_path / "in.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["key", "text", "lang"])
        writer.writerows([f"k{i}", f"text, {i}", "en"] for i in range(ROWS))
    out = tmp_path / "out.parquet"
    args = ["-i", str(tmp_path / "in.csv"), "-o", str(out), "--prompt-template", "Say: {text}",
            "--system", "Be brief.", "--id-column", "key", *ECHO]  # fmt: skip
    assert kill_and_resume(args, tmp_path / "out.parquet.journal.jsonl", env) >= 2
    expected = {f"k{i}": {"key": f"k{i}", "text": f"text, {i}", "lang": "en"} for i in range(ROWS)}
    got = check_parquet(out, "key", expected)
    assert pq.read_schema(out).names[:3] == ["key", "text", "lang"]  # no id column added
    assert '"Be brief."' in got[0]["response"]  # ECHO repeats the system turn it was sent


def test_saved_dataset_to_parquet_keeps_ids_and_columns_through_kills(tmp_path, env):
    datasets = pytest.importorskip("datasets")
    rows = table_rows()
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "ds"))
    out = tmp_path / "out.parquet"
    args = ["-i", str(tmp_path / "ds"), "-o", str(out), "--prompt-template", "{{ text }}?",
            "--id-column", "uid", *ECHO]  # fmt: skip
    assert kill_and_resume(args, tmp_path / "out.parquet.journal.jsonl", env) >= 2
    check_parquet(out, "uid", {str(r["uid"]): r for r in rows})
    assert pq.read_schema(out).field("uid").type == pa.int64()


def test_parquet_to_parquet_keeps_the_input_types(tmp_path, env):
    schema = pa.schema([("uid", pa.int16()), ("text", pa.large_string()), ("day", pa.date32())])
    table = pa.table({"uid": [1, 2], "text": ["a", "b"], "day": [19000, 19001]}, schema=schema)
    pq.write_table(table, tmp_path / "in.parquet")
    run = run_lmpress("batch", "-i", str(tmp_path / "in.parquet"), "-o", str(tmp_path / "o.pq"),
                      "--prompt-template", "{text}", "--id-column", "uid", *ECHO, env=env)  # fmt: skip
    assert run.returncode == 0, run.stderr
    out = pq.read_table(tmp_path / "o.pq")
    assert out.schema.field("uid").type == pa.int16()
    assert out.schema.field("day").type == pa.date32()
    kept = sorted(out.select(["uid", "text", "day"]).to_pylist(), key=lambda row: row["uid"])
    assert kept == table.to_pylist()  # rows come in the order they finished


def test_failed_rows_are_in_the_parquet_with_the_same_schema_and_run_again(tmp_path, env):
    rows = [{"id": "a", "text": "fine"}, {"id": "b", "body": "no text column"}]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out.parquet"
    args = ["batch", "-i", str(tmp_path / "in.jsonl"), "-o", str(out), "--prompt-template",
            "{text}", *ECHO]  # fmt: skip
    run = run_lmpress(*args, env=env)
    assert run.returncode == 1
    assert "in.jsonl:2: the prompt template names column 'text'" in run.stderr
    got = {row["id"]: row for row in pq.read_table(out).to_pylist()}
    assert got["a"]["error_kind"] is None and got["a"]["response"].startswith("ECHO")
    assert got["b"]["error_kind"] == "invalid_row" and got["b"]["response"] is None
    assert got["b"]["body"] == "no text column"
    # The failed row is retried on the next run, not written twice.
    (tmp_path / "in.jsonl").write_text(json.dumps(rows[0]) + "\n" + json.dumps(
        {"id": "b", "text": "now it has one"}) + "\n")  # fmt: skip
    again = run_lmpress(*args, env=env)
    assert again.returncode == 0, again.stderr
    got = pq.read_table(out).to_pylist()
    assert sorted(row["id"] for row in got) == ["a", "b"]
    assert all(row["error_kind"] is None for row in got)


def test_limit_then_the_whole_input_resumes_and_a_sample_is_reproducible(tmp_path, env):
    rows = [{"id": f"r{i}", "prompt": f"p{i}"} for i in range(30)]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    base = ["batch", "-i", str(tmp_path / "in.jsonl"), *ECHO]
    first = run_lmpress(*base, "-o", str(tmp_path / "out.parquet"), "--limit", "5", env=env)
    assert first.returncode == 0, first.stderr
    done = [r["id"] for r in pq.read_table(tmp_path / "out.parquet").to_pylist()]
    assert sorted(done) == [f"r{i}" for i in range(5)]  # in the order they finished
    whole = run_lmpress(*base, "-o", str(tmp_path / "out.parquet"), env=env)
    assert "resuming" in whole.stderr and "5 rows done" in whole.stderr
    assert pq.read_table(tmp_path / "out.parquet").num_rows == 30

    def sample(name: str, seed: str) -> list[str]:
        out = tmp_path / name
        run = run_lmpress(*base, "-o", str(out), "--sample", "7", "--seed", seed, env=env)
        assert run.returncode == 0, run.stderr
        return sorted(json.loads(line)["id"] for line in out.read_text().splitlines())

    picked = sample("s1.jsonl", "3")
    assert len(picked) == 7 and sample("s2.jsonl", "3") == picked != sample("s3.jsonl", "4")


def test_parquet_output_needs_its_journal_to_resume(tmp_path, env):
    (tmp_path / "in.jsonl").write_text(json.dumps({"id": "a", "prompt": "hi"}) + "\n")
    args = ["batch", "-i", str(tmp_path / "in.jsonl"), "-o", str(tmp_path / "out.parquet"), *ECHO]
    assert run_lmpress(*args, env=env).returncode == 0
    (tmp_path / "out.parquet.journal.jsonl").unlink()
    before = (tmp_path / "out.parquet").read_bytes()
    run = run_lmpress(*args, env=env)
    assert run.returncode == 2
    assert "its journal (out.parquet.journal.jsonl) is missing" in run.stderr
    assert (tmp_path / "out.parquet").read_bytes() == before


def test_stdout_stays_jsonl_and_parquet_is_not_streamed(tmp_path, env):
    pq.write_table(pa.Table.from_pylist(table_rows()[:3]), tmp_path / "in.parquet")
    args = ["batch", "-i", str(tmp_path / "in.parquet"), "--prompt-template", "{text}", *ECHO]
    run = run_lmpress(*args, "-o", "-", env=env)
    assert run.returncode == 0, run.stderr
    assert len([json.loads(line) for line in run.stdout.splitlines()]) == 3
    refused = run_lmpress(*args, "-o", "-", "--output-format", "parquet", env=env)
    assert refused.returncode == 2 and "Parquet needs a file" in refused.stderr
