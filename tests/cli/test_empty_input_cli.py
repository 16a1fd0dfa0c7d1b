"""An empty input is a job with nothing to do (issue 31): exit 0, an empty output (a Parquet
output empty with the schema a run with rows writes), and a summary of 0 rows, whatever the
input's format; so is a shard that picks no rows. A pipeline that shards or filters its data
meets empty inputs routinely; vLLM's run-batch expects the same (its `test_empty_file`)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lmpress.data.parquet_out import RESULT_COLUMNS
from tests.conftest import run_lmpress, with_plugin

ECHO = ["--engine", "ECHO", "--generation.max_new_tokens", "4"]
SCHEMA = pa.schema([("id", pa.string()), ("prompt", pa.string()), ("score", pa.float64())])


def empty_input(tmp: Path, kind: str) -> Path:
    """An input of that kind with no rows (a header, a schema, where the format has one)."""
    if kind == "jsonl":
        path = tmp / "in.jsonl"
        path.write_text("")
    elif kind == "blank-lines":
        path = tmp / "in.jsonl"
        path.write_text("\n  \n\n")
    elif kind == "jsonl.gz":
        path = tmp / "in.jsonl.gz"
        path.write_bytes(gzip.compress(b""))
    elif kind == "parquet":
        path = tmp / "in.parquet"
        pq.write_table(SCHEMA.empty_table(), path)
    elif kind in ("csv", "tsv"):
        path = tmp / f"in.{kind}"
        path.write_text("id,prompt\n" if kind == "csv" else "id\tprompt\n")
    elif kind == "hf":
        datasets = pytest.importorskip("datasets")
        path = tmp / "ds"
        features = datasets.Features.from_arrow_schema(SCHEMA)
        empty = datasets.Dataset.from_dict({name: [] for name in SCHEMA.names}, features)
        empty.save_to_disk(str(path))
    return path


def check_nothing_done(run, tmp: Path, src: Path, out: Path) -> None:
    assert run.returncode == 0, run.stderr
    assert "Traceback" not in run.stderr
    assert f"{src}: the input has no rows; nothing to do" in run.stderr
    assert out.exists()
    summary = json.loads(out.with_name(f"{out.name}.summary.json").read_text())
    assert (summary["rows_total"], summary["rows_ok"], summary["rows_failed"]) == (0, 0, 0)


@pytest.mark.parametrize(
    "kind", ["jsonl", "blank-lines", "jsonl.gz", "parquet", "csv", "tsv", "hf"]
)
def test_an_empty_input_writes_an_empty_jsonl_output_and_exits_0(tmp_path, echo_plugin, kind):
    src = empty_input(tmp_path, kind)
    out = tmp_path / "out.jsonl"
    run = run_lmpress("batch", *ECHO, "-i", str(src), "-o", str(out), env=with_plugin(echo_plugin))
    check_nothing_done(run, tmp_path, src, out)
    assert out.read_bytes() == b""
    again = run_lmpress("batch", *ECHO, "-i", str(src), "-o", str(out),
                        env=with_plugin(echo_plugin))  # fmt: skip
    assert again.returncode == 0, again.stderr  # and a re-run too


def test_an_empty_parquet_input_writes_parquet_with_the_schema_rows_would_have(
    tmp_path, echo_plugin
):
    one = tmp_path / "one"
    one.mkdir()
    pq.write_table(pa.Table.from_pylist([{"id": "a", "prompt": "hi", "score": 0.5}], SCHEMA),
                   one / "in.parquet")  # fmt: skip
    env = with_plugin(echo_plugin)
    full = run_lmpress("batch", *ECHO, "-i", str(one / "in.parquet"), "-o",
                       str(one / "out.parquet"), env=env)  # fmt: skip
    assert full.returncode == 0, full.stderr
    src = empty_input(tmp_path, "parquet")
    out = tmp_path / "out.parquet"
    run = run_lmpress("batch", *ECHO, "-i", str(src), "-o", str(out), env=env)
    check_nothing_done(run, tmp_path, src, out)
    table = pq.read_table(out)
    assert table.num_rows == 0
    assert table.schema.names == ["id", "prompt", "score", *RESULT_COLUMNS]
    assert table.schema == pq.read_table(one / "out.parquet").schema


def test_an_empty_jsonl_input_writes_parquet_with_an_id_and_lmpress_columns(tmp_path, echo_plugin):
    src = empty_input(tmp_path, "jsonl")
    out = tmp_path / "out.parquet"
    run = run_lmpress("batch", *ECHO, "-i", str(src), "-o", str(out), env=with_plugin(echo_plugin))
    check_nothing_done(run, tmp_path, src, out)
    table = pq.read_table(out)
    assert table.num_rows == 0 and table.schema.names == ["id", *RESULT_COLUMNS]


def test_a_shard_that_picks_no_rows_is_a_job_with_nothing_to_do(tmp_path, echo_plugin):
    src = tmp_path / "in.jsonl"
    src.write_text('{"id": "a", "prompt": "hi"}\n{"id": "b", "prompt": "ho"}\n')
    out = tmp_path / "out.jsonl"
    run = run_lmpress("batch", *ECHO, "-i", str(src), "-o", str(out), "--shard", "3/4",
                      env=with_plugin(echo_plugin))  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert f"{src}: shard 3/4 has no rows; nothing to do" in run.stderr
    assert out.read_bytes() == b""
    assert json.loads((tmp_path / "out.jsonl.summary.json").read_text())["rows_total"] == 0
