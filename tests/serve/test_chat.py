"""/v1/models and /v1/chat/completions through the official openai client, against the tiny
Llama on the NATIVE engine (random weights: replies are random text, but greedy replies repeat)."""

from __future__ import annotations

import asyncio

import openai
import pytest

MODEL = "tiny-llama"
HELLO = [{"role": "user", "content": "Why is the sky blue?"}]


def test_models_lists_the_served_model(llama_server):
    client = llama_server.client()
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert models.data[0].object == "model"
    assert client.models.retrieve(MODEL).id == MODEL


def test_chat_replies_in_openai_shape(llama_server):
    reply = llama_server.client().chat.completions.create(model=MODEL, messages=HELLO)
    assert reply.id.startswith("chatcmpl-")
    assert reply.object == "chat.completion"
    assert reply.model == MODEL
    [choice] = reply.choices
    assert choice.index == 0
    assert choice.message.role == "assistant"
    assert isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length")
    usage = reply.usage
    assert usage.prompt_tokens > 0
    assert 0 < usage.completion_tokens <= 16  # the server's generation.max_new_tokens
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    line = llama_server.request_line(reply.id)
    assert " POST /v1/chat/completions 200 " in line
    assert f"tokens={usage.prompt_tokens}+{usage.completion_tokens}" in line


def test_streamed_chat_is_the_same_reply_with_usage_at_the_end(llama_server):
    client = llama_server.client()
    whole = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=12)
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=HELLO,
            max_tokens=12,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert {c.object for c in chunks} == {"chat.completion.chunk"}
    assert len({c.id for c in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == whole.choices[0].finish_reason
    assert all(f is None for f in finishes[:-1])
    # usage: null on every chunk but the last, which has no choices and the whole usage
    *body, last = chunks
    assert all(c.usage is None for c in body)
    assert last.choices == []
    assert last.usage.model_dump() == whole.usage.model_dump()


def test_stream_without_include_usage_has_no_usage(llama_server):
    chunks = list(
        llama_server.client().chat.completions.create(
            model=MODEL, messages=HELLO, max_tokens=4, stream=True
        )
    )
    assert all(c.usage is None for c in chunks)
    assert chunks[-1].choices[0].finish_reason is not None


def test_n_gives_that_many_choices(llama_server):
    client = llama_server.client()
    reply = client.chat.completions.create(
        model=MODEL, messages=HELLO, n=3, temperature=1.0, seed=7, max_tokens=8
    )
    assert [c.index for c in reply.choices] == [0, 1, 2]
    assert len({c.message.content for c in reply.choices}) > 1  # three draws, not one copied
    # usage counts every sample's tokens
    assert 3 <= reply.usage.completion_tokens <= 3 * 8
    if all(c.finish_reason == "length" for c in reply.choices):
        assert reply.usage.completion_tokens == 3 * 8
    again = client.chat.completions.create(
        model=MODEL, messages=HELLO, n=3, temperature=1.0, seed=7, max_tokens=8
    )
    assert [c.message.content for c in again.choices] == [c.message.content for c in reply.choices]

    chunks = list(
        client.chat.completions.create(
            model=MODEL, messages=HELLO, n=2, temperature=1.0, seed=7, max_tokens=8, stream=True
        )
    )
    texts = {0: "", 1: ""}
    finished = {}
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            if choice.finish_reason:
                finished[choice.index] = choice.finish_reason
    assert set(finished) == {0, 1}
    assert [texts[0], texts[1]] == [c.message.content for c in reply.choices[:2]]


def test_stop_ends_the_reply_before_the_stop_string(llama_server):
    client = llama_server.client()
    full = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=16)
    text = full.choices[0].message.content
    stop = text[5:8]
    assert len(text) > 8 and stop not in text[:5], text
    stopped = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=16, stop=stop)
    assert stopped.choices[0].message.content == text[: text.index(stop)]
    assert stopped.choices[0].finish_reason == "stop"
    # As vLLM's server does, `stop_reason` names the stop string (an extension field).
    assert stopped.choices[0].model_extra == {"stop_reason": stop}
    assert "stop_reason" not in (full.choices[0].model_extra or {})
    streamed = client.chat.completions.create(
        model=MODEL, messages=HELLO, max_tokens=16, stop=[stop, "\x00never"], stream=True
    )
    chunks = list(streamed)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == text[: text.index(stop)]
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert chunks[-1].choices[0].model_extra == {"stop_reason": stop}


@pytest.mark.parametrize("argument", ["max_tokens", "max_completion_tokens"])
def test_max_tokens_caps_the_reply(llama_server, argument):
    reply = llama_server.client().chat.completions.create(
        model=MODEL, messages=HELLO, **{argument: 3}
    )
    assert reply.usage.completion_tokens <= 3
    if reply.choices[0].finish_reason == "length":
        assert reply.usage.completion_tokens == 3


def test_logprobs_come_back_for_each_token(llama_server):
    reply = llama_server.client().chat.completions.create(
        model=MODEL, messages=HELLO, max_tokens=5, logprobs=True, top_logprobs=2
    )
    content = reply.choices[0].logprobs.content
    assert 1 <= len(content) <= 5
    for token in content:
        assert token.logprob <= 0
        assert len(token.top_logprobs) == 2
        assert token.top_logprobs[0].logprob >= token.top_logprobs[1].logprob


def test_32_concurrent_requests_all_complete(llama_server):
    prompts = [f"Question number {i}: what is {i} plus {i}?" for i in range(32)]

    async def ask(client: openai.AsyncOpenAI, i: int) -> tuple[str, str, int]:
        messages = [{"role": "user", "content": prompts[i]}]
        if i % 2:  # half streamed, half not
            stream = await client.chat.completions.create(
                model=MODEL,
                messages=messages,
                stream=True,
                stream_options={"include_usage": True},
            )
            chunks = [chunk async for chunk in stream]
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            return chunks[0].id, text, chunks[-1].usage.completion_tokens
        reply = await client.chat.completions.create(model=MODEL, messages=messages)
        return reply.id, reply.choices[0].message.content, reply.usage.completion_tokens

    async def main():
        async with llama_server.async_client() as client:
            return await asyncio.gather(*(ask(client, i) for i in range(32)))

    results = asyncio.run(main())
    # Each reply is the one its prompt gets alone: greedy, whatever else was in flight.
    client = llama_server.client()
    alone = [
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": p}])
        .choices[0]
        .message.content
        for p in prompts
    ]
    assert [text for _, text, _ in results] == alone
    assert len(set(alone)) > 16  # and the replies depend on the prompt
    assert len({rid for rid, _, _ in results}) == 32
    assert all(0 < tokens <= 16 for _, _, tokens in results)
    for rid, _, tokens in results:
        assert " 200 tokens=" in llama_server.request_line(rid)
        assert f"+{tokens} " in llama_server.request_line(rid)
    llama_server.wait_until_idle()


def test_client_disconnect_mid_stream_frees_the_request(llama_server):
    client = llama_server.client()
    stream = client.chat.completions.create(
        model=MODEL,
        messages=HELLO,
        max_tokens=400,
        extra_body={"min_tokens": 400},  # no early end: it would run for 400 tokens
        stream=True,
    )
    chunks = stream.__iter__()
    first = next(chunks)
    next(chunks)
    stream.close()  # the client goes away mid-reply

    line = llama_server.request_line(first.id)
    # Logged as cancelled by the client; or done, where the tiny model wrote all 400 tokens
    # before the server saw the client go, as a loaded machine can let it (the cancelling
    # itself is proven on a reply too slow to finish first, in test_errors.py).
    assert " POST /v1/chat/completions 499 " in line or " 200 tokens=" in line, line
    llama_server.wait_until_idle()  # its place in the engine is given back
    reply = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=2)
    assert reply.choices[0].finish_reason in ("stop", "length")


def test_vllms_bad_words_and_ignore_eos_are_taken_from_the_body(llama_server):
    """As a vLLM server takes them (the openai client's extra_body): a word the free reply
    wrote is never written once banned, and ignore_eos runs the reply to max_tokens."""
    client = llama_server.client()
    free = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=12, logprobs=True)
    # A word the free reply writes, a token of letters alone (with its space, if any).
    word = next(t.token for t in free.choices[0].logprobs.content if t.token.strip().isalpha())
    banned = client.chat.completions.create(
        model=MODEL, messages=HELLO, max_tokens=12, logprobs=True,
        extra_body={"bad_words": [word.strip()]},
    )  # fmt: skip
    assert banned.choices[0].message.content != free.choices[0].message.content
    assert word not in [t.token for t in banned.choices[0].logprobs.content]
    ran_on = client.chat.completions.create(
        model=MODEL, messages=HELLO, max_tokens=40, extra_body={"ignore_eos": True}
    )
    assert ran_on.usage.completion_tokens == 40 and ran_on.choices[0].finish_reason == "length"
