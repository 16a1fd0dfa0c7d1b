"""`lmpress serve --cache`: a request the response cache has answered before comes back without
reaching the engine, plain or streamed, and the server's replies are kept for batch and infer."""

from __future__ import annotations

import pytest

from tests.servers.llm_server import LLMServer


@pytest.fixture(scope="module")
def upstream():
    with LLMServer() as running:
        yield running


def chats(upstream: LLMServer) -> int:
    return sum(1 for path, _ in upstream.stats.bodies if path.endswith("/chat/completions"))


def test_a_repeated_request_is_answered_from_the_cache(serve_process, upstream, tmp_path):
    served = serve_process(
        "--engine", "REMOTE", "--remote_params.api_url", upstream.openai_url,
        "--model.model_name", "test-model", "--cache", "on", "--cache-dir", str(tmp_path),
    )  # fmt: skip
    client = served.client()
    ask = {"model": "test-model", "messages": [{"role": "user", "content": "Why is it blue?"}]}
    upstream.reset()
    first = client.chat.completions.create(**ask)
    second = client.chat.completions.create(**ask)
    assert chats(upstream) == 1
    assert second.choices[0].message.content == first.choices[0].message.content
    assert second.usage == first.usage
    stream = client.chat.completions.create(**ask, stream=True)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert text == first.choices[0].message.content and chats(upstream) == 1
    # Sampled without a seed, each request is generated.
    client.chat.completions.create(**ask, temperature=0.9)
    client.chat.completions.create(**ask, temperature=0.9)
    assert chats(upstream) == 3
    # Anthropic's Messages route shares the cache: the same conversation, asked again.
    http = served.http()
    body = {"model": "test-model", "max_tokens": 64,
            "messages": [{"role": "user", "content": "Why is it green?"}]}  # fmt: skip
    replies = [http.post("/v1/messages", json=body).json() for _ in range(2)]
    assert replies[0]["content"] == replies[1]["content"] and chats(upstream) == 4


def test_a_server_without_the_flag_caches_nothing(serve_process, upstream):
    served = serve_process(
        "--engine", "REMOTE", "--remote_params.api_url", upstream.openai_url,
        "--model.model_name", "test-model",
    )  # fmt: skip
    client = served.client()
    ask = {"model": "test-model", "messages": [{"role": "user", "content": "Again?"}]}
    upstream.reset()
    first = client.chat.completions.create(**ask)
    second = client.chat.completions.create(**ask)
    assert first.choices[0].message.content == second.choices[0].message.content
    assert chats(upstream) == 2
