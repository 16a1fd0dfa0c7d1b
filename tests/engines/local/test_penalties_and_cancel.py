"""Penalties push the way they are named, and a cancelled request stops generating and gives its
place back, on NATIVE and LLAMACPP (tiny real models)."""

from __future__ import annotations

import asyncio

import pytest

from lmpress.builtin_models.tiny import tiny_model
from lmpress.builtin_models.tiny_gguf import tiny_gguf
from lmpress.configs import load_config
from lmpress.engines.registry import create_engine
from lmpress.vocabulary.types import Delta, GenerationParams, Message, Request

MODELS = {"NATIVE": lambda: str(tiny_model("llama")), "LLAMACPP": lambda: str(tiny_gguf("llama"))}
PROMPTS = ["Why is the sky blue?", "one two three four", "Tell me about the sea.", "hello"]


def make(engine: str, batch_size: int):
    overrides = {"engine": engine, "model.model_name": MODELS[engine](), "generation.batch_size": batch_size}  # fmt: skip
    if engine == "NATIVE":
        # float32 wherever the suite runs: on a CUDA GPU `auto` is bfloat16, where the tiny
        # model's logits tie (min_p 1.0 then keeps several tokens) and repeat less.
        overrides["model.torch_dtype_str"] = "float32"
    return create_engine(load_config(overrides=overrides))


@pytest.fixture(scope="module", params=list(MODELS))
def engine(request):
    eng = make(request.param, batch_size=4)
    yield eng
    asyncio.run(eng.aclose())


@pytest.fixture(scope="module")
def unpenalised(engine) -> int:
    return repeats(engine)


def repeats(engine, **penalty) -> int:
    """Tokens of the greedy replies to PROMPTS that repeat a token earlier in the same reply.
    Tokens are told apart by their text; a byte token that is not a whole character (its text
    is U+FFFD, shared by many) is left out."""
    params = GenerationParams(max_new_tokens=48, min_tokens=48, logprobs=True, **penalty)
    results = engine.generate([Request(str(i), [Message("user", p)], params) for i, p in enumerate(PROMPTS)])  # fmt: skip
    count = 0
    for result in results:
        tokens = [e.token for e in result.samples[0].logprobs if "\ufffd" not in e.token]
        count += len(tokens) - len(set(tokens))
    return count


@pytest.mark.parametrize(
    "penalty",
    [{"repetition_penalty": 3.0}, {"presence_penalty": 5.0}, {"frequency_penalty": 5.0}],
    ids=lambda p: next(iter(p)),
)
def test_a_penalty_reduces_repeated_tokens(engine, unpenalised, penalty):
    plain = unpenalised
    assert plain >= 8  # the unpenalised replies do repeat themselves
    # A penalty of the wrong sign makes repeats more likely: several times as many.
    assert repeats(engine, **penalty) <= plain // 4


# --- cancellation ----------------------------------------------------------------------------

LIMIT = 2000


def live_rows(engine) -> list:
    """The engine's rows being generated now, read from its scheduler."""
    if engine.name == "NATIVE":
        return [row for rows in list(engine.scheduler._rows_of.values()) for row in rows]
    return list(engine.scheduler._generating)


@pytest.mark.parametrize("engine_name", list(MODELS))
def test_a_cancelled_request_stops_early_and_frees_its_place(engine_name):
    """batch_size 1: the request after the cancelled one can only start once its place is free,
    so its completion is the event to wait on."""
    engine = make(engine_name, batch_size=1)

    async def run():
        params = GenerationParams(max_new_tokens=LIMIT, min_tokens=LIMIT)
        stream = engine.stream(Request("long", [Message("user", "go on")], params))
        async for item in stream:
            if isinstance(item, Delta):
                break  # the first text came: the consumer goes away
        [row] = live_rows(engine)
        await stream.aclose()
        short = Request("short", [Message("user", "hi")], GenerationParams(max_new_tokens=4))
        return row, await engine.complete(short)

    try:
        row, after = asyncio.run(run())
        assert after.ok and 0 < after.usage.completion_tokens <= 4
        assert row.finish_reason == "cancelled"
        assert row.limit > 400  # the limit it would have run to (the model's context may cap it)
        assert row.generated < 200
        # Nothing holds a place any more: no rows, no sequences, no KV cells but the ones the
        # short request left for reuse.
        assert live_rows(engine) == []
        if engine_name == "NATIVE":
            assert all(r is None or r.finish_reason is not None for r in engine.scheduler._active)
        else:
            assert engine.sequences_in_flight() == 0
            assert engine.kv_cells_used() == engine.kv_cells_cached() < 50
    finally:
        asyncio.run(engine.aclose())


@pytest.mark.parametrize("engine_name", list(MODELS))
def test_an_answer_its_caller_has_yet_to_take_is_no_longer_running(engine_name):
    """batch_size 1: the worker starts the second request as soon as it has answered the
    first, whether or not the first's caller has taken the answer yet. What a server's
    metrics read then is one running, never two (a scrape once showed two)."""
    engine = make(engine_name, batch_size=1)

    async def run():
        short = GenerationParams(max_new_tokens=4, min_tokens=4)
        first = engine.stream(Request("first", [Message("user", "hi")], short))
        assert isinstance(await anext(first), Delta)  # it runs; its answer is left untaken
        long = GenerationParams(max_new_tokens=LIMIT, min_tokens=LIMIT)
        second = asyncio.ensure_future(
            engine.complete(Request("second", [Message("user", "go on")], long))
        )
        while len(engine._live) < 2 or engine.occupancy().waiting:
            await asyncio.sleep(0.01)  # until the worker has taken the second from the queue
        held = engine.occupancy()
        *_, answer = [item async for item in first]
        assert answer.ok
        second.cancel()
        return held

    try:
        held = asyncio.run(run())
        assert (held.running, held.waiting) == (1, 0)
    finally:
        asyncio.run(engine.aclose())
