"""64 streaming clients at once through the official openai client, a third of them going away
after their first chunk: every client that stays gets exactly the greedy reply the same engine
gives the same prompt alone, and afterwards the engine holds no row, sequence or KV cell for
anyone. On NATIVE (tiny Llama) and LLAMACPP (tiny GGUF).

The server is the app `lmpress serve` runs (`create_app` over the engine, under uvicorn, as
`run_server` starts it), in a thread of this process rather than a subprocess, so that the
test can read the engine's own scheduler state when the clients are done.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
from collections.abc import Iterator

import pytest
from openai import AsyncOpenAI, OpenAI

from lmpress.builtin_models.tiny import tiny_model
from lmpress.builtin_models.tiny_gguf import tiny_gguf
from lmpress.configs import load_config
from lmpress.engines.registry import create_engine
from lmpress.serve.app import create_app
from lmpress.serve.server import listen

MODEL = "stress"
CLIENTS = 64
BATCH = 8
REPLY = 16  # max_tokens of the clients that stay
LONG = 400  # of the ones that leave: still generating when they go
PROMPTS = [f"Client {i}: tell me about {['rain', 'the sea', 'cats', 'roads'][i % 4]} {i}." for i in range(CLIENTS)]  # fmt: skip
LEAVING = set(random.Random(23).sample(range(CLIENTS), CLIENTS // 3))
MODELS = {"NATIVE": lambda: str(tiny_model("llama")), "LLAMACPP": lambda: str(tiny_gguf("llama"))}


class RequestLines(logging.Handler):
    """The server's request log lines, and a way to wait for lines to be written."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []
        self.written = threading.Condition()

    def emit(self, record: logging.LogRecord) -> None:
        with self.written:
            self.lines.append(record.getMessage())
            self.written.notify_all()

    def wait_for(self, count: int, text: str, timeout: float = 120) -> list[str]:
        with self.written:
            found = self.written.wait_for(
                lambda: len([x for x in self.lines if text in x]) >= count, timeout
            )
            assert found, f"{count} lines with {text!r} never came:\n" + "\n".join(self.lines)
            return [x for x in self.lines if text in x]


class InProcessServer:
    def __init__(self, engine_name: str):
        import uvicorn

        config = load_config(overrides={
            "engine": engine_name, "model.model_name": MODELS[engine_name](),
            "serve.served_model_name": MODEL, "generation.batch_size": BATCH,
            "generation.max_new_tokens": REPLY,
        })  # fmt: skip
        self.engine = create_engine(config)
        self.log = RequestLines()
        logger = logging.getLogger("lmpress.serve")
        logger.setLevel(logging.INFO)
        logger.addHandler(self.log)
        sock = listen("127.0.0.1", 0)
        sock.listen(256)  # clients queue here until uvicorn accepts: nothing to wait for
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
        app = create_app(self.engine, config.serve)
        self.app_server = app.state.server
        self.uvicorn = uvicorn.Server(
            uvicorn.Config(app, log_config=None, access_log=False, lifespan="off")
        )
        self.thread = threading.Thread(
            target=self.uvicorn.run, kwargs={"sockets": [sock]}, daemon=True
        )
        self.thread.start()

    def client(self) -> OpenAI:
        return OpenAI(base_url=self.url, api_key="unused", max_retries=0, timeout=120)

    def async_client(self) -> AsyncOpenAI:
        return AsyncOpenAI(base_url=self.url, api_key="unused", max_retries=0, timeout=120)

    def close(self) -> None:
        self.uvicorn.should_exit = True
        self.thread.join(timeout=30)
        logging.getLogger("lmpress.serve").removeHandler(self.log)
        asyncio.run(self.engine.aclose())


@pytest.fixture(scope="module", params=list(MODELS))
def server(request) -> Iterator[InProcessServer]:
    served = InProcessServer(request.param)
    yield served
    served.close()


def ask(client: OpenAI, i: int) -> str:
    messages = [{"role": "user", "content": PROMPTS[i]}]
    reply = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=REPLY)
    return reply.choices[0].message.content


async def stream_one(client: AsyncOpenAI, i: int) -> str:
    """The streamed reply's text; for a client that leaves after its first chunk, the id of
    the request it left."""
    leaving = i in LEAVING
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": PROMPTS[i]}],
        max_tokens=LONG if leaving else REPLY,
        extra_body={"min_tokens": LONG} if leaving else None,
        stream=True,
    )
    text = ""
    async for chunk in stream:
        if leaving:
            await stream.close()  # the client goes away mid-reply
            return chunk.id
        text += "".join(c.delta.content or "" for c in chunk.choices)
    return text


def assert_nothing_held(server: InProcessServer) -> None:
    engine = server.engine
    assert server.app_server.slots.in_use == 0
    if engine.name == "NATIVE":
        assert engine.scheduler._rows_of == {} and not engine._queue.pending
        # A slot still listed holds a row that has ended (it is dropped before the next step).
        assert all(row is None or row.finish_reason is not None for row in engine.scheduler._active)
    else:
        assert engine.sequences_in_flight() == 0 and not engine._queue.pending
        # The cells left are the ones free sequences keep for a prompt that starts the same.
        assert engine.kv_cells_used() == engine.kv_cells_cached()


def test_64_streaming_clients_a_third_leaving_get_the_sequential_replies(server):
    staying = [i for i in range(CLIENTS) if i not in LEAVING]
    with server.client() as client:  # the reference: each prompt alone, one after another
        alone = {i: ask(client, i) for i in staying}
    assert len(set(alone.values())) > len(staying) // 2  # replies depend on the prompt

    async def everyone():
        async with server.async_client() as client:
            return await asyncio.gather(*(stream_one(client, i) for i in range(CLIENTS)))

    texts = asyncio.run(everyone())
    assert {i: texts[i] for i in staying} == alone
    # Each leaving client's request ended: cancelled (logged 499) or, where the tiny model
    # wrote the whole reply before the server saw the client go (a loaded machine has let
    # it), done (200, up to the context's end). A full batch of new requests then runs
    # beside whatever the cancelled ones still held. (The cancelling itself is proven where
    # a reply is too slow to finish first: tests/serve/test_errors.py.)
    for request_id in (texts[i] for i in LEAVING):
        [line] = server.log.wait_for(1, f"{request_id} ")
        assert " 499 tokens=- " in line or " 200 tokens=" in line, line
    with server.client() as client:
        follow_up = [ask(client, i) for i in staying[:BATCH]]
    assert follow_up == [alone[i] for i in staying[:BATCH]]
    assert_nothing_held(server)
