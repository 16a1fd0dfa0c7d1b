"""Rows of every row shape become the right requests, and results render back faithfully."""

from __future__ import annotations

import pytest

from lmpress.data.row_shapes import RowError, parse_row, render_row, row_id
from lmpress.vocabulary.types import Result, Sample, TokenLogprob, Usage


def result(text="hi there", n=1):
    return Result(
        "x",
        [Sample(text if i == 0 else f"{text} {i}", "stop") for i in range(n)],
        Usage(5, 2),
        model="m",
        engine="NATIVE",
        latency_s=0.25,
    )


def test_chat_row():
    row = parse_row(
        {"id": "a", "messages": [{"role": "user", "content": "hi"}], "metadata": {"k": 1}}, 1
    )
    assert (row.id, row.shape) == ("a", "chat")
    assert [(m.role, m.content) for m in row.messages] == [("user", "hi")]
    out = render_row(row, result())
    assert out["id"] == "a" and out["metadata"] == {"k": 1}
    assert out["messages"][-1] == {"role": "assistant", "content": "hi there"}
    assert out["response"]["text"] == "hi there"
    assert out["response"]["usage"] == {
        "prompt_tokens": 5,
        "completion_tokens": 2,
        "total_tokens": 7,
    }
    assert out["response"]["finish_reason"] == "stop"
    assert out["response"]["engine"] == "NATIVE"


def test_oumi_conversation_with_content_items():
    raw = {
        "conversation_id": "c1",
        "messages": [{"role": "user", "content": [{"type": "text", "content": "hello"}]}],
        "metadata": {"src": "oumi"},
    }
    row = parse_row(raw, 3)
    assert (row.id, row.shape) == ("c1", "oumi")
    assert row.messages[0].text() == "hello"
    out = render_row(row, result())
    assert out["conversation_id"] == "c1"
    assert out["messages"][0] == raw["messages"][0]  # kept as it came
    assert out["metadata"] == {"src": "oumi"}


def test_prompt_row_becomes_a_messages_row():
    row = parse_row({"prompt": "2+2?", "system": "be terse", "id": 7}, 1)
    assert row.id == "7"
    assert [m.role for m in row.messages] == ["system", "user"]
    out = render_row(row, result("4"))
    assert "prompt" not in out and "system" not in out
    assert out["messages"] == [
        {"role": "system", "content": "be terse"},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
    ]


def test_image_parts_parse():
    row = parse_row(
        {"messages": [{"role": "user", "content": [
            {"type": "text", "text": "what is this?"},
            {"type": "image_url", "image_url": {"url": "https://example.invalid/cat.png"}},
        ]}]},
        1,
    )  # fmt: skip
    assert row.messages[0].has_images()
    assert row.messages[0].text() == "what is this?"


def test_row_generation_overrides_are_kept():
    row = parse_row({"prompt": "x", "generation": {"temperature": 0.5, "n": 2}}, 1)
    assert row.overrides == {"temperature": 0.5, "n": 2}


def test_n_samples_all_in_one_row():
    out = render_row(parse_row({"prompt": "x"}, 1), result("a", n=3))
    assert [s["text"] for s in out["response"]["samples"]] == ["a", "a 1", "a 2"]


def test_logprobs_render():
    res = result()
    res.samples[0].logprobs = [TokenLogprob("hi", -0.5, [("hi", -0.5), ("yo", -1.0)])]
    out = render_row(parse_row({"prompt": "x"}, 1), res)
    assert out["response"]["logprobs"][0]["top_logprobs"][1] == {"token": "yo", "logprob": -1.0}


def test_ids_without_an_id_are_stable_and_position_dependent():
    raw = {"prompt": "same"}
    assert row_id(raw, 1) == row_id(dict(raw), 1)
    assert row_id(raw, 1) != row_id(raw, 2)
    assert row_id({"custom_id": "c"}, 1) == "c"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ([1, 2], "expected a JSON object, got an array"),
        ("text", "expected a JSON object, got a string"),
        ({"foo": 1}, "row has no 'messages', 'prompt'"),
        ({"messages": []}, "'messages' is empty"),
        ({"messages": "hi"}, "'messages' must be a list"),
        ({"messages": [{"role": "bot", "content": "x"}]}, 'unknown role "bot"'),
        ({"messages": [{"content": "x"}]}, "unknown role null"),
        ({"messages": ["hi"]}, "message 1 must be an object"),
        ({"messages": [{"role": "user", "content": 5}]}, "content must be a string or a list"),
        ({"messages": [{"role": "user", "content": [{"type": "audio"}]}]}, 'unknown type "audio"'),
        ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "text part without text"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "image part without a URL",
        ),
        ({"prompt": 3}, "'prompt' must be a string"),
        ({"prompt": "x", "system": 1}, "'system' must be a string"),
        ({"prompt": "x", "generation": {"temprature": 1}}, "unknown key 'temprature'"),
        ({"prompt": "x", "generation": [1]}, "'generation' must be an object"),
        ({"prompt": "x", "generation": {"batch_size": 2}}, "applies to the whole job"),
    ],
)
def test_bad_rows_say_what_is_wrong(raw, expected):
    with pytest.raises(RowError, match=expected):
        parse_row(raw, 1)


PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 8


def test_oumi_conversation_with_every_content_type_round_trips():
    import base64

    png64 = base64.b64encode(PNG).decode()
    jpeg64 = base64.b64encode(b"\xff\xd8\xff\xe0rest").decode()
    raw = {
        "conversation_id": "c2",
        "messages": [
            {"role": "system", "content": "be brief"},
            {
                "role": "user",
                "content": [
                    {"type": "image_path", "content": "/data/cat.png"},
                    {"type": "image_url", "content": "https://example.com/dog.jpg"},
                    {"type": "image_binary", "binary": png64},
                    {"type": "image_path", "content": "/elsewhere/x.jpg", "binary": jpeg64},
                    {"type": "text", "content": "What are these?"},
                ],
            },
        ],
        "metadata": {"split": "test", "n": 3},
    }
    row = parse_row(raw, 1)
    assert (row.id, row.shape) == ("c2", "oumi")
    urls = [p.image_url for p in row.messages[1].content if p.type == "image_url"]
    assert urls == [
        "file:///data/cat.png",
        "https://example.com/dog.jpg",
        f"data:image/png;base64,{png64}",
        f"data:image/jpeg;base64,{jpeg64}",
    ]
    assert row.messages[1].text() == "What are these?"
    out = render_row(row, result("Animals."))
    # What Oumi's Conversation reads: its own keys, messages as they came plus the reply.
    assert out["conversation_id"] == "c2" and out["metadata"] == raw["metadata"]
    assert out["messages"] == [*raw["messages"], {"role": "assistant", "content": "Animals."}]


def test_an_image_binary_item_without_bytes_is_a_bad_row():
    raw = {"messages": [{"role": "user", "content": [{"type": "image_binary", "binary": "@@"}]}]}
    with pytest.raises(RowError, match="image_binary part without base64 'binary'"):
        parse_row(raw, 1)


# --- reasoning models -------------------------------------------------------------------------


def thought(n=1, reasoning_tokens=4):
    samples = [Sample(f"answer {i}", "stop", reasoning=f"thinking {i}") for i in range(n)]
    return Result("x", samples, Usage(5, 9, reasoning_tokens), model="m", engine="NATIVE")


def test_a_reasoning_models_row_has_its_thinking_apart_from_the_answer():
    row = parse_row({"id": "a", "messages": [{"role": "user", "content": "hi"}]}, 1)
    out = render_row(row, thought())
    assert out["messages"][-1] == {"role": "assistant", "content": "answer 0"}
    response = out["response"]
    assert (response["text"], response["reasoning"]) == ("answer 0", "thinking 0")
    assert response["usage"] == {
        "prompt_tokens": 5, "completion_tokens": 9, "total_tokens": 14, "reasoning_tokens": 4,
    }  # fmt: skip
    assert list(response)[:3] == ["text", "reasoning", "finish_reason"]


def test_a_model_that_does_not_reason_writes_its_rows_as_before():
    row = parse_row({"id": "a", "messages": [{"role": "user", "content": "hi"}]}, 1)
    response = render_row(row, result())["response"]
    assert "reasoning" not in response and "reasoning_tokens" not in response["usage"]
    assert list(response)[:3] == ["text", "finish_reason", "usage"]


def test_each_sample_keeps_its_own_thinking():
    row = parse_row({"prompt": "hi"}, 1)
    samples = render_row(row, thought(n=3))["response"]["samples"]
    assert [(s["text"], s["reasoning"]) for s in samples] == [
        (f"answer {i}", f"thinking {i}") for i in range(3)
    ]


def test_thinking_counted_but_not_shown_still_writes_reasoning_tokens():
    # A provider (OpenAI's o-series) counts thinking it does not return.
    counted = Result("x", [Sample("answer", "stop")], Usage(5, 9, 6), model="m", engine="E")
    response = render_row(parse_row({"prompt": "hi"}, 1), counted)["response"]
    assert response["usage"]["reasoning_tokens"] == 6 and "reasoning" not in response


def test_an_oumi_rows_reply_carries_the_thinking_in_oumis_reasoning_content():
    raw = {"conversation_id": "c", "messages": [{"role": "user", "content": "hi"}], "metadata": {}}
    row = parse_row(raw, 1)
    assert row.shape == "oumi"
    out = render_row(row, thought())
    # oumi.core.types.conversation.Message has `reasoning_content`, "only set on assistant
    # messages", apart from `content`.
    assert out["messages"][-1] == {
        "role": "assistant", "content": "answer 0", "reasoning_content": "thinking 0",
    }  # fmt: skip
    assert out["response"]["reasoning"] == "thinking 0"


@pytest.mark.parametrize("key", ["reasoning_content", "reasoning"])
def test_an_earlier_assistant_turns_thinking_is_read_under_either_name(key):
    messages = [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4", key: "add them"},
        {"role": "user", "content": "and 3+3?"},
    ]
    row = parse_row({"messages": messages}, 1)
    assert [m.reasoning for m in row.messages] == [None, "add them", None]
    # Sent on as the OpenAI-compatible servers write it.
    assert row.messages[1].to_openai()["reasoning_content"] == "add them"


@pytest.mark.parametrize(
    ("message", "error"),
    [
        ({"role": "user", "content": "hi", "reasoning_content": "x"}, "only an assistant"),
        ({"role": "assistant", "content": "a", "reasoning": 3}, "reasoning must be a string"),
        (
            {"role": "assistant", "content": "a", "reasoning": "x", "reasoning_content": "y"},
            "differ",
        ),
    ],
)
def test_a_bad_thinking_field_is_a_row_error_naming_the_message(message, error):
    messages = [{"role": "user", "content": "q"}, message, {"role": "user", "content": "q2"}]
    if message["role"] == "user":
        messages = [message]
    with pytest.raises(RowError, match=error):
        parse_row({"messages": messages}, 1)


SIGNED = {"type": "thinking", "thinking": "add them", "signature": "sig-1"}
REDACTED = {"type": "redacted_thinking", "data": "opaque"}


def test_anthropics_signed_thinking_blocks_are_kept_whole_for_the_provider():
    as_details = {"role": "assistant", "content": "4", "reasoning_details": [SIGNED, REDACTED]}
    as_parts = {"role": "assistant", "content": [SIGNED, REDACTED, {"type": "text", "text": "4"}]}
    for turn in (as_details, as_parts):
        messages = [{"role": "user", "content": "2+2?"}, turn, {"role": "user", "content": "why?"}]
        earlier = parse_row({"messages": messages}, 1).messages[1]
        assert earlier.reasoning_details == [SIGNED, REDACTED]
        assert earlier.reasoning == "add them"
        assert earlier.text() == "4"


def test_bad_reasoning_details_are_a_row_error():
    for turn, error in [
        ({"role": "assistant", "content": "4", "reasoning_details": "x"}, "list of objects"),
        ({"role": "user", "content": "4", "reasoning_details": []}, "only an assistant"),
    ]:
        with pytest.raises(RowError, match=error):
            parse_row({"messages": [{"role": "user", "content": "q"}, turn]}, 1, regenerate=False)


def test_prompt_cache_counts_are_written_only_where_the_provider_reported_some():
    row = parse_row({"id": "a", "messages": [{"role": "user", "content": "hi"}]}, 1)
    cached = Result("x", [Sample("ok", "stop")], Usage(2000, 3, cached_tokens=1500,
                                                      cache_creation_tokens=400))  # fmt: skip
    assert render_row(row, cached)["response"]["usage"] == {
        "prompt_tokens": 2000, "completion_tokens": 3, "total_tokens": 2003,
        "cached_tokens": 1500, "cache_creation_tokens": 400,
    }  # fmt: skip
    read_only = Result("x", [Sample("ok", "stop")], Usage(2000, 3, cached_tokens=1500))
    assert "cache_creation_tokens" not in render_row(row, read_only)["response"]["usage"]
    assert set(render_row(row, result())["response"]["usage"]) == {
        "prompt_tokens",
        "completion_tokens",
        "total_tokens",
    }
