"""JSONL streaming: line numbers, bad lines reported not fatal, flushed writes."""

from __future__ import annotations

import gzip
import io
import json

import pytest

from lmpress.data.jsonl import JsonlWriter, count_lines, read_lines
from lmpress.vocabulary.errors import InputError


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


def test_each_bad_line_says_where_and_why_and_reading_goes_on(tmp_path):
    path = tmp_path / "in.jsonl"
    lines = [b'\xef\xbb\xbf{"a": 1}', b"  ", b'{"b": ]', b'{"c": "\xe2\x82"}', b"[1,]", b'{"d": 4}']
    path.write_bytes(b"\n".join(lines) + b"\n")
    got = [(line.number, line.value, line.error) for line in read_lines(path)]
    assert got == [
        (1, {"a": 1}, None),  # the BOM skipped
        (3, None, "not valid JSON (Expecting value at column 7)"),  # line 2, blank, counted
        (4, None, "not valid UTF-8 (byte 8)"),
        (5, None, "not valid JSON (Expecting value at column 4)"),
        (6, {"d": 4}, None),
    ]


# Lines orjson refuses or would read otherwise; json's reading is the reference.
JSON_ONLY = [
    '{"x": NaN, "y": Infinity, "z": -Infinity}',
    '{"x": 1e400}',
    '{"x": 18446744073709551616}',  # 2**64: orjson would give a float
    '{"x": -9223372036854775809}',
    '{"x": 9999999999999999999, "y": [123456789012345678901234567890]}',
    '{"x": "\\ud800", "y": "\\udc80 z"}',  # lone surrogate escapes
    '{"x": 9223372036854775807, "y": 0.1, "z": -0.0, "w": 1e-400}',
    '{"x": 1, "x": 2}',
]


def test_lines_read_as_json_reads_them(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(JSON_ONLY) + "\n", encoding="utf-8")
    got = [line.value for line in read_lines(path)]
    # repr: NaN is not equal to itself, and 1 == 1.0 would hide an int read as a float
    assert repr(got) == repr([json.loads(line) for line in JSON_ONLY])


def test_an_integer_past_pythons_digit_limit_is_a_bad_line(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text('{"x": ' + "7" * 5000 + '}\n{"y": 1}\n', encoding="utf-8")
    first, second = read_lines(path)
    assert first.number == 1 and "not valid JSON (Exceeds the limit" in first.error
    assert second.value == {"y": 1}


def test_a_bom_or_record_separator_opening_a_later_line_is_skipped(tmp_path):
    # As jsonlines reads: files each saved with a BOM, then concatenated, read whole.
    path = tmp_path / "in.jsonl"
    path.write_bytes(b'{"a": 1}\n\xef\xbb\xbf{"b": 2}\n\x1e{"c": 3}\n')
    assert [line.value for line in read_lines(path)] == [{"a": 1}, {"b": 2}, {"c": 3}]


def test_a_compressed_file_cut_short_is_an_error_after_the_lines_it_holds(tmp_path):
    path = tmp_path / "in.jsonl.gz"
    rows = [{"id": i, "text": f"row {i} " + "x" * (i % 50)} for i in range(5000)]
    whole = gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode())
    path.write_bytes(whole[: len(whole) // 2])
    read = []
    with pytest.raises(InputError, match="cut off or damaged"):
        read.extend(line.value for line in read_lines(path))
    assert 0 < len(read) < len(rows) and read == rows[: len(read)]


def test_writer_writes_utf8_text_with_keys_in_order(tmp_path):
    path = tmp_path / "o.jsonl"
    rows = [{"z": "é ✓", "a": [1, 2.5, None, True], "m": {"b": "null", "a": -0.0}}, {"n": 1e16}]
    with JsonlWriter(path) as writer:
        for row in rows:
            writer.write(row)
    data = path.read_bytes()
    assert "é ✓".encode() in data  # not \u escapes
    assert [json.loads(line) for line in data.splitlines()] == rows
    assert [list(json.loads(line)) for line in data.splitlines()] == [list(r) for r in rows]


# Rows orjson refuses or would write otherwise: each line is json.dumps's.
JSON_ONLY_ROWS = [
    {"x": 2**64, "y": -(2**63) - 1},
    {1: "int key", None: "null key", 2.5: "float key", False: "bool key"},
    {"x": float("nan"), "y": [float("inf"), {"z": float("-inf")}]},
]


def test_writer_writes_what_orjson_refuses_as_json_does(tmp_path):
    path = tmp_path / "o.jsonl"
    with JsonlWriter(path) as writer:
        for row in JSON_ONLY_ROWS:
            writer.write(row)
    lines = path.read_text(encoding="utf-8").splitlines()
    assert lines == [json.dumps(row, ensure_ascii=False) for row in JSON_ONLY_ROWS]


def test_a_lone_surrogate_is_written_escaped_and_reads_back(tmp_path):
    path = tmp_path / "o.jsonl"
    rows = [{"a": "x"}, {"s": "bad \ud800", "é": "é"}, {"b": "y"}]
    with JsonlWriter(path) as writer:
        for row in rows:
            writer.write(row)
    data = path.read_bytes()
    assert b"\\ud800" in data.splitlines()[1]
    assert [line.value for line in read_lines(path)] == rows


def test_writer_to_a_handle_that_cannot_encode_a_character_escapes_it():
    raw = io.BytesIO()
    handle = io.TextIOWrapper(raw, encoding="ascii")
    writer = JsonlWriter("-", handle=handle)
    writer.write({"a": "é"})
    writer.close()
    assert raw.getvalue() == b'{"a": "\\u00e9"}\n'
