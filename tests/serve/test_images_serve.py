"""Images in /v1/chat/completions through the official openai client, on the tiny LLaVA-style
model on NATIVE: `image_url` parts with data: URLs, a bad image refused with a 400, and no
local file read for a client."""

from __future__ import annotations

import openai
import pytest

from tests.image_files import CORRUPT_PNG, data_url, picture

pytest.importorskip("PIL")

MODEL = "tiny-llava"
TOKENS_PER_IMAGE = 16


def asking(*urls: str) -> list[dict]:
    parts = [{"type": "image_url", "image_url": {"url": url}} for url in urls]
    return [{"role": "user", "content": [{"type": "text", "text": "What is this?"}, *parts]}]


def test_image_url_parts_reach_the_model(llava_server):
    client = llava_server.client()
    text = client.chat.completions.create(model=MODEL, messages=asking())
    first, second = (
        client.chat.completions.create(model=MODEL, messages=asking(data_url(picture(seed))))
        for seed in (1, 2)
    )
    assert first.usage.prompt_tokens == text.usage.prompt_tokens + TOKENS_PER_IMAGE + 1
    assert first.choices[0].message.content != second.choices[0].message.content
    both = client.chat.completions.create(
        model=MODEL, messages=asking(data_url(picture(1)), data_url(picture(2)))
    )
    assert both.usage.prompt_tokens == text.usage.prompt_tokens + 2 * (TOKENS_PER_IMAGE + 1)

    streamed = client.chat.completions.create(
        model=MODEL, messages=asking(data_url(picture(1))), stream=True
    )
    pieces = [chunk.choices[0].delta.content or "" for chunk in streamed if chunk.choices]
    assert "".join(pieces) == first.choices[0].message.content


def test_a_bad_image_or_a_local_file_is_a_400_and_the_server_serves_on(llava_server, tmp_path):
    client = llava_server.client()
    with pytest.raises(openai.BadRequestError) as corrupt:
        client.chat.completions.create(model=MODEL, messages=asking(data_url(CORRUPT_PNG)))
    assert "image 1 (data:image/png;base64 URL" in corrupt.value.message
    assert "cannot be decoded as PNG" in corrupt.value.message

    secret = tmp_path / "secret.png"
    secret.write_bytes(picture(3))
    for url in (secret.as_uri(), str(secret)):
        with pytest.raises(openai.BadRequestError) as local:
            client.chat.completions.create(model=MODEL, messages=asking(url))
        assert "the server reads no local files for a client" in local.value.message
        assert local.value.body["param"] == "messages"
    reply = client.chat.completions.create(model=MODEL, messages=asking(data_url(picture(1))))
    assert reply.choices[0].message.content
