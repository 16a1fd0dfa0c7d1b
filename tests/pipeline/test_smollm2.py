"""A generate step on real weights (SmolLM2-135M-Instruct, NATIVE): a Jinja template over the
row's columns, the reply guided to the JSON the step's `parse` names, parsed into columns; then
a judge on the same model, its reply guided to the judge's schema. The Python front builds the
same steps and must make the same dataset."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lmpress import Pipeline, generate, judge
from tests.pipeline.helpers import DATA, read_jsonl, run, write

PIPELINE = """models:
  smol: {engine: NATIVE, model: "smollm2:135m-instruct"}
steps:
  - name: ask
    kind: generate
    model: smol
    prompt: "What is the capital of {{ country }}? Reply in JSON with the question and its answer."
    generation: {max_new_tokens: 64, temperature: 0}
    parse: {question: str, answer: str}
  - name: judge
    kind: judge
    model: smol
    judge: single
    rubric: Score how well the answer answers the question.
    columns: {question: question, answer: answer}
    generation: {max_new_tokens: 96, temperature: 0}
"""

COUNTRIES = [{"country": "France"}, {"country": "Germany"}]


@pytest.fixture(scope="module")
def from_file(tmp_path_factory) -> tuple[Path, list[dict]]:
    """The pipeline file run once for the module (each run costs seconds of CPU): its folder,
    and the rows of its dataset as the first run wrote them."""
    tmp = tmp_path_factory.mktemp("smollm2")
    write(tmp, PIPELINE, COUNTRIES)
    result = run(tmp, "out", "--keep-steps")
    assert result.returncode == 0, result.stderr
    return tmp, read_jsonl(tmp / "out" / DATA)


def test_generate_parses_the_reply_into_columns_and_a_judge_scores_them(from_file):
    tmp, rows = from_file
    assert [r["country"] for r in rows] == ["France", "Germany"]
    for row in rows:
        assert set(row) == {"country", "question", "answer", "score", "explanation"}
        assert row["country"] in row["question"]
        # The judge step sets no guided decoding: it guides the reply to the judge's schema,
        # so a 135M model gives a score it can parse, not prose around one.
        assert isinstance(row["score"], int) and 1 <= row["score"] <= 10
    assert rows[0]["answer"] == "Paris"
    # The same command again answers from the journal: the same rows, no model call needed.
    again = run(tmp, "out")
    assert again.returncode == 0, again.stderr
    assert read_jsonl(tmp / "out" / DATA) == rows
    assert json.loads((tmp / "out" / "steps" / "ask.jsonl").read_text().splitlines()[0])


def test_the_python_front_makes_the_same_dataset_as_the_pipeline_file(from_file, tmp_path):
    """A prompt function and parsed fields (the reply guided to their JSON), then the judge,
    built in Python."""

    def prompt(row: dict) -> str:
        return f"What is the capital of {row['country']}? Reply in JSON with the question and its answer."

    pipeline = Pipeline(
        models={"smol": {"engine": "NATIVE", "model": "smollm2:135m-instruct"}},
        steps=[
            generate(
                "ask",
                model="smol",
                prompt=prompt,
                generation={"max_new_tokens": 64, "temperature": 0},
                parse={"question": "str", "answer": "str"},
            ),
            judge(
                "judge",
                model="smol",
                judge="single",
                rubric="Score how well the answer answers the question.",
                columns={"question": "question", "answer": "answer"},
                generation={"max_new_tokens": 96, "temperature": 0},
            ),
        ],
    )
    pipeline.run(input=COUNTRIES, output=tmp_path / "py", cache="off")  # run, not recalled
    rows = list(pipeline.rows(tmp_path / "py"))
    assert rows == from_file[1]
    assert rows[0]["answer"] == "Paris"
