"""NATIVE's continuous batching on a tiny model: rows leave the batch as they end and waiting
rows join, a shared prompt prefix is computed once, and the KV cache keeps to its budget."""

from __future__ import annotations

import asyncio

import pytest

from lmpress.configs import load_config
from lmpress.engines.local.native.loading import kv_bytes_per_token
from lmpress.engines.registry import create_engine
from lmpress.vocabulary.errors import ConfigError
from lmpress.vocabulary.types import GenerationParams, Message, Request, Result

SYSTEM = "You answer questions about rivers, trains and the sea. " * 3  # 130 tokens here
QUESTIONS = [f"question {i}: " + "why " * (i % 5) for i in range(10)]


def make(model: str, batch_size: int = 4, **model_kwargs):
    overrides = {"model.model_name": model, "generation.batch_size": batch_size}
    if model_kwargs:
        overrides["model.model_kwargs"] = model_kwargs
    return create_engine(load_config(overrides=overrides))


def close(engine) -> None:
    asyncio.run(engine.aclose())


def with_system(params: GenerationParams) -> list[Request]:
    return [
        Request(str(i), [Message("system", SYSTEM), Message("user", q)], params)
        for i, q in enumerate(QUESTIONS)
    ]


def test_short_rows_finish_while_a_long_row_decodes(tiny_llama):
    """Batch size 2: each short row takes the free slot beside the long one and is answered
    while it is still decoding (a static batch would hold the first until the long one ended,
    and the rest behind it)."""
    engine = make(tiny_llama, batch_size=2)

    async def run() -> list[str]:
        finished: list[str] = []

        async def one(request: Request) -> Result:
            result = await engine.complete(request)
            finished.append(request.id)
            return result

        long = Request("long", [Message("user", "go on")], GenerationParams(max_new_tokens=100, min_tokens=100))  # fmt: skip
        shorts = [
            Request(f"short{i}", [Message("user", f"hi {i}")], GenerationParams(max_new_tokens=3))
            for i in range(4)
        ]
        results = await asyncio.gather(one(long), *(one(r) for r in shorts))
        assert all(r.ok for r in results)
        assert results[0].usage.completion_tokens == 100
        return finished

    try:
        finished = asyncio.run(run())
    finally:
        close(engine)
    assert finished[-1] == "long"


def test_rows_joining_and_leaving_anywhere_get_the_replies_they_get_alone(tiny_llama):
    """Batch size 3 and rows of very different lengths: rows end at different steps, joiners
    take their slots, a prompt longer than every row in the batch joins it, rows outlast the
    cache's spare columns, and the batch empties out at the end. Each greedy reply is still the
    one its row gets decoding alone."""
    words = [2, 150, 5, 1, 90, 3, 200, 8, 40, 1, 120, 6]
    limits = [70, 3, 1, 45, 9, 80, 2, 33, 5, 64, 12, 1]
    requests = [
        Request(
            f"r{i}",
            [Message("user", f"{i} " + "sea " * n)],
            GenerationParams(max_new_tokens=m, min_tokens=m),
        )  # fmt: skip
        for i, (n, m) in enumerate(zip(words, limits, strict=True))
    ]
    alone = make(tiny_llama, batch_size=1)
    batched = make(tiny_llama, batch_size=3)
    try:
        expected = [r.text for r in alone.generate(requests)]
        results = batched.generate(requests)
    finally:
        close(alone)
        close(batched)
    assert [r.usage.completion_tokens for r in results] == limits
    assert [r.text for r in results] == expected


def test_reusing_a_shared_prefix_changes_no_reply(tiny_llama):
    greedy = GenerationParams(max_new_tokens=16)
    sampled = GenerationParams(max_new_tokens=16, temperature=1.0, seed=5, n=2)
    texts = {}
    for reuse in (True, False):
        engine = make(tiny_llama, prefix_reuse=reuse)
        try:
            results = engine.generate(with_system(greedy) + with_system(sampled))
        finally:
            close(engine)
        assert all(r.ok for r in results)
        texts[reuse] = [[s.text for s in r.samples] for r in results]
    assert texts[True] == texts[False]
    assert len({t[0] for t in texts[True][: len(QUESTIONS)]}) > len(QUESTIONS) // 2


def test_a_row_too_long_for_the_kv_budget_fails_alone(tiny_llama):
    plain = make(tiny_llama)
    try:
        per_token = kv_bytes_per_token(plain.model.config, plain.dtype)
        params = GenerationParams(max_new_tokens=24)
        expected = [r.text for r in plain.generate(QUESTIONS, params)]
    finally:
        close(plain)
    # Room for about two rows of a short question and 24 new tokens at once.
    budget = make(tiny_llama, kv_cache_gb=110 * per_token / 2**30)
    try:
        too_long = Request("long", [Message("user", "word " * 120)], params)
        results = budget.generate([too_long, *QUESTIONS], params)
    finally:
        close(budget)
    assert results[0].error is not None and results[0].error.kind == "context_length_exceeded"
    assert "kv_cache_gb" in results[0].error.message
    assert [r.text for r in results[1:]] == expected


def test_the_rows_decoding_hold_no_more_kv_cache_than_the_budget(tiny_llama, monkeypatch):
    """Batch size 8, and a budget for about three rows: at every step the slot cache, every
    slot's columns included, fits the budget, and rows still decode side by side."""
    from lmpress.engines.local.native import batch_cache

    held: list[tuple[int, int]] = []  # (rows, columns allocated) at each step
    step_inputs = batch_cache.BatchCache.step_inputs

    def watched(self, width=1):
        out = step_inputs(self, width)
        held.append((len(self.lengths), self.columns()))
        return out

    monkeypatch.setattr(batch_cache.BatchCache, "step_inputs", watched)
    probe = make(tiny_llama)
    try:
        per_token = kv_bytes_per_token(probe.model.config, probe.dtype)
    finally:
        close(probe)
    budget_tokens = 170
    engine = make(tiny_llama, batch_size=8, kv_cache_gb=budget_tokens * per_token / 2**30)
    try:
        results = engine.generate(QUESTIONS, GenerationParams(max_new_tokens=24, min_tokens=24))
    finally:
        close(engine)
    assert all(r.ok for r in results)
    assert max(columns for _, columns in held) <= budget_tokens
    assert max(rows for rows, _ in held) in (2, 3)


@pytest.mark.parametrize("kwargs", [{"kv_cache_gb": 0}, {"kv_cache_gb": "lots"}, {"prefix_reuse": "yes"},
                                    {"pack_weights": "yes"}])  # fmt: skip
def test_bad_batching_settings_are_refused(tiny_llama, kwargs):
    with pytest.raises(ConfigError, match=f"model.model_kwargs.{next(iter(kwargs))}"):
        make(tiny_llama, **kwargs)
