"""The rows of a loglikelihood or perplexity run: what each row asks, the one line a bad row
gets, and the line a scored row is written as (data/likelihood_rows.py)."""

from __future__ import annotations

import pytest

from lmpress.data.columns import RowMapping
from lmpress.data.messages import RowError
from lmpress.data.row_shapes import OutputShape, parse_row, render_row
from lmpress.vocabulary.likelihood import (
    ChoicesRequest,
    ContinuationScore,
    LoglikelihoodResult,
    PerplexityRequest,
    PerplexityResult,
)
from lmpress.vocabulary.types import Usage


def test_rows_become_the_requests_they_ask():
    row = parse_row({"id": "q", "context": "Sky:", "choices": [" blue", " red"], "gold": 1}, 1,
                    task="loglikelihood")  # fmt: skip
    assert row.task == "loglikelihood" and row.likelihood is not None
    assert row.likelihood.request(row.id) == ChoicesRequest("q", "Sky:", [" blue", " red"])
    one = parse_row({"context": "", "continuation": "Hi"}, 2, task="loglikelihood")
    assert one.likelihood.request(one.id) == ChoicesRequest(one.id, "", ["Hi"])
    text = parse_row({"id": "t", "body": "words"}, 3, mapping=RowMapping(text_column="body"),
                     task="perplexity")  # fmt: skip
    assert text.likelihood.request("t") == PerplexityRequest("t", "words")


@pytest.mark.parametrize(
    ("raw", "task", "said"),
    [
        ({"context": "x"}, "loglikelihood", "give 'continuation' (one text) or 'choices'"),
        (
            {"context": "x", "continuation": "a", "choices": ["b"]},
            "loglikelihood",
            "one of the two",
        ),
        (
            {"context": 3, "continuation": "a"},
            "loglikelihood",
            "'context' must be text, got a number",
        ),
        (
            {"context": "x", "choices": []},
            "loglikelihood",
            "'choices' is empty; give at least one text",
        ),
        ({"context": "x", "choices": ["a", ""]}, "loglikelihood", "'choices[1]' is empty"),
        ({"context": "x", "choices": ["a"], "gold": True}, "loglikelihood", "0 to 0, got True"),
        ({"context": "x", "continuation": "a", "gold": 0}, "loglikelihood", "this row has none"),
        ({"messages": []}, "loglikelihood", "a chat row in a loglikelihood run; give 'context'"),
        ({"prompt": "x"}, "perplexity", "a prompt row in a perplexity run; give 'text'"),
        ({"text": ""}, "perplexity", "'text' is empty"),
        ({"context": "x", "choices": ["a"]}, "generate", "run it with --task loglikelihood"),
    ],
)
def test_a_bad_row_gets_one_line_naming_its_key(raw, task, said):
    with pytest.raises(RowError) as caught:
        parse_row(raw, 1, task=task)
    assert said in str(caught.value)


def scores(*values: tuple[float, bool, int]) -> LoglikelihoodResult:
    made = [ContinuationScore(lp, greedy, n) for lp, greedy, n in values]
    return LoglikelihoodResult("q", made, Usage(9), "tiny", "NATIVE", 0.5)


def test_a_scored_row_keeps_its_columns_and_gets_its_scores():
    row = parse_row({"id": "q", "context": "c", "choices": ["a", "b"], "gold": 0}, 1,
                    task="loglikelihood")  # fmt: skip
    line = render_row(row, scores((-3.0, False, 2), (-1.5, True, 1)))
    assert line["choice_logprobs"] == [-3.0, -1.5] and line["choice_is_greedy"] == [False, True]
    assert (line["choice_tokens"], line["best"], line["correct"]) == ([2, 1], 1, False)
    assert line["choices"] == ["a", "b"] and line["response"]["usage"]["prompt_tokens"] == 9
    one = parse_row({"context": "c", "continuation": "a"}, 2, task="loglikelihood")
    single = render_row(one, scores((-2.0, True, 3)))
    assert (single["id"], single["logprob"], single["is_greedy"]) == (one.id, -2.0, True)
    assert "best" not in single and "correct" not in single
    text = parse_row({"text": "abc"}, 3, task="perplexity")
    ppl = render_row(text, PerplexityResult("t", -6.0, 3, Usage(4), "tiny", "NATIVE"))
    assert ppl["perplexity"] == pytest.approx(7.389056) and ppl["tokens"] == 3


def test_the_openai_output_shape_carries_the_scores_in_its_body():
    row = parse_row({"id": "q", "context": "c", "continuation": "a"}, 1, task="loglikelihood")
    line = render_row(row, scores((-2.0, True, 3)), OutputShape.OPENAI)
    assert line["custom_id"] == "q"
    body = line["response"]["body"]
    assert (body["object"], body["logprob"], body["tokens"]) == ("loglikelihood", -2.0, 3)
