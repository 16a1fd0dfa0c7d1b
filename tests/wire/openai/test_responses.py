"""Response bodies and stream chunks (`wire/openai/responses.py`) for a reasoning model, read
back through the openai package's own types as a client reads them."""

from __future__ import annotations

import json

from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from lmpress.vocabulary.types import Result, Sample, Usage
from lmpress.wire.openai import responses
from lmpress.wire.openai.prompt_logprobs import Echo
from lmpress.wire.openai.responses import ChatChunks


def chunk(line: bytes) -> ChatCompletionChunk:
    assert line.startswith(b"data: ") and line.endswith(b"\n\n")
    return ChatCompletionChunk.model_validate(json.loads(line[len(b"data: ") :]))


def test_thinking_chunks_carry_both_names_and_content_chunks_neither():
    chunks = ChatChunks("c", 1, "m", include_usage=True)
    thinking = [chunk(chunks.reasoning(0, piece)) for piece in ['a "quoted"', " ü\n"]]
    answer = chunk(chunks.text(0, "42"))
    for got, piece in zip(thinking, ['a "quoted"', " ü\n"], strict=True):
        delta = got.choices[0].delta
        assert (delta.reasoning_content, delta.reasoning, delta.content) == (piece, piece, None)
    assert answer.choices[0].delta.content == "42"
    assert answer.choices[0].delta.model_extra == {}
    usage = chunk(chunks.usage(Usage(3, 7, 5), reasoning=True)).usage
    assert (usage.completion_tokens, usage.completion_tokens_details.reasoning_tokens) == (7, 5)


def test_a_body_says_the_thinking_only_for_a_model_that_reasoned():
    thought = Result("r", [Sample("42", "stop", reasoning="")], Usage(3, 4))
    body = ChatCompletion.model_validate(responses.chat_completion("c", 1, "m", thought))
    # An empty thinking block (the model closed it at once) is still said, empty.
    assert body.choices[0].message.reasoning_content == ""
    assert body.usage.completion_tokens_details.reasoning_tokens == 0
    plain = responses.chat_completion("c", 1, "m", Result("r", [Sample("42", "stop")], Usage(3, 4)))
    assert "reasoning_content" not in plain["choices"][0]["message"]
    assert "completion_tokens_details" not in plain["usage"]


def test_a_text_completion_counts_the_thinking_of_every_prompt():
    results = [Result(f"r{i}", [Sample("x", "stop")], Usage(1, 4, 2)) for i in range(2)]
    body = Completion.model_validate(
        responses.text_completion("c", 1, "m", results, [Echo(), Echo()])
    )
    assert body.usage.completion_tokens_details.reasoning_tokens == 4
