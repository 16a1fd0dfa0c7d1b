"""The scoring vocabulary: lm-eval's rolling windows and context/continuation split."""

from __future__ import annotations

import math
import re

import pytest

from lmpress.vocabulary.likelihood import (
    ContinuationScore,
    LoglikelihoodResult,
    Perplexity,
    continuation_score,
    encode_pair,
    rolling_windows,
)
from lmpress.vocabulary.types import TokenLogprob


@pytest.mark.parametrize("length", [0, 1, 5, 8, 9, 16, 17, 40])
@pytest.mark.parametrize("max_length", [1, 4, 8])
def test_rolling_windows_predict_every_token_once_within_the_context(length, max_length):
    tokens = list(range(100, 100 + length))
    windows = list(rolling_windows(tokens, -1, max_length))
    predicted = [t for _, continuation in windows for t in continuation]
    assert predicted == tokens
    for context, continuation in windows:
        # the model reads the context and all but the last continuation token
        assert len(context) >= 1 and len(context) + len(continuation) - 1 <= max_length
        assert continuation
    if windows:
        assert windows[0][0] == [-1]
    for context, continuation in windows[1:]:
        # each later window's context is the tokens right before what it predicts
        start = tokens.index(continuation[0])
        assert context == tokens[start - len(context) : start]
        assert len(context) + len(continuation) == max_length + 1 or start == len(tokens) - len(
            continuation
        )


def test_encode_pair_moves_the_contexts_trailing_spaces_to_the_continuation():
    vocab: dict[str, int] = {}

    def encode(text: str) -> list[int]:  # a token a word, with the spaces before it
        return [vocab.setdefault(w, len(vocab)) for w in re.findall(r"\s*\S+|\s+$", text)]

    context, continuation = encode_pair(encode, "The sky is ", "blue", prefix_id=0)
    assert context == encode("The sky is")
    assert continuation == encode(" blue")
    assert encode_pair(encode, "", "blue", prefix_id=7) == ([7], encode("blue"))


def test_a_continuation_is_greedy_only_where_every_token_is_the_likeliest():
    top = TokenLogprob("a", -0.1, [("a", -0.1)], id=1, top_ids=[1])
    not_top = TokenLogprob("b", -2.0, [("a", -0.2)], id=2, top_ids=[1])
    assert continuation_score([top, top]).is_greedy
    score = continuation_score([top, not_top])
    assert not score.is_greedy
    assert score.tokens == 2 and score.logprob == pytest.approx(-2.1)
    with pytest.raises(ValueError):
        continuation_score([None])


def test_the_best_choice_and_perplexity():
    result = LoglikelihoodResult(
        "q",
        [ContinuationScore(-3.0, False, 2), ContinuationScore(-1.0, True, 1)],
    )
    assert result.best == 1
    assert LoglikelihoodResult("empty").best is None
    assert Perplexity(-2 * math.log(4), 2).perplexity == pytest.approx(4.0)
    assert Perplexity(0.0, 0).perplexity == math.inf
