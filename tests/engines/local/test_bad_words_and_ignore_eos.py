"""`generation.bad_words` and `generation.ignore_eos` on NATIVE and LLAMACPP, on SmolLM2: in 64
sampled rows whose prompts invite "Paris" (half of them write it freely), no row writes the
word's tokens once it is banned; and with ignore_eos every row runs to max_new_tokens where,
without it, the short replies end on their own. (VLLM passes both to vLLM:
tests/engines/local/vllm_real/test_smollm2.py checks it against vLLM's own replies.)
"""

from __future__ import annotations

import asyncio

import pytest

from lmpress.builtin_models.packaged import SMOLLM2
from lmpress.configs import load_config
from lmpress.engines.registry import create_engine
from lmpress.vocabulary.types import GenerationParams, Message, Request

ENGINES = ["NATIVE", "LLAMACPP"]
PROMPTS = [
    "What is the capital of France?",
    "Which city is the Eiffel Tower in?",
    "Name the capital city of France in one word.",
    "Where is the Louvre museum?",
    "Complete the sentence: The capital of France is",
    "In which city do the French president and government sit?",
    "What city hosted the 2024 Summer Olympics?",
    "Which French city is called the City of Light?",
]
ROWS = 64
TOKENS = 10  # "Paris" comes within the first six tokens where it comes


@pytest.fixture(scope="module", params=ENGINES)
def engine(request):
    overrides = {
        "engine": request.param,
        "model.model_name": SMOLLM2,
        "generation.batch_size": ROWS,
    }
    made = create_engine(load_config(overrides=overrides))
    yield made
    asyncio.run(made.aclose())


def sampled(**params) -> list[Request]:
    return [
        Request(
            f"r{i}",
            [Message("user", PROMPTS[i % len(PROMPTS)])],
            GenerationParams(max_new_tokens=TOKENS, temperature=0.8, seed=i, **params),
        )
        for i in range(ROWS)
    ]


def contains(tokens: list[int], word: list[int]) -> bool:
    return any(tokens[i : i + len(word)] == word for i in range(len(tokens) - len(word) + 1))


def test_a_banned_word_is_never_written_in_64_sampled_rows_that_invite_it(engine):
    free = engine.generate(sampled())
    assert all(r.ok for r in free)
    assert sum("Paris" in r.text for r in free) >= ROWS // 4  # the prompts invite it

    banned = engine.generate(sampled(bad_words=["Paris"], logprobs=True))
    assert all(r.ok for r in banned)
    # vLLM's definition: the word's tokens as a reply's first word and after a space.
    encode = engine.tokenizer().encode
    words = [encode("Paris"), encode(" Paris")]
    for result in banned:
        tokens = [entry.id for entry in result.samples[0].logprobs]
        assert not any(contains(tokens, word) for word in words), result.text
        assert "Paris" not in result.text
    # The other rows are unchanged where the word never came near: a row that did not write
    # it freely may differ only after a point where the ban took something away.
    assert [r.text for r in banned] != [r.text for r in free]


def test_ignore_eos_runs_every_row_to_max_new_tokens(engine):
    short = [
        Request(f"s{i}", [Message("user", q)], GenerationParams(max_new_tokens=24, **params))
        for i, q in enumerate(["What is 2+2?", "What is the capital of France?"])
        for params in ({}, {"ignore_eos": True})
    ]
    results = engine.generate(short)
    ended, ran_on = results[0::2], results[1::2]
    assert all(r.samples[0].finish_reason == "stop" for r in ended)
    assert all(r.usage.completion_tokens < 24 for r in ended)
    for free, ignoring in zip(ended, ran_on, strict=True):
        assert ignoring.samples[0].finish_reason == "length"
        assert ignoring.usage.completion_tokens == 24
        # Up to the end it ignored, the reply is the one that ended there.
        assert ignoring.text.startswith(free.text)


def test_a_word_that_writes_no_token_is_refused_in_one_line(engine):
    [result] = engine.generate(sampled(bad_words=[" "])[:1])
    assert not result.ok
    assert "generation.bad_words" in result.error.message
