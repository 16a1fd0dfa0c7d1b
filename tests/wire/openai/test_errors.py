"""The vocabularies the wire maps are mapped whole: every error kind has its HTTP status (a new
kind cannot reach a client as an unplanned 500), every finish reason its OpenAI value."""

from __future__ import annotations

import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion

from lmpress.data.openai_batch import render_error
from lmpress.vocabulary.errors import ErrorKind, RequestError
from lmpress.vocabulary.types import FINISH_REASONS, ErrorInfo, Result, Sample
from lmpress.wire.openai.errors import HTTP_STATUS, error_from_info
from lmpress.wire.openai.prompt_logprobs import Echo
from lmpress.wire.openai.responses import (
    COMPLETION_FINISH,
    OPENAI_FINISH,
    chat_completion,
    text_completion,
)


def test_every_error_kind_has_a_status():
    assert set(HTTP_STATUS) == set(ErrorKind)
    assert all(400 <= status < 600 for status in HTTP_STATUS.values())


@pytest.mark.parametrize("kind", list(ErrorKind))
def test_serve_and_batch_give_a_kind_the_same_status(kind):
    error = error_from_info(ErrorInfo(kind, "why"), "req-1")
    line = render_error("row-1", kind, "why", None)
    assert error.status == line["response"]["status_code"] == HTTP_STATUS[kind]
    assert error.body()["error"]["code"] == line["error"]["code"] == kind.value
    assert error.body()["error"]["type"] == (
        "invalid_request_error" if error.status < 500 else "server_error"
    )


def test_a_remote_apis_own_status_wins():
    assert error_from_info(ErrorInfo("rate_limited", "slow down", 429), "req-1").status == 429
    assert error_from_info(ErrorInfo("server_error", "bad gateway", 502), "req-1").status == 502


def test_an_engines_unforeseen_failure_reaches_the_log_not_the_client(caplog):
    torch_words = "RuntimeError: Expected tensor for argument #1 'indices' to have one of ..."
    error = error_from_info(ErrorInfo(ErrorKind.GENERATION_ERROR, torch_words), "req-7")
    assert error.status == 500
    assert error.message == (
        "the engine failed on this request; the server's log has the details (req-7)"
    )
    assert f"req-7: the engine failed: {torch_words}" in caplog.text
    # A remote API's own words are the client's to read.
    upstream = error_from_info(ErrorInfo("server_error", "bad gateway", 502), "req-8")
    assert upstream.message == "bad gateway"


def test_an_unknown_kind_fails_where_it_is_made():
    with pytest.raises(ValueError, match="made_up"):
        ErrorInfo("made_up", "x")
    with pytest.raises(ValueError, match="made_up"):
        RequestError("x", "made_up")


@pytest.mark.parametrize("reason", FINISH_REASONS)
def test_every_finish_reason_is_an_openai_one_in_both_bodies(reason):
    assert reason in OPENAI_FINISH and reason in COMPLETION_FINISH
    result = Result("r", [Sample("hi", reason)])
    chat = ChatCompletion.model_validate(chat_completion("c", 0, "m", result))
    text = Completion.model_validate(text_completion("t", 0, "m", [result], [Echo()]))
    assert chat.choices[0].finish_reason == OPENAI_FINISH[reason]
    assert text.choices[0].finish_reason == COMPLETION_FINISH[reason]
    if reason in ("stop", "length", "content_filter", "tool_calls"):
        assert OPENAI_FINISH[reason] == reason  # OpenAI's own pass unchanged in a chat body
    # A text completion has no tool calls to carry: one that made them stopped for them.
    expected = "stop" if reason in ("tool_calls", "cancelled", "error") else reason
    assert COMPLETION_FINISH[reason] == expected
