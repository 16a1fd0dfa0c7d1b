"""What one request may ask of `lmpress serve` (issue 49): each cap a 400 naming its `serve.*`
setting, a request counting in the queue for every sequence it asks for, a long prompt
tokenized off the event loop, and an upload stopped where it passes the limit."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import with_plugin

MODEL = "echo-model"
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def gate(tmp_path_factory) -> Path:
    """While this file is missing, ECHO holds every reply (ECHO_GATE)."""
    path = tmp_path_factory.mktemp("gate") / "open"
    path.touch()
    return path


@pytest.fixture(scope="module")
def capped(serve_process, echo_plugin, gate):
    """ECHO with small caps: 4 places in the queue, n up to 3, 60 new tokens a request, 3
    prompts a request, prompts of 2000 bytes."""
    return serve_process(
        "--engine", "ECHO", "--model.model_name", MODEL, "--serve.queue_limit", "4",
        "--serve.max_n", "3", "--serve.max_new_tokens_per_request", "60",
        "--serve.max_prompts_per_request", "3", "--serve.max_prompt_bytes", "2000",
        env={**with_plugin(echo_plugin), "ECHO_GATE": str(gate)},
    )  # fmt: skip


def refusal(response: httpx.Response) -> str:
    """The message of an OpenAI or Anthropic 400."""
    assert response.status_code == 400, response.text
    return response.json()["error"]["message"]


CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


@pytest.mark.parametrize(
    ("path", "body", "message", "param"),
    [
        (CHAT, {"n": 4}, "n=4 is over serve.max_n=3", "n"),
        (COMPLETIONS, {"prompt": "hi", "n": 4}, "n=4 is over serve.max_n=3", "n"),
        (CHAT, {"n": 3, "max_tokens": 21},
         "n x max_tokens = 3 x 21 = 63 tokens is over serve.max_new_tokens_per_request=60",
         "max_tokens"),
        (CHAT, {"max_completion_tokens": 61},
         "n x max_completion_tokens = 1 x 61 = 61 tokens is over "
         "serve.max_new_tokens_per_request=60", "max_completion_tokens"),
        (COMPLETIONS, {"prompt": ["a", "b"], "n": 2, "max_tokens": 16},
         "prompts x n x max_tokens = 2 x 2 x 16 = 64 tokens is over "
         "serve.max_new_tokens_per_request=60", "max_tokens"),
        (COMPLETIONS, {"prompt": ["a", "b", "c", "d"]},
         "4 items in 'prompt' is over serve.max_prompts_per_request=3", "prompt"),
        (COMPLETIONS, {"prompt": ["a", "b"], "n": 3, "max_tokens": 2},
         "6 sequences (prompts x n) is over serve.queue_limit=4", None),
        # bytes, not characters: 1001 characters of 2 bytes each
        (COMPLETIONS, {"prompt": "é" * 1001},
         "a prompt of 2002 bytes is over serve.max_prompt_bytes=2000", "prompt"),
        (CHAT, {"messages": [{"role": "system", "content": "x" * 1000},
                             {"role": "user", "content": "y" * 1001}]},
         "a prompt of 2001 bytes is over serve.max_prompt_bytes=2000", "messages"),
    ],
)  # fmt: skip
def test_each_cap_is_a_400_naming_its_setting(capped, path, body, message, param):
    base = {"model": MODEL, "max_tokens": 2, **({"messages": HI} if path == CHAT else {})}
    with capped.http() as http:
        response = http.post(path, json={**base, **body})
    assert message in refusal(response)
    assert response.json()["error"]["param"] == param
    assert "--serve." in refusal(response)  # and how to raise it


def test_the_caps_hold_on_the_anthropic_and_responses_routes(capped):
    with capped.http() as http:
        messages = http.post(
            "/v1/messages", json={"model": MODEL, "max_tokens": 61, "messages": HI}
        )
        assert messages.json()["type"] == "error"  # Anthropic's shape
        assert "1 x 61 = 61 tokens is over serve.max_new_tokens_per_request=60" in refusal(messages)
        long = [{"role": "user", "content": "x" * 2001}]
        counted = http.post("/v1/messages/count_tokens", json={"model": MODEL, "messages": long})
        assert "serve.max_prompt_bytes=2000" in refusal(counted)
        responses = http.post("/v1/responses",
                              json={"model": MODEL, "input": "hi", "max_output_tokens": 61})  # fmt: skip
        assert "n x max_output_tokens = 1 x 61" in refusal(responses)
        assert "serve.max_new_tokens_per_request=60" in refusal(responses)


def test_a_request_within_the_caps_is_answered(capped):
    """Requests of three places each, one after another, against a queue of four: each finds
    the places of the one before free, since a request gives them back before the last byte of
    its reply (a streamed one, before the stream's end)."""
    client = capped.client()
    for _ in range(10):
        reply = client.chat.completions.create(model=MODEL, messages=HI, n=3, max_tokens=20)
        assert [c.index for c in reply.choices] == [0, 1, 2]
        assert all(c.message.content.startswith("ECHO ") for c in reply.choices)
        text = client.completions.create(model=MODEL, prompt=["a", "b", "c"], max_tokens=20)
        assert [c.text for c in text.choices] == ['ECHO "a"', 'ECHO "b"', 'ECHO "c"']
        stream = client.chat.completions.create(
            model=MODEL, messages=HI, n=3, max_tokens=20, stream=True
        )
        assert {c.choices[0].index for c in stream if c.choices} == {0, 1, 2}
    at_cap = client.completions.create(model=MODEL, prompt="é" * 1000, max_tokens=1)
    assert at_cap.choices[0].text == "ECHO"


def test_a_request_holds_a_place_in_the_queue_for_each_sequence(capped, gate):
    """Three prompts hold three of the four places: a chat asking n=2 finds the queue full
    while they run, and is answered once they are done."""
    gate.unlink()  # ECHO holds every reply from now on
    held: dict[str, httpx.Response] = {}

    def three_prompts() -> None:
        with capped.http() as http:
            body = {"model": MODEL, "prompt": ["a", "b", "c"], "max_tokens": 2}
            held["reply"] = http.post(COMPLETIONS, json=body)

    thread = threading.Thread(target=three_prompts)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while capped.in_flight() < 3 and time.monotonic() < deadline:  # however they arrive
            time.sleep(0.02)
        assert capped.in_flight() == 3  # places, one a prompt
        with capped.http() as http:
            full = http.post(CHAT, json={"model": MODEL, "messages": HI, "n": 2, "max_tokens": 2})
        assert full.status_code == 503, full.text
        assert full.json()["error"]["code"] == "queue_full"
        assert "serve.queue_limit" in full.json()["error"]["message"]
    finally:
        gate.touch()
        thread.join(60)
    assert held["reply"].status_code == 200
    capped.wait_until_idle()
    reply = capped.client().chat.completions.create(model=MODEL, messages=HI, n=2, max_tokens=2)
    assert len(reply.choices) == 2


def test_the_default_caps_refuse_openais_n_limit_and_a_long_prompt(echo_server, llama_server):
    with echo_server.http() as http:
        many = http.post(CHAT, json={"model": MODEL, "messages": HI, "n": 129})
    assert "n=129 is over serve.max_n=128" in refusal(many)
    prompt = "word " * (1024 * 1024 // 5 + 1)  # just over 1 MiB, under the 4 MiB body limit
    with llama_server.http() as http:
        long = http.post(COMPLETIONS, json={"model": "tiny-llama", "prompt": prompt})
    assert "over serve.max_prompt_bytes=1048576" in refusal(long)


def test_a_4_mb_prompt_is_tokenized_while_health_answers(serve_process, tiny_llama):
    served = serve_process(
        "--engine", "NATIVE", "--model.model_name", tiny_llama,
        "--serve.served_model_name", "tiny-llama", "--generation.max_new_tokens", "1",
        "--serve.max_body_bytes", "8000000", "--serve.max_prompt_bytes", "8000000",
    )  # fmt: skip
    words = "hello world " * 350_000  # 4.2 MB
    answered: dict[str, httpx.Response] = {}

    def long_prompt() -> None:
        with served.http(timeout=300) as http:
            body = {"model": "tiny-llama", "prompt": words}
            answered["reply"] = http.post(COMPLETIONS, json=body)

    thread = threading.Thread(target=long_prompt)
    thread.start()
    polls = []
    started = time.monotonic()
    with served.http(timeout=300) as http:
        while thread.is_alive():
            sent = time.monotonic()
            assert http.get("/health").status_code == 200
            polls.append(time.monotonic() - sent)
            time.sleep(0.05)
    thread.join()
    took = time.monotonic() - started
    # the engine tokenized it, and found it longer than the tiny model's context
    assert "context" in refusal(answered["reply"])
    # Health kept answering while it did: a server blocked by the tokenizing holds a poll for
    # about the whole request. A load on the machine slows both alike, so the longest poll is
    # held to a share of the request's own time, not to a second of the wall clock.
    assert len(polls) >= 3 and max(polls) < took / 2, (polls, took)


@pytest.fixture(scope="module")
def uploads(serve_process, echo_plugin, tmp_path_factory):
    """ECHO with the Files API, its temporary files in a folder of its own."""
    state, temp = tmp_path_factory.mktemp("state"), tmp_path_factory.mktemp("tmp")
    return serve_process(
        "--engine", "ECHO", "--model.model_name", MODEL, "--state-dir", str(state),
        env={**with_plugin(echo_plugin), "TMPDIR": str(temp)},
    )  # fmt: skip


def written_bytes(pid: int) -> int:
    """What a process has written so far, files and pipes (`wchar` of /proc/PID/io)."""
    fields = dict(line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines())
    return int(fields["wchar"])


def test_a_chunked_upload_stops_at_the_limit(uploads):
    """1 GB without Content-Length: the server stops reading past its 200 MiB limit, having
    spooled no more than that, and answers 413."""
    line = json.dumps({"custom_id": "x", "method": "POST", "url": CHAT, "body": {}}) + "\n"
    chunk = (line * (1024 * 1024 // len(line))).encode()
    form = (
        b'--b0undary\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        b'--b0undary\r\nContent-Disposition: form-data; name="file"; filename="big.jsonl"\r\n'
        b"Content-Type: application/jsonl\r\n\r\n"
    )
    sent = 0

    def body():
        nonlocal sent
        yield form
        while sent < 1024**3:
            sent += len(chunk)
            yield chunk
        yield b"\r\n--b0undary--\r\n"

    before = written_bytes(uploads.proc.pid)
    headers = {"content-type": "multipart/form-data; boundary=b0undary"}
    with uploads.http(timeout=120) as http:
        try:
            response = http.post("/v1/files", content=body(), headers=headers)
            assert response.status_code == 413, response.text
        except httpx.TransportError:  # the server closed the connection as it answered
            pass
    uploads.wait_for_log(lambda line: " POST /v1/files 413 " in line)
    spooled = written_bytes(uploads.proc.pid) - before
    assert spooled < 230 * 1024**2, spooled
    assert sent < 1024**3  # it stopped reading: the client never sent the whole gigabyte
    assert uploads.client().files.list().data == []
