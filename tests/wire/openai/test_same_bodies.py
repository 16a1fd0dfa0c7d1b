"""One body, one answer: the same OpenAI request bodies sent to `lmpress serve` over HTTP and
written as OpenAI Batch lines for `lmpress batch` come back with the same text, finish
reasons, usage and logprobs, since both fronts read and write bodies through wire.openai.

The tiny GGUF model on LLAMACPP, greedy, one sequence at a time, so that both runs compute
exactly the same tokens. Both fronts get the bodies in the same order: LLAMACPP reads a prompt
that begins like the one before it from the cells that one left (sequences.py), and on random
weights a prompt read in two pieces rather than one can tip a near-tie to another token, so a
served body's answer would depend on which test ran before it (a random-order run met that)."""

from __future__ import annotations

import json

import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion

from tests.conftest import run_lmpress
from tests.serve.conftest import Served

pytestmark = pytest.mark.timeout(300)

SETTINGS = ("-c", "tiny-llamacpp", "--generation.batch_size", "1",
            "--generation.max_new_tokens", "12")  # fmt: skip
HI = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]

# (url, body): what batch used to refuse (logit_bias, response_format) and what it used to
# write differently (completion logprobs without text_offset) among them.
BODIES = {
    "plain": ("/v1/chat/completions", {"messages": HI, "max_tokens": 8}),
    "logprobs": ("/v1/chat/completions", {"messages": HI, "logprobs": True, "top_logprobs": 2}),
    "logit-bias": ("/v1/chat/completions", {"messages": HI, "logit_bias": {"5": -100}}),
    "response-format": ("/v1/chat/completions",
                        {"messages": HI, "response_format": {"type": "text"}, "seed": 3}),
    "stop": ("/v1/chat/completions",
             {"messages": HI, "stop": ["e"], "max_completion_tokens": 10}),
    "completion": ("/v1/completions", {"prompt": "Once upon a time", "logprobs": 2}),
    "echo": ("/v1/completions", {"prompt": "Once upon", "echo": True, "max_tokens": 5}),
}  # fmt: skip


@pytest.fixture(scope="module")
def server():
    served = Served([*SETTINGS, "--serve.served_model_name", "tiny"])
    yield served
    served.stop()


@pytest.fixture(scope="module")
def served_bodies(server) -> dict[str, dict]:
    """Each body's answer from `lmpress serve`, asked in the order of the batch's lines."""
    answers = {}
    with server.http() as http:
        for name, (url, body) in BODIES.items():
            response = http.post(url, json={"model": "tiny", **body})
            assert response.status_code == 200, response.text
            answers[name] = response.json()
    return answers


@pytest.fixture(scope="module")
def batch_bodies(tmp_path_factory) -> dict[str, dict]:
    """Each body's answer from `lmpress batch`, by custom_id."""
    tmp = tmp_path_factory.mktemp("batch")
    lines = [
        {"custom_id": name, "method": "POST", "url": url, "body": {"model": "tiny", **body}}
        for name, (url, body) in BODIES.items()
    ]
    src, out = tmp / "in.jsonl", tmp / "out.jsonl"
    src.write_text("".join(json.dumps(line) + "\n" for line in lines))
    run = run_lmpress("batch", *SETTINGS, "-i", str(src), "-o", str(out))
    assert run.returncode == 0, run.stderr
    answers = {}
    for text in out.read_text().splitlines():
        line = json.loads(text)
        assert line["error"] is None and line["response"]["status_code"] == 200
        answers[line["custom_id"]] = line["response"]["body"]
    return answers


def _what_a_user_compares(url: str, body: dict) -> dict:
    """A response body less what differs by nature (ids, timestamps, the model's name)."""
    parsed = (Completion if url == "/v1/completions" else ChatCompletion).model_validate(body)
    data = parsed.model_dump(mode="json")
    for key in ("id", "created", "model", "system_fingerprint"):
        data.pop(key)
    return data


@pytest.mark.parametrize("name", sorted(BODIES))
def test_batch_and_serve_answer_a_body_alike(name, served_bodies, batch_bodies):
    url, _ = BODIES[name]
    served = _what_a_user_compares(url, served_bodies[name])
    batched = _what_a_user_compares(url, batch_bodies[name])
    assert batched == served
    choice = served["choices"][0]
    assert choice["finish_reason"] in ("stop", "length")
    assert served["usage"]["completion_tokens"] > 0
    if name == "completion":
        offsets = choice["logprobs"]["text_offset"]
        tokens = choice["logprobs"]["tokens"]
        assert len(offsets) == len(tokens) and offsets[0] == 0
        assert all(len(choice["logprobs"]["top_logprobs"][i]) <= 2 for i in range(len(tokens)))
    if name == "logprobs":
        assert len(choice["logprobs"]["content"][0]["top_logprobs"]) == 2
    if name == "echo":
        assert choice["text"].startswith("Once upon")
