"""JSONL streaming: line numbers, bad lines reported not fatal, flushed writes."""

from __future__ import annotations

import json

import pytest

from lmpress.data.jsonl import JsonlWriter, count_lines, read_lines
from lmpress.errors import InputError


def test_reads_lines_with_numbers_and_reports_bad_ones(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_bytes(b'{"a": 1}\n\n{"b": \n\xff\xfe\n{"c": 3}')
    lines = list(read_lines(path))
    assert [(line.number, line.value) for line in lines if not line.error] == [
        (1, {"a": 1}),
        (5, {"c": 3}),
    ]
    errors = {line.number: line.error for line in lines if line.error}
    assert "not valid JSON" in errors[3]
    assert "not valid UTF-8" in errors[4]
    assert count_lines(path) == 4


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(InputError, match="no such input file"):
        list(read_lines(tmp_path / "nope.jsonl"))
    with pytest.raises(InputError, match="is a directory"):
        list(read_lines(tmp_path))


def test_writer_flushes_each_line(tmp_path):
    path = tmp_path / "out" / "o.jsonl"
    writer = JsonlWriter(path)
    writer.write({"x": "é"})
    # Visible to another reader before close: a crash loses nothing already written.
    assert json.loads(path.read_text(encoding="utf-8")) == {"x": "é"}
    writer.close()
