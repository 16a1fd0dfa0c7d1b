"""The row index (lmpress/view/index.py) on a real batch output: kept beside it and read back
without parsing a line, extended by the lines a running job adds (whole lines only), built
again when the output was replaced, and never a write into the output."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from lmpress.view import lines as lines_module
from lmpress.view.index import JsonlIndex
from lmpress.view.records import RowKind
from lmpress.view.sources import OpenSource
from tests.view.conftest import input_rows, run_batch


@pytest.fixture(scope="module")
def output(tmp_path_factory):
    folder = tmp_path_factory.mktemp("index")
    return run_batch(folder, input_rows(16), "out.jsonl")


@pytest.fixture
def lines(output) -> list[bytes]:
    return output.read_bytes().splitlines(keepends=True)


def counted_parses(monkeypatch) -> list[int]:
    """Patches the index's parse of a row to count the rows parsed."""
    calls = [0]
    real = lines_module.facts

    def counting(*args, **kwargs):
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(lines_module, "facts", counting)
    return calls


def test_the_index_is_kept_beside_the_output_and_read_back(tmp_path, lines, monkeypatch):
    out = tmp_path / "out.jsonl"
    out.write_bytes(b"".join(lines))
    digest = hashlib.sha256(out.read_bytes()).hexdigest()
    first = JsonlIndex(out, RowKind.BATCH)
    first.refresh()
    assert first.rows == len(lines)
    assert (tmp_path / "out.jsonl.view-index").exists()
    assert [first.lines([n])[0] + b"\n" for n in range(first.rows)] == lines
    parses = counted_parses(monkeypatch)
    again = JsonlIndex(out, RowKind.BATCH)
    again.refresh()
    assert parses[0] == 0  # read back, no line parsed
    assert again.rows == first.rows
    for name, column in first.table.columns.items():
        np.testing.assert_array_equal(again.table.columns[name], column)
    assert again.table.labels == first.table.labels
    assert hashlib.sha256(out.read_bytes()).hexdigest() == digest


def test_a_growing_output_is_indexed_from_where_it_ended(tmp_path, lines, monkeypatch):
    out = tmp_path / "out.jsonl"
    half = len(lines) // 2
    out.write_bytes(b"".join(lines[:half]))
    source = OpenSource(str(out))
    assert source.snapshot.rows == half
    before = source.snapshot.indexes[0].start.copy()
    parses = counted_parses(monkeypatch)
    # A job appends whole lines, the last one still being written.
    torn = lines[half + 2][:-10]
    with out.open("ab") as handle:
        handle.write(b"".join(lines[half : half + 2]) + torn)
    grown = source.refresh(force=True)
    assert grown.rows == half + 2 and parses[0] == 2
    assert (grown.indexes[0].start[:half] == before).all()
    with out.open("ab") as handle:
        handle.write(lines[half + 2][-10:] + b"".join(lines[half + 3 :]))
    done = source.refresh(force=True)
    assert done.rows == len(lines) and parses[0] == len(lines) - half
    read = source.read(done, list(range(done.rows)))
    assert [row.raw.encode() + b"\n" for row in read] == lines


def test_a_last_line_without_its_newline_is_a_row_once_no_job_writes(tmp_path, lines):
    out = tmp_path / "out.jsonl"
    out.write_bytes(b"".join(lines)[:-1])  # as a hand-edited file may end
    source = OpenSource(str(out))
    assert source.snapshot.rows == len(lines)
    assert source.read(source.snapshot, [len(lines) - 1])[0].raw.encode() + b"\n" == lines[-1]


def test_a_search_finds_capital_letters_beyond_ascii_as_written(tmp_path, lines):
    from lmpress.view.query import search

    out = tmp_path / "out.jsonl"
    extra = b'{"id": "e", "response": {"text": "\xc3\x89cole du soir"}}\n'
    out.write_bytes(b"".join(lines) + extra)
    source = OpenSource(str(out))
    snapshot = source.snapshot
    assert search(source, snapshot, "École").tolist() == [len(lines)]
    assert search(source, snapshot, "école").tolist() == []  # É is not an ASCII letter


@pytest.mark.parametrize("few", [1, 10**9], ids=["hit-by-hit", "line-by-line"])
def test_a_search_finds_each_row_holding_the_word_once_across_windows_and_growth(
    tmp_path, lines, monkeypatch, few
):
    """Rows found as a reader finds them (the lowered line holds the word), whether a row is
    cut by no window, a window is one row longer than the window, lines are blank, a row
    holds the word many times, or the file grew since the last search."""
    from lmpress.view import query

    monkeypatch.setattr(query, "WINDOW", 700)  # a few rows a window; some rows longer
    monkeypatch.setattr(query, "FEW", few)  # each way of searching a window, every window
    long_row = b'{"id": "long", "response": {"text": "' + b"Rain " * 400 + b'"}}\n'
    written = [*lines[:5], b"\n", long_row, *lines[5:9], b"\n", b"\n", *lines[9:]]
    out = tmp_path / "out.jsonl"
    out.write_bytes(b"".join(written))
    source = OpenSource(str(out))

    def expected(word: str) -> list[int]:
        rows = [line for line in b"".join(written).split(b"\n") if line.strip()]
        needles = query.needles(word)
        return [n for n, line in enumerate(rows) if any(w in line.lower() for w in needles)]

    for word in ("rain", "RAIN", "id", "nothing holds this"):
        assert query.search(source, source.snapshot, word).tolist() == expected(word), word
    assert expected("rain") and len(expected("id")) == source.snapshot.rows
    grown = b'{"id": "late", "response": {"text": "rain at last"}}\n'
    with open(out, "ab") as handle:
        handle.write(grown)
    written.append(grown)
    source.refresh(force=True)
    assert query.search(source, source.snapshot, "rain").tolist() == expected("rain")


def test_a_replaced_output_is_indexed_again(tmp_path, lines):
    out = tmp_path / "out.jsonl"
    out.write_bytes(b"".join(lines))
    source = OpenSource(str(out))
    assert source.snapshot.rows == len(lines)
    # Shorter (a run with --overwrite started again): indexed from the start.
    out.write_bytes(b"".join(lines[-3:]))
    shorter = source.refresh(force=True)
    assert [row.raw.encode() + b"\n" for row in source.read(shorter, [0, 1, 2])] == lines[-3:]
    # The same size with other first bytes (in place, so the inode stays): indexed again too.
    swapped = b"".join([lines[-2], lines[-3], lines[-1]])
    with out.open("r+b") as handle:
        handle.write(swapped)
    again = source.refresh(force=True)
    assert [row.raw.encode() + b"\n" for row in source.read(again, [0, 1, 2])] == [
        lines[-2], lines[-3], lines[-1],
    ]  # fmt: skip
    # A stale index on disk from the first content is not trusted either.
    assert OpenSource(str(out)).snapshot.rows == 3


def test_blank_lines_are_no_rows_and_a_line_that_is_no_json_fails(tmp_path, lines):
    out = tmp_path / "out.jsonl"
    out.write_bytes(lines[0] + b"\n   \n" + b"{not json\n" + lines[1])
    source = OpenSource(str(out))
    rows = source.read(source.snapshot, [0, 1, 2])
    assert [r.raw for r in rows][::2] == [lines[0][:-1].decode(), lines[1][:-1].decode()]
    assert rows[1].raw == "{not json" and rows[1].value is None
    assert source.snapshot.table.columns["status"].tolist() == [0, 1, 0]
