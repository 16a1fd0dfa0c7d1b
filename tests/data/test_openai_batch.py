"""The OpenAI Batch file format: request lines in, output lines that the openai package's own
types accept."""

from __future__ import annotations

import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion

from lmpress.data.row_shapes import RowError, parse_row, render_failure, render_row
from lmpress.vocabulary.types import Result, Sample, TokenLogprob, Usage

# The request lines from vLLM's run-batch documentation (examples/offline_inference/openai).
VLLM_EXAMPLE = [
    {"custom_id": "request-1", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "meta-llama/Meta-Llama-3-8B-Instruct", "messages": [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "Hello world!"}], "max_completion_tokens": 1000}},
    {"custom_id": "request-2", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "meta-llama/Meta-Llama-3-8B-Instruct", "messages": [{"role": "system", "content": "You are an unhelpful assistant."}, {"role": "user", "content": "Hello world!"}], "max_completion_tokens": 1000}},
]  # fmt: skip


def result(n=1, logprobs=False):
    samples = [Sample(f"reply {i}", "stop") for i in range(n)]
    if logprobs:
        samples[0].logprobs = [TokenLogprob("re", -0.1, [("re", -0.1), ("x", -2.0)])]
    return Result("x", samples, Usage(7, 3), model="m", engine="NATIVE")


def test_vllm_example_lines_parse_with_their_body_parameters():
    row = parse_row(VLLM_EXAMPLE[0], 1)
    assert (row.id, row.shape, row.model) == (
        "request-1",
        "openai_batch",
        "meta-llama/Meta-Llama-3-8B-Instruct",
    )
    assert [m.role for m in row.messages] == ["system", "user"]
    assert row.overrides == {"max_new_tokens": 1000}


def test_chat_output_is_an_openai_chat_completion():
    row = parse_row(VLLM_EXAMPLE[1], 2)
    line = render_row(row, result(n=2, logprobs=True))
    assert line["custom_id"] == "request-2" and line["error"] is None
    assert line["id"].startswith("batch_req_")
    assert line["response"]["status_code"] == 200 and line["response"]["request_id"]
    body = ChatCompletion.model_validate(line["response"]["body"])
    assert [c.message.content for c in body.choices] == ["reply 0", "reply 1"]
    assert body.usage.total_tokens == 10
    assert body.model == "m"  # the model that generated, not the name the request gave
    assert body.choices[0].logprobs.content[0].top_logprobs[1].token == "x"


def test_completions_endpoint():
    raw = {"custom_id": "c", "method": "POST", "url": "/v1/completions",
           "body": {"model": "m", "prompt": "Once upon", "max_tokens": 5, "stop": "\n", "logprobs": 2}}  # fmt: skip
    row = parse_row(raw, 1)
    assert row.prompt == "Once upon"
    assert row.overrides == {
        "max_new_tokens": 5,
        "stop_strings": ["\n"],
        "logprobs": True,
        "top_logprobs": 2,
    }
    body = Completion.model_validate(render_row(row, result(logprobs=True))["response"]["body"])
    assert body.choices[0].text == "reply 0"
    assert body.choices[0].logprobs.token_logprobs == [-0.1]


def test_other_formats_can_be_written_as_openai_batch_and_back():
    chat = parse_row({"id": "q", "messages": [{"role": "user", "content": "hi"}]}, 1)
    line = render_row(chat, result(), "openai")
    assert line["custom_id"] == "q"
    ChatCompletion.model_validate(line["response"]["body"])
    batch = parse_row(VLLM_EXAMPLE[0], 1)
    plain = render_row(batch, result(), "lmpress")
    assert plain["custom_id"] == "request-1"
    assert plain["messages"][-1] == {"role": "assistant", "content": "reply 0"}


def test_failure_line_follows_the_openai_error_file():
    line = render_failure(
        "request-9", 9, "invalid_row", "body has no 'messages'", None, openai=True
    )
    assert line["custom_id"] == "request-9" and line["line"] == 9
    assert line["error"] == {"code": "invalid_row", "message": "body has no 'messages'"}
    assert line["response"]["status_code"] == 400


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (
            {"custom_id": "a", "method": "GET", "url": "/v1/chat/completions", "body": {}},
            'method "GET" is not supported',
        ),
        (
            {"custom_id": "a", "method": "POST", "url": "/v1/moderations", "body": {"input": "x"}},
            'url "/v1/moderations" is not supported',
        ),
        (
            {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": "x"},
            "'body' must be an object",
        ),
        (
            {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {}},
            "body has no 'messages'",
        ),
        (
            {"custom_id": "", "method": "POST", "url": "/v1/chat/completions", "body": {}},
            "'custom_id' must be a non-empty string",
        ),
        (
            {
                "custom_id": "a",
                "url": "/v1/chat/completions",
                "body": {"messages": [{"role": "user", "content": "x"}], "tools": [{}]},
            },
            "'body.tools\\[0\\].function' must be an object with a 'name'",
        ),
        (
            {
                "custom_id": "a",
                "url": "/v1/chat/completions",
                "body": {"messages": [{"role": "user", "content": "x"}], "stream": True},
            },
            "body.stream",
        ),
        (
            {"custom_id": "a", "url": "/v1/completions", "body": {"prompt": ["a", "b"]}},
            "one prompt per line",
        ),
    ],
)
def test_bad_request_lines(raw, expected):
    with pytest.raises(RowError, match=expected):
        parse_row(raw, 1)


def test_lines_take_what_serve_takes():
    """logit_bias and response_format, once refused in a batch file, mean what serve reads."""
    from lmpress.vocabulary.guided import GuidedDecoding

    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    body = {"messages": [{"role": "user", "content": "x"}], "logit_bias": {"5": -100},
            "response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": schema}}}  # fmt: skip
    row = parse_row({"custom_id": "a", "url": "/v1/chat/completions", "body": body}, 1)
    assert row.overrides == {
        "logit_bias": {"5": -100.0},
        "guided_decoding": GuidedDecoding(json=schema),
    }


def test_completion_logprobs_carry_text_offsets():
    raw = {"custom_id": "c", "url": "/v1/completions", "body": {"prompt": "x", "logprobs": 1}}
    samples = [Sample("ab", "stop", [TokenLogprob("a", -0.1), TokenLogprob("b", -0.2)])]
    line = render_row(parse_row(raw, 1), Result("c", samples, Usage(1, 2)))
    body = Completion.model_validate(line["response"]["body"])
    assert body.choices[0].logprobs.text_offset == [0, 1]


# --- reasoning models -------------------------------------------------------------------------


def test_a_reasoning_models_output_line_has_the_thinking_where_vllm_writes_it():
    row = parse_row(VLLM_EXAMPLE[0], 1)
    samples = [Sample(f"answer {i}", "stop", reasoning=f"thinking {i}") for i in range(2)]
    line = render_row(row, Result("x", samples, Usage(7, 12, 5), model="m", engine="NATIVE"))
    body = ChatCompletion.model_validate(line["response"]["body"])
    # The SDK keeps the fields its types lack: a client reads message.reasoning_content.
    assert [c.message.content for c in body.choices] == ["answer 0", "answer 1"]
    assert [c.message.reasoning_content for c in body.choices] == ["thinking 0", "thinking 1"]
    assert [c.message.reasoning for c in body.choices] == ["thinking 0", "thinking 1"]
    assert body.usage.completion_tokens_details.reasoning_tokens == 5
    assert body.usage.completion_tokens == 12


def test_a_model_that_does_not_reason_has_no_thinking_fields():
    line = render_row(parse_row(VLLM_EXAMPLE[0], 1), result())
    body = line["response"]["body"]
    assert "reasoning_content" not in body["choices"][0]["message"]
    assert "completion_tokens_details" not in body["usage"]


def test_a_lines_reasoning_settings_override_the_recipe():
    body = {"messages": [{"role": "user", "content": "hi"}], "reasoning_effort": "low",
            "max_reasoning_tokens": 64}  # fmt: skip
    row = parse_row({"custom_id": "r", "url": "/v1/chat/completions", "body": body}, 1)
    assert row.overrides == {"reasoning_effort": "low", "max_reasoning_tokens": 64}
    body = {"messages": [{"role": "user", "content": "hi"}], "thinking_token_budget": 32}
    row = parse_row({"custom_id": "r", "url": "/v1/chat/completions", "body": body}, 1)
    assert row.overrides == {"max_reasoning_tokens": 32}  # vLLM's name for the same budget


@pytest.mark.parametrize(
    ("extra", "error"),
    [
        ({"reasoning_effort": "extreme"}, r"'body.reasoning_effort': 'extreme' must be one of"),
        ({"max_reasoning_tokens": -1}, r"'body.max_reasoning_tokens': -1 must be 0 or more"),
        (
            {"max_reasoning_tokens": 8, "thinking_token_budget": 9},
            "'body.thinking_token_budget' differs",
        ),
    ],
)
def test_a_bad_reasoning_setting_is_one_line_naming_it(extra, error):
    body = {"messages": [{"role": "user", "content": "hi"}], **extra}
    with pytest.raises(RowError, match=error):
        parse_row({"custom_id": "r", "url": "/v1/chat/completions", "body": body}, 1)


def test_vllms_enable_thinking_switch_is_reasoning_effort_none():
    def overrides(**extra):
        body = {"messages": [{"role": "user", "content": "hi"}], **extra}
        return parse_row(
            {"custom_id": "r", "url": "/v1/chat/completions", "body": body}, 1
        ).overrides

    assert overrides(chat_template_kwargs={"enable_thinking": False}) == {
        "reasoning_effort": "none"
    }
    assert overrides(chat_template_kwargs={"enable_thinking": True}) == {}
    for extra, error in [
        ({"chat_template_kwargs": {"foo": 1}}, "'body.chat_template_kwargs.foo' is not taken per"),
        ({"chat_template_kwargs": {"enable_thinking": "no"}}, "must be true or false"),
        (
            {"chat_template_kwargs": {"enable_thinking": False}, "reasoning_effort": "high"},
            "contradicts 'reasoning_effort'",
        ),
    ]:
        with pytest.raises(RowError, match=error):
            overrides(**extra)


def test_cached_prompt_tokens_are_in_the_output_lines_usage_as_openai_writes_them():
    row = parse_row(VLLM_EXAMPLE[1], 2)
    cached = Result("x", [Sample("ok", "stop")], Usage(2000, 3, cached_tokens=1536), model="m")
    usage = render_row(row, cached)["response"]["body"]["usage"]
    assert usage["prompt_tokens_details"] == {"cached_tokens": 1536}
    assert ChatCompletion.model_validate(render_row(row, cached)["response"]["body"])
    plain = Result("x", [Sample("ok", "stop")], Usage(2000, 3), model="m")
    assert render_row(row, plain)["response"]["body"]["usage"].get("prompt_tokens_details") is None
