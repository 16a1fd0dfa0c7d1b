"""A pipeline's final dataset reads back as it was written, in each format, from rows given as a
stream (a generator: the exporter never asks for their number)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lmpress.data.jsonl import read_lines
from lmpress.pipeline.export import write_dataset
from lmpress.vocabulary.errors import ConfigError


def made_rows() -> list[dict]:
    """Rows as a pipeline makes them: text, numbers, a judge's nested verdict, a fan-out's
    list, and a column that is null in some rows."""
    return [
        {
            "topic": f"topic {i}",
            "question": f"What is {i} squared?",
            "n": i,
            "score": i / 4,
            "keep": i % 2 == 0,
            "tags": ["math", "squares"][: i % 3],
            "verdict": {"score": i % 10, "reasons": [f"r{i}"], "notes": None},
            "critique": None if i % 3 else f"too short ({i})",
        }
        for i in range(25)
    ]


def stream(rows: list[dict]):
    yield from rows


def test_jsonl_reads_back_equal(tmp_path):
    path = write_dataset(stream(made_rows()), tmp_path, "jsonl")
    assert path == tmp_path / "dataset.jsonl"
    assert [line.value for line in read_lines(path)] == made_rows()


def test_parquet_reads_back_equal_with_nested_values(tmp_path):
    path = write_dataset(stream(made_rows()), tmp_path, "parquet")
    assert path == tmp_path / "dataset.parquet"
    table = pq.read_table(path)
    assert table.column_names == list(made_rows()[0])
    assert table.to_pylist() == made_rows()
    assert table.schema.field("tags").type.value_type == pa.string()  # a list, not JSON text
    assert [p.name for p in tmp_path.iterdir()] == ["dataset.parquet"]  # no spool left


def test_hf_directory_loads_back_equal(tmp_path):
    datasets = pytest.importorskip("datasets")
    path = write_dataset(stream(made_rows()), tmp_path, "hf")
    assert path == tmp_path / "dataset"
    loaded = datasets.load_from_disk(str(path))
    assert loaded.num_rows == 25
    assert list(loaded) == made_rows()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dataset"]  # no scratch cache left


def test_a_second_export_replaces_the_first(tmp_path):
    datasets = pytest.importorskip("datasets")
    write_dataset(stream(made_rows()), tmp_path, "hf")
    write_dataset(stream(made_rows()[:3]), tmp_path, "hf")
    assert list(datasets.load_from_disk(str(tmp_path / "dataset"))) == made_rows()[:3]


def test_a_column_of_mixed_types_is_written_as_json_text(tmp_path):
    rows = [{"id": "a", "answer": 42}, {"id": "b", "answer": "forty-two"}]
    table = pq.read_table(write_dataset(stream(rows), tmp_path, "parquet"))
    assert table.to_pylist() == [{"id": "a", "answer": "42"}, {"id": "b", "answer": '"forty-two"'}]


def test_an_unknown_format_is_one_line(tmp_path):
    with pytest.raises(ConfigError) as caught:
        write_dataset(stream([]), tmp_path, "csv")
    assert str(caught.value) == "dataset format 'csv': a pipeline writes one of jsonl, parquet, hf"
