"""The three pipelines in examples/pipelines/ run on SmolLM2 by the very commands
docs/pipelines.md shows, and make the rows and columns they promise. A 135M model's text is not
checked, only the dataset's shape. tests/test_doc_examples.py leaves these commands to this
module, so each example runs once in the suite."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lmpress.builtin_models.tiny import cache_root
from tests.conftest import REPO

# The page's commands: `cd examples/pipelines && lmpress run X.yaml -i ... -o ~/pipelines/X`.
COMMAND = re.compile(r"^cd examples/pipelines && lmpress run (\w+)\.yaml .*$", re.MULTILINE)
COMMANDS = {
    m.group(1): m.group(0) for m in COMMAND.finditer((REPO / "docs/pipelines.md").read_text())
}


def test_the_page_shows_a_command_for_each_example():
    assert sorted(COMMANDS) == ["qa_pairs", "summaries", "two_models"]


def _run(tmp_path_factory, example: str) -> Path:
    return _command(tmp_path_factory.mktemp(example), example)


def _command(home: Path, example: str) -> Path:
    """The page's command, run as a reader would from a clone: `lmpress` on the PATH, HOME a
    scratch folder (the `~` of its output), the model caches where they are (SmolLM2's F16
    copy is written once, not per test)."""
    if not (home / "examples").exists():
        (home / "examples").symlink_to(REPO / "examples")
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    env = {**os.environ, "HOME": str(home), "PATH": path, "PYTHONPATH": str(REPO),
           "LMPRESS_CACHE": str(cache_root())}  # fmt: skip
    done = subprocess.run(
        ["bash", "-c", COMMANDS[example]], cwd=home, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return home / "pipelines" / example


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture(scope="module")
def qa_pairs(tmp_path_factory):
    return _run(tmp_path_factory, "qa_pairs")


@pytest.fixture(scope="module")
def summaries(tmp_path_factory):
    return _run(tmp_path_factory, "summaries")


@pytest.fixture(scope="module")
def two_models(tmp_path_factory):
    return _run(tmp_path_factory, "two_models")


def test_qa_pairs_keeps_the_well_scored_questions_and_rejects_the_rest(qa_pairs):
    rows, rejects = _rows(qa_pairs / "dataset.jsonl"), _rows(qa_pairs / "rejects.jsonl")
    # three topics, two questions each: every question is either kept or in the rejects
    assert len(rows) + len(rejects) == 6
    for row in rows:
        assert set(row) == {"topic", "question", "answer", "score", "explanation"}
        assert isinstance(row["question"], str) and row["answer"]
        assert row["score"] >= 5
    assert all(r["step"] == "good" for r in rejects if "dropped" in r)
    assert (qa_pairs / "README.md").exists()


def test_summaries_drops_the_near_duplicate_document_before_summarising(summaries):
    rows, rejects = _rows(summaries / "dataset.jsonl"), _rows(summaries / "rejects.jsonl")
    assert [r["title"] for r in rows] == ["Honeybees", "Tides", "Bread", "Lighthouses"]
    for row in rows:
        assert row["summary"] and row["summary_words"] == len(row["summary"].split())
        assert row["compression"] > 0
    assert [(r["key"], r["step"]) for r in rejects] == [("000000002", "unique")]
    assert "000000000" in rejects[0]["dropped"]


def test_two_models_grades_every_tip_on_its_scale(two_models):
    rows = _rows(two_models / "dataset.jsonl")
    assert [r["task"] for r in rows] == [
        "learning to touch-type", "keeping houseplants alive", "packing for a weekend hike",
    ]  # fmt: skip
    for row in rows:
        assert row["tip"] and row["explanation"]
        assert 1 <= row["score"] <= 5
    card = (two_models / "README.md").read_text()
    assert "smollm2:135m-instruct-q4_1" in card


def test_the_same_command_again_writes_the_same_dataset(summaries):
    """As the page says: run again, the journal answers and the outputs are the same."""
    before = [(summaries / name).read_text() for name in ("dataset.jsonl", "rejects.jsonl")]
    again = _command(summaries.parent.parent, "summaries")
    assert [(again / name).read_text() for name in ("dataset.jsonl", "rejects.jsonl")] == before
