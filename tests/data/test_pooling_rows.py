"""The rows of embed, score and rerank runs: which shapes each task takes, read once, and what
a row of the wrong shape is told; an OpenAI Batch line asks its url's task (`batch.tasks`
decides whether the run answers it)."""

from __future__ import annotations

import re

import pytest

from lmpress.data.columns import RowMapping
from lmpress.data.messages import RowError
from lmpress.data.row_shapes import RowShape, parse_row
from lmpress.vocabulary.embeddings import EmbedRequest, ScoreRequest


def embed(raw, mapping=RowMapping()):
    return parse_row(raw, 1, mapping=mapping, task="embed")


def test_embed_rows_a_text_a_list_token_ids_a_column_and_a_template():
    one = embed({"id": "a", "input": "hi"})
    assert one.shape is RowShape.EMBED and one.pooling.single
    assert one.pooling.request("a") == EmbedRequest("a", ["hi"])
    several = embed({"input": ["a", "b"]})
    assert not several.pooling.single and several.pooling.inputs == ["a", "b"]
    ids = embed({"input": [1, 2, 3]})
    assert ids.pooling.single and ids.pooling.inputs == [[1, 2, 3]]
    column = embed({"doc": "from a column", "other": 1}, RowMapping(text_column="doc"))
    assert column.pooling.inputs == ["from a column"]
    template = embed({"title": "T", "body": "B"}, RowMapping(prompt_template="{title}: {body}"))
    assert template.pooling.inputs == ["T: B"]


@pytest.mark.parametrize(
    ("raw", "mapping", "message"),
    [
        ({"messages": [{"role": "user", "content": "x"}]}, RowMapping(),
         "a chat row in an embed run; give 'input' (or --text-column COL), or an OpenAI Batch "
         "line to /v1/embeddings"),
        ({"input": []}, RowMapping(), "'input' must not be empty"),
        ({"input": {"a": 1}}, RowMapping(), "Invalid type for 'input'"),
        ({"x": "y"}, RowMapping(text_column="doc"), "row has no 'doc' (the --text-column)"),
        ({"doc": 3}, RowMapping(text_column="doc"), "'doc' must be text, got a number"),
    ],
)  # fmt: skip
def test_a_row_an_embed_run_cannot_take_says_why_in_one_line(raw, mapping, message):
    with pytest.raises(RowError) as caught:
        embed(raw, mapping)
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)


def test_score_and_rerank_rows_in_vllm_s_shapes():
    rerank = parse_row({"query": "q", "documents": ["a", "b"], "top_n": 1}, 1, task="rerank")
    assert rerank.shape is RowShape.SCORE
    assert rerank.pooling.request("r") == ScoreRequest("r", "q", ["a", "b"], 1)
    pair = parse_row({"text_1": ["q"], "text_2": "a"}, 1, task="score")
    assert pair.pooling.request("p") == ScoreRequest("p", "q", ["a"])
    # vLLM's N:N form: text_1[i] with text_2[i]
    pairwise = parse_row({"text_1": ["a", "b"], "text_2": ["c", "d"]}, 1, task="score")
    assert pairwise.pooling.request("w") == ScoreRequest("w", ["a", "b"], ["c", "d"])
    assert pairwise.pooling.request("w").queries() == ["a", "b"]
    line = {
        "custom_id": "c",
        "url": "/v1/score",
        "body": {"text_1": ["a", "b"], "text_2": ["c", "d"]},
    }
    assert parse_row(line, 1, task="score").pooling.request("l").query == ["a", "b"]


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"text_1": ["a", "b", "c"], "text_2": ["d", "e"]},
         "'text_1' has 3 texts and 'text_2' 2: give one text_1 to score against every text_2, "
         "or as many as text_2 to score them pairwise (text_1[i] with text_2[i])"),
        ({"text_1": ["a", "b"], "text_2": "c"}, "'text_1' has 2 texts and 'text_2' 1: give"),
        ({"text_1": [], "text_2": "c"}, "'text_1' must not be empty"),
        ({"query": "q"}, "Missing required parameter: 'documents'"),
        ({"query": "q", "documents": ["a"], "top_n": -1}, "'top_n': -1 must not be negative"),
        ({"queries": ["a", "b"], "documents": "c"}, "'queries' has 2 texts and 'documents' 1"),
        ({"queries": "a", "text_2": "c"}, "'queries' and 'text_2' are two forms of one score"),
        ({"input": "x"}, "a row with keys input in a score run; give 'query' and 'documents'"),
    ],
)  # fmt: skip
def test_a_row_a_score_run_cannot_take_says_why(raw, message):
    with pytest.raises(RowError, match="^" + re.escape(message)):
        parse_row(raw, 1, task="score")


def test_a_rerank_run_refuses_pairwise_rows_in_one_line():
    with pytest.raises(RowError) as caught:
        parse_row({"text_1": ["a", "b"], "text_2": ["c", "d"]}, 1, task="rerank")
    assert str(caught.value) == (
        "the first texts are a list, scored pairwise with the second, which a rerank run "
        "cannot rank against one query; run it with --task score, or give one query"
    )


def test_a_generate_run_sends_embed_rows_to_their_task():
    with pytest.raises(RowError, match="run it with --task embed"):
        parse_row({"input": "x"}, 1)


@pytest.mark.parametrize(
    ("url", "body", "task", "asked"),
    [
        ("/v1/embeddings", {"input": "x"}, "embed", EmbedRequest("c", ["x"])),
        ("/v1/score", {"queries": "q", "documents": ["a"]}, "score", ScoreRequest("c", "q", ["a"])),
        ("/score", {"text_1": "q", "text_2": "a"}, "score", ScoreRequest("c", "q", ["a"])),
        ("/v1/rerank", {"query": "q", "documents": ["a"]}, "rerank", ScoreRequest("c", "q", ["a"])),
        ("/rerank", {"query": "q", "documents": ["a"], "top_n": 0}, "rerank",
         ScoreRequest("c", "q", ["a"])),
        ("/v2/rerank", {"query": "q", "documents": ["a", "b"], "top_n": 1}, "rerank",
         ScoreRequest("c", "q", ["a", "b"], 1)),
    ],
)  # fmt: skip
@pytest.mark.parametrize("run_task", ["generate", "embed", "rerank"])
def test_an_openai_batch_line_asks_its_url_s_task_whatever_the_run_s(
    url, body, task, asked, run_task
):
    row = parse_row({"custom_id": "c", "url": url, "body": body}, 1, task=run_task)
    assert row.task == task and row.pooling.request("c") == asked
