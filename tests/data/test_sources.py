"""Inputs other than JSONL (lmpress/data/sources.py): Parquet, CSV/TSV and Hugging Face
datasets read as the same stream of numbered rows, and their bad input named."""

from __future__ import annotations

import datetime
import decimal
import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lmpress.data.sources import BATCH_ROWS, open_source
from lmpress.vocabulary.errors import InputError


def rows_of(path, **kwargs) -> list:
    return list(open_source(str(path), **kwargs).lines())


def test_parquet_rows_come_numbered_across_record_batches(tmp_path):
    count = BATCH_ROWS * 2 + 5  # more than one record batch, and row groups that split them
    table = pa.table({"id": [f"r{i}" for i in range(count)], "n": list(range(count))})
    pq.write_table(table, tmp_path / "in.parquet", row_group_size=700)
    lines = rows_of(tmp_path / "in.parquet")
    assert [line.number for line in lines] == list(range(1, count + 1))
    assert lines[-1].value == {"id": f"r{count - 1}", "n": count - 1}
    assert all(line.error is None for line in lines)


def test_parquet_values_json_cannot_hold_become_text(tmp_path):
    when = datetime.datetime(2024, 5, 6, 7, 8, 9)
    table = pa.table({
        "when": pa.array([when], pa.timestamp("us")),
        "day": pa.array([when.date()], pa.date32()),
        "price": pa.array([decimal.Decimal("1.25")], pa.decimal128(5, 2)),
        "blob": pa.array([b"\x00\xff"], pa.binary()),
        "nested": pa.array([{"at": when, "k": [1, 2]}]),
    })  # fmt: skip
    pq.write_table(table, tmp_path / "in.parquet")
    (line,) = rows_of(tmp_path / "in.parquet")
    assert line.value == {
        "when": "2024-05-06T07:08:09", "day": "2024-05-06", "price": "1.25", "blob": "AP8=",
        "nested": {"at": "2024-05-06T07:08:09", "k": [1, 2]},
    }  # fmt: skip
    json.dumps(line.value)  # every row can be journaled


def test_a_file_that_is_not_parquet_is_named(tmp_path):
    (tmp_path / "in.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(InputError, match=r"in.parquet: not a readable Parquet file"):
        rows_of(tmp_path / "in.parquet")


def test_csv_rows_are_dicts_of_strings_numbered_by_line(tmp_path):
    text = '\ufeffid,text\na,"two\nlines"\n\nb,"a, comma"\nc,x,extra\nd,last\n'
    (tmp_path / "in.csv").write_text(text, encoding="utf-8")
    lines = rows_of(tmp_path / "in.csv")
    assert [(line.number, line.value) for line in lines if line.error is None] == [
        (3, {"id": "a", "text": "two\nlines"}),
        (5, {"id": "b", "text": "a, comma"}),
        (7, {"id": "d", "text": "last"}),
    ]
    (bad,) = [line for line in lines if line.error]
    assert (bad.number, bad.error) == (6, "has 3 fields, the header has 2")


def test_tsv_and_compressed_csv(tmp_path):
    (tmp_path / "in.tsv").write_text("id\tprompt\nx\thello, world\n")
    assert rows_of(tmp_path / "in.tsv")[0].value == {"id": "x", "prompt": "hello, world"}
    (tmp_path / "in.csv.gz").write_bytes(gzip.compress(b"id,prompt\ny,hi\n"))
    assert rows_of(tmp_path / "in.csv.gz")[0].value == {"id": "y", "prompt": "hi"}


@pytest.mark.parametrize(
    ("header", "expected"),
    [("id,,text", "the header has an empty column name"),
     ("id,text,id", "the header names column 'id' twice")],
)  # fmt: skip
def test_a_csv_header_lmpress_cannot_map_is_refused(tmp_path, header, expected):
    (tmp_path / "in.csv").write_text(header + "\n1,2,3\n")
    with pytest.raises(InputError, match=expected):
        rows_of(tmp_path / "in.csv")


def test_input_format_overrides_the_suffix(tmp_path):
    (tmp_path / "rows.txt").write_text("id,prompt\nq,hi\n")
    assert rows_of(tmp_path / "rows.txt", input_format="csv")[0].value == {
        "id": "q",
        "prompt": "hi",
    }


def test_a_saved_dataset_and_its_splits(tmp_path):
    datasets = pytest.importorskip("datasets")
    train = datasets.Dataset.from_dict({"id": ["a", "b"], "text": ["one", "two"]})
    test = datasets.Dataset.from_dict({"id": ["c"], "text": ["three"]})
    train.save_to_disk(str(tmp_path / "single"))
    datasets.DatasetDict({"train": train, "test": test}).save_to_disk(str(tmp_path / "dict"))

    assert [line.value["id"] for line in rows_of(tmp_path / "single")] == ["a", "b"]
    assert [line.value["id"] for line in rows_of(tmp_path / "dict")] == ["a", "b"]  # train
    assert [line.value["id"] for line in rows_of(tmp_path / "dict", split="test")] == ["c"]
    with pytest.raises(InputError, match="--split dev: .* has splits train, test"):
        rows_of(tmp_path / "dict", split="dev")
    with pytest.raises(InputError, match="is a single dataset with no splits"):
        rows_of(tmp_path / "single", split="test")


def test_a_data_directory_is_read_as_a_dataset(tmp_path):
    pytest.importorskip("datasets")
    data = tmp_path / "data"
    data.mkdir()
    (data / "part-0.jsonl").write_text(
        "".join(json.dumps({"id": f"r{i}"}) + "\n" for i in range(3))
    )
    assert [line.value["id"] for line in rows_of(data)] == ["r0", "r1", "r2"]


def test_a_hub_name_that_cannot_be_reached_is_one_clear_error(tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    # Offline as HF_HUB_OFFLINE=1 makes it, which both libraries read once, at import: without
    # this the test would wait some twenty seconds on the network's timeouts.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    with pytest.raises(InputError, match="no-such-org/no-such-data: cannot open the dataset"):
        rows_of("hf:no-such-org/no-such-data")


def test_a_dataset_script_is_refused_with_what_to_do_instead(tmp_path):
    pytest.importorskip("datasets")
    (tmp_path / "loader.py").write_text("# a loading script\n")
    with pytest.raises(InputError, match="save_to_disk or as Parquet"):
        rows_of(tmp_path / "loader.py", input_format="hf")


def test_a_directory_without_data_is_refused(tmp_path):
    (tmp_path / "notes.md").write_text("nothing here")
    with pytest.raises(InputError, match="neither a saved dataset"):
        open_source(str(tmp_path))
