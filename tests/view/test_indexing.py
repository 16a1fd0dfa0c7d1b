"""A file opened before its rows' facts are read (issue 56: a million rows open in under 2 s):
the viewer finds where the lines are at once and reads the facts behind the page
(lmpress/view/index.py). What a user sees meanwhile: every row counted and any page of rows
with its facts, how far the indexing got, filters on facts over the rows read so far (said so),
search over every row; once done, the same answers as a file indexed whole, and the index kept
and read back. The facts thread is held by a gate (conftest.FactsGate), so that what the test
sees is what it set up, not a race."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from lmpress.view import index as index_module
from lmpress.view.index import JsonlIndex
from lmpress.view.records import RowKind
from lmpress.view.sources import OpenSource
from tests.view.conftest import client, write_output

ROWS = 3000  # 2,925 in OUT.jsonl, 75 failed in OUT.errors.jsonl
FAILED = ROWS // 40
MAIN = ROWS - FAILED
FIRST_BLOCK = 500  # the facts_behind fixture's block
MODEL_B_FROM = 1000  # the second model answers from row 1000 on: not among the first rows


def whole(folder: Path) -> TestClient:
    """A viewer on a copy of the output, indexed whole before it answers (the reference)."""
    viewer = client(folder / "out.jsonl")
    viewer.app.state.viewer.sources["a"].wait()
    return viewer


def source_of(viewer) -> OpenSource:
    return viewer.app.state.viewer.sources["a"]


def main_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def opened(tmp_path, facts_behind):
    """(a viewer on an output whose facts are read as far as the first block, the same output
    indexed whole)."""
    out = write_output(tmp_path / "open", ROWS, other_model_from=MODEL_B_FROM)
    shutil.copytree(out.parent, tmp_path / "whole")
    gate = facts_behind(out)
    viewer = client(out)
    gate.hold()
    source_of(viewer).refresh(force=True)  # as the page's next look finds it
    return viewer, whole(tmp_path / "whole"), gate, out


def test_every_row_shows_at_once_and_the_page_says_how_far_indexing_got(opened):
    viewer, reference, _, out = opened
    indexing = {"indexed": FIRST_BLOCK + FAILED, "rows": ROWS}  # the errors file: read at once
    (listed,) = viewer.get("/api/sources").json()["sources"]
    assert listed["rows"] == ROWS and listed["indexing"] == indexing
    assert viewer.get("/api/live").json()["indexing"] == indexing
    # Any page: the first, and one past the rows indexed (its facts read from its lines).
    for offset in (0, 2000, MAIN - 20):
        params = {"offset": offset, "limit": 50}
        page = viewer.get("/api/rows", params=params).json()
        assert page["total"] == ROWS and page["partial"] is False
        assert page["rows"] == reference.get("/api/rows", params=params).json()["rows"]
    assert (
        viewer.get("/api/row", params={"n": 2000}).json()
        == reference.get("/api/row", params={"n": 2000}).json()
    )
    # Search reads the lines, not the facts: every row at once.
    found = viewer.get("/api/rows", params={"q": "zanzibar"}).json()
    assert found["partial"] is False
    assert found["total"] == reference.get("/api/rows", params={"q": "zanzibar"}).json()["total"]

    # Filters on facts: over the rows indexed so far, and said so.
    first = main_rows(out)[:FIRST_BLOCK]
    length = viewer.get("/api/rows", params={"finish_reason": "length", "limit": 1000}).json()
    assert length["partial"] is True
    assert [row["id"] for row in length["rows"]] == [
        row["id"] for row in first if row["response"]["finish_reason"] == "length"
    ]
    overview = viewer.get("/api/overview").json()
    assert overview["indexing"] == indexing
    assert overview["rows"]["total"] == ROWS
    assert overview["rows"]["ok"] == FIRST_BLOCK and overview["rows"]["failed"] == FAILED
    assert overview["tokens"]["completion"] == sum(
        row["response"]["usage"]["completion_tokens"] for row in first
    )
    assert [part["name"] for part in overview["by_part"]] == ["tiny:llama"]


def test_once_indexed_it_answers_as_a_file_indexed_whole(opened):
    viewer, reference, gate, out = opened
    gate.open()
    source_of(viewer).wait()
    assert viewer.get("/api/live").json()["indexing"] is None
    assert viewer.get("/api/overview").json() == reference.get("/api/overview").json()
    assert (
        viewer.get("/api/sources").json()["sources"][0]["parts"]
        == reference.get("/api/sources").json()["sources"][0]["parts"]
    )
    for params in (
        {"status": "failed"},
        {"finish_reason": "length"},
        {"model": "tiny:qwen"},
        {"status": "cached"},
        {"status": "failed", "error_kind": "invalid_row"},
    ):
        mine = viewer.get("/api/rows", params={**params, "limit": 1000}).json()
        assert mine["partial"] is False
        assert mine == reference.get("/api/rows", params={**params, "limit": 1000}).json()
    assert (out.parent / "out.jsonl.view-index").exists()


def test_the_saved_index_is_read_back_and_no_line_is_parsed(opened, monkeypatch):
    viewer, _, gate, out = opened
    gate.open()
    built = source_of(viewer).wait()

    def no_parse(*args):
        raise AssertionError("a line was parsed: the saved index was not used")

    monkeypatch.setattr(index_module, "read_facts", no_parse)
    again = OpenSource(str(out))
    assert again.snapshot.indexing is None and again.snapshot.rows == ROWS
    for name, column in built.table.columns.items():
        np.testing.assert_array_equal(again.snapshot.table.columns[name], column)
    assert again.snapshot.table.labels == built.table.labels


def test_rows_written_while_facts_are_read_are_indexed_too(tmp_path, facts_behind):
    out = write_output(tmp_path / "grow", ROWS)
    lines = out.read_bytes().splitlines(keepends=True)
    out.write_bytes(b"".join(lines[: MAIN - 100]))
    gate = facts_behind(out)
    source = OpenSource(str(out))
    gate.hold()
    with out.open("ab") as handle:  # a job adds rows, the last one half written
        handle.write(b"".join(lines[MAIN - 100 : -1]) + lines[-1][:-5])
    grown = source.refresh(force=True)
    assert grown.rows == ROWS - 1 and grown.indexing["indexed"] == FIRST_BLOCK + FAILED
    with out.open("ab") as handle:
        handle.write(lines[-1][-5:])
    gate.open()
    done = source.wait()
    assert done.rows == ROWS and done.indexing is None
    fresh = JsonlIndex(out, RowKind.BATCH, keep=False)
    fresh.refresh()
    fresh.wait()
    mine = done.indexes[0].table
    for name, column in fresh.table.columns.items():
        np.testing.assert_array_equal(mine.columns[name], column)


def test_a_file_replaced_while_its_facts_are_read_is_read_anew(tmp_path, facts_behind):
    out = write_output(tmp_path / "replaced", ROWS)
    other = write_output(tmp_path / "other", ROWS // 2, other_model_from=0)
    gate = facts_behind(out)
    source = OpenSource(str(out))
    gate.hold()
    os.replace(other, out)  # a run with --overwrite, its output renamed into place
    replaced = source.refresh(force=True)
    assert replaced.indexes[0].rows == (ROWS // 2) - (ROWS // 2) // 40
    gate.open()
    done = source.wait()
    fresh = JsonlIndex(out, RowKind.BATCH, keep=False)
    fresh.refresh()
    fresh.wait()
    for name, column in fresh.table.columns.items():
        np.testing.assert_array_equal(done.indexes[0].table.columns[name], column)
    assert done.indexes[0].table.labels == fresh.table.labels


def facts_of(out: Path) -> JsonlIndex:
    """The file's index, its facts read in this process, block by block."""
    index = JsonlIndex(out, RowKind.BATCH, keep=False)
    index.refresh()
    assert index.wait(60)
    return index


def assert_same_facts(mine: JsonlIndex, reference: JsonlIndex) -> None:
    assert mine.known == mine.rows == reference.rows
    for name, column in reference.table.columns.items():
        np.testing.assert_array_equal(mine.table.columns[name], column, err_msg=name)
    assert mine.table.labels == reference.table.labels


def test_many_rows_are_read_by_processes_of_their_own_with_the_same_facts(
    tmp_path, facts_behind, monkeypatch
):
    out = write_output(tmp_path / "processes", ROWS, other_model_from=MODEL_B_FROM)
    reference = facts_of(out)
    monkeypatch.setattr(index_module, "PROCESS_ROWS", 0)
    started = []
    real = index_module.Reader

    def counted():
        started.append(real())
        return started[-1]

    monkeypatch.setattr(index_module, "Reader", counted)
    assert_same_facts(facts_of(out), reference)
    assert started and all(reader.process.returncode == 0 for reader in started)  # ended


def test_readers_that_die_leave_the_rest_to_the_thread(tmp_path, facts_behind, monkeypatch):
    out = write_output(tmp_path / "dying", ROWS, other_model_from=MODEL_B_FROM)
    reference = facts_of(out)

    class Dying:
        """A reader whose process died before its answer."""

        def send(self, *args) -> None:
            pass

        def receive(self):
            raise EOFError

        def close(self) -> None:
            pass

    monkeypatch.setattr(index_module, "PROCESS_ROWS", 0)
    monkeypatch.setattr(index_module, "Reader", Dying)
    assert_same_facts(facts_of(out), reference)
