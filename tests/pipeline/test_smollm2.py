"""A generate step on real weights (SmolLM2-135M-Instruct, NATIVE): a Jinja template over the
row's columns, the reply guided to the JSON the step's `parse` names, parsed into columns; then
a judge on the same model, its reply guided to the judge's schema."""

from __future__ import annotations

import json

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


def test_generate_parses_the_reply_into_columns_and_a_judge_scores_them(tmp_path):
    write(tmp_path, PIPELINE, [{"country": "France"}, {"country": "Germany"}])
    result = run(tmp_path, "out", "--keep-steps")
    assert result.returncode == 0, result.stderr
    rows = read_jsonl(tmp_path / "out" / DATA)
    assert [r["country"] for r in rows] == ["France", "Germany"]
    for row in rows:
        assert set(row) == {"country", "question", "answer", "score", "explanation"}
        assert row["country"] in row["question"]
        # The judge step sets no guided decoding: it guides the reply to the judge's schema,
        # so a 135M model gives a score it can parse, not prose around one.
        assert isinstance(row["score"], int) and 1 <= row["score"] <= 10
    assert rows[0]["answer"] == "Paris"
    # The same command again answers from the journal: the same rows, no model call needed.
    again = run(tmp_path, "out")
    assert again.returncode == 0, again.stderr
    assert read_jsonl(tmp_path / "out" / DATA) == rows
    assert json.loads((tmp_path / "out" / "steps" / "ask.jsonl").read_text().splitlines()[0])
