"""`Faults.answer` replaces the loopback server's reply text, whole and streamed, as
benchmarks/pipeline_speed.py uses it to answer each step's prompt in the shape it parses."""

from __future__ import annotations

import openai

from tests.servers.llm_server import Faults, LLMServer


def _shout(last_user: str) -> str:
    return last_user.upper() + "!"


def test_a_server_answers_with_its_answer_function_whole_and_streamed():
    with LLMServer(Faults(answer=_shout)) as server:
        client = openai.OpenAI(base_url=server.openai_url, api_key="test")
        messages = [{"role": "user", "content": "which way to the sea"}]
        whole = client.chat.completions.create(model="m", messages=messages, n=2)
        stream = client.chat.completions.create(model="m", messages=messages, stream=True)
        streamed = "".join(chunk.choices[0].delta.content or "" for chunk in stream)
    assert [choice.message.content for choice in whole.choices] == [
        "WHICH WAY TO THE SEA!",
        "WHICH WAY TO THE SEA! #1",
    ]
    assert streamed == "WHICH WAY TO THE SEA!"
