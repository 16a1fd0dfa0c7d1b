"""The texts of tests/test_unicode.py through serve and the official client, plain and
streamed, and the 10 MB line."""

from __future__ import annotations

import pytest

from tests.conftest import with_plugin
from tests.test_unicode import BIG, LIMIT, TEXTS, echo_of


@pytest.fixture(scope="module")
def roomy_echo_server(serve_process, echo_plugin):
    """ECHO behind serve, with room in a request body and a prompt for the 10 MB line."""
    return serve_process(
        "--engine", "ECHO", "--model.model_name", "echo-model",
        "--serve.max_body_bytes", str(32 * 2**20), "--serve.max_prompt_bytes", str(32 * 2**20),
        *LIMIT,
        env=with_plugin(echo_plugin),
    )  # fmt: skip


@pytest.mark.parametrize("key", [*TEXTS, "big"])
def test_serve_keeps_every_character(roomy_echo_server, key):
    text = BIG if key == "big" else TEXTS[key]
    client = roomy_echo_server.client()
    messages = [{"role": "user", "content": text}]
    reply = client.chat.completions.create(model="echo-model", messages=messages)
    assert reply.choices[0].message.content == echo_of(text)
    if key != "big":  # streamed, the pieces join to the same text
        stream = client.chat.completions.create(model="echo-model", messages=messages, stream=True)
        pieces = [c.choices[0].delta.content or "" for c in stream if c.choices]
        assert "".join(pieces) == echo_of(text)
