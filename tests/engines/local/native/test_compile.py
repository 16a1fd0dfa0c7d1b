"""`model.compile` on NATIVE: the decoding step under torch.compile, warmed at load, gives the
eager engine's and transformers' greedy text, and compiles a bounded number of graphs however
many rows are in flight and however long they grow."""

from __future__ import annotations

import asyncio
import os

import pytest

from lmpress.builtin_models.packaged import SMOLLM2
from tests.engines.local.test_reference_equality import QUESTIONS, chat, make, transformers_greedy

pytestmark = pytest.mark.slow  # each engine compiles its decoding step at load


def graphs() -> int:
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


BEFORE_LOAD: list[int] = []  # the graph count when the module's engine began to load


@pytest.fixture(scope="module")
def compiled(tiny_llama):
    import torch

    torch._dynamo.reset()
    # The count outlives a reset: another module's compiled engine in this worker (the int8
    # cache's test) may have added its graph already.
    BEFORE_LOAD.append(graphs())
    engine = make(tiny_llama, **{"model.compile": True, "generation.batch_size": 8})
    yield engine
    asyncio.run(engine.aclose())


def greedy_texts(engine, tokens: list[int]) -> list[str]:
    from lmpress.vocabulary.types import GenerationParams

    requests = [
        chat(QUESTIONS[i % len(QUESTIONS)], GenerationParams(max_new_tokens=n), str(i))
        for i, n in enumerate(tokens)
    ]
    results = engine.generate(requests)
    assert all(r.ok for r in results)
    return [r.text for r in results]


def test_compile_warms_the_decoding_step_at_load(compiled):
    # One graph for any number of rows but one (a lone row steps eagerly).
    assert compiled.scheduler._decode is not compiled.model
    assert graphs() == BEFORE_LOAD[-1] + 1


def test_compiled_graphs_stay_bounded_across_rows_and_lengths(compiled):
    """Rows join and leave (1 to 8 in flight) and grow past several of the mask's 64-column
    rounds and the cache's 256-column growth: no step compiles a graph of its own."""
    before = graphs()
    for tokens in ([300], [5, 300, 40], [3, 9, 17, 33, 65, 129, 200, 280], [70] * 8):
        greedy_texts(compiled, tokens)
    assert graphs() == before


def test_compiled_greedy_text_equals_transformers_generate(compiled, tiny_llama):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_llama).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama)
    texts = greedy_texts(compiled, [40] * len(QUESTIONS))
    for question, text in zip(QUESTIONS, texts, strict=True):
        _, reply, _, ends = transformers_greedy(model, tokenizer, question, 40)
        assert text == tokenizer.decode([t for t in reply if t not in ends], skip_special_tokens=True)  # fmt: skip


@pytest.mark.skipif(
    not os.environ.get("LMPRESS_COMPILE_TESTS"),
    reason="compiling SmolLM2's decoding step takes about 6 minutes on a 2-core machine; set "
    "LMPRESS_COMPILE_TESTS=1 to run it (the tiny model's tests above run every time)",
)
def test_compiled_greedy_text_equals_transformers_generate_on_smollm2():
    engine = make(SMOLLM2, **{"model.compile": True, "generation.batch_size": 16})
    try:
        texts = greedy_texts(engine, [20] * len(QUESTIONS))
        for question, text in zip(QUESTIONS, texts, strict=True):
            _, reply, _, ends = transformers_greedy(engine.model, engine.hf_tokenizer, question, 20)
            ids = [t for t in reply if t not in ends]
            assert text == engine.hf_tokenizer.decode(ids, skip_special_tokens=True)
    finally:
        asyncio.run(engine.aclose())
