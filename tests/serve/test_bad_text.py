"""A request whose text has no UTF-8 form (a lone surrogate, valid JSON) fails alone with a
4xx naming the message, and the server answers the next request."""

from __future__ import annotations

import pytest

BODIES = {
    "chat": (
        "/v1/chat/completions",
        b'{"model": "tiny-llama", "max_tokens": 4,'
        b' "messages": [{"role": "user", "content": "bad \\ud800 x"}]}',
        "message 1 content",
    ),
    "completion": (
        "/v1/completions",
        b'{"model": "tiny-llama", "max_tokens": 4, "prompt": "bad \\udfff x"}',
        "the prompt",
    ),
}


@pytest.mark.parametrize("kind", sorted(BODIES))
def test_a_lone_surrogate_fails_the_request_alone(llama_server, kind):
    path, body, where = BODIES[kind]
    with llama_server.http() as http:
        bad = http.post(path, content=body, headers={"content-type": "application/json"})
        assert 400 <= bad.status_code < 500, bad.text
        message = bad.json()["error"]["message"]
        assert where in message and "not valid Unicode text" in message
        good = http.post(
            "/v1/chat/completions",
            json={"model": "tiny-llama", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
        )  # fmt: skip
        assert good.status_code == 200, good.text
