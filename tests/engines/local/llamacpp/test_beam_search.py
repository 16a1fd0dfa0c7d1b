"""Beam search on LLAMACPP: a request's beams hold sequences of the batched context and swap
them as beams continue one another. The search is beams.py's, which NATIVE's test holds equal
to transformers' `generate(num_beams=...)`; here the engine's beams, batched beside other rows,
equal that search run on llama-cpp-python's own logits, each beam read alone from its start."""

from __future__ import annotations

import asyncio

import pytest

from lmpress.builtin_models.tiny_gguf import tiny_gguf
from lmpress.configs import load_config
from lmpress.engines.local.beams import BeamGroup, log_softmax
from lmpress.engines.registry import create_engine
from lmpress.vocabulary.types import GenerationParams, Request

MAX_NEW = 10
SEARCHES = [
    {"num_beams": 4, "n": 2},
    {"num_beams": 3, "n": 3, "length_penalty": 0.5, "early_stopping": True},
    {"num_beams": 2, "ignore_eos": True},
]


@pytest.fixture(scope="module")
def model() -> str:
    return str(tiny_gguf("llama"))


@pytest.fixture(scope="module")
def engine(model):
    config = load_config(overrides={
        "engine": "LLAMACPP", "model.model_name": model, "generation.batch_size": 16,
    })  # fmt: skip
    engine = create_engine(config)
    yield engine
    asyncio.run(engine.aclose())


def searched_alone(model: str, prompt: list[int], params: GenerationParams, ends: set[int]):
    """beams.py's search over llama-cpp-python's logits, each beam's whole sequence evaluated
    in a fresh context: its best n hypotheses' tokens."""
    import llama_cpp
    import numpy as np

    llm = llama_cpp.Llama(model_path=model, n_ctx=256, logits_all=True, verbose=False)
    try:

        def logits(tokens: list[int]) -> np.ndarray:
            llm.reset()
            llm.eval(tokens)
            return np.array(llm.scores[len(tokens) - 1], dtype=np.float32)

        group = BeamGroup([None] * params.num_beams, MAX_NEW, ends, params)
        running = [[] for _ in range(params.num_beams)]
        first = logits(prompt)
        step = np.stack([first] * params.num_beams)
        while True:
            parents, tokens = group.step(log_softmax(step))
            running = [[*running[p], t] for p, t in zip(parents, tokens, strict=True)]
            if group.done:
                return [tokens for tokens, _, _ in group.replies(params.n)]
            step = np.stack([logits(prompt + beam) for beam in running])
    finally:
        llm.close()


def test_beams_equal_the_search_on_each_beam_alone_beside_other_rows(engine, model):
    tokenizer = engine.tokenizer()
    prompts = [tokenizer.encode(f"Question {i}: why is the sky blue?") for i in range(4)]
    requests = []
    for i, search in enumerate(SEARCHES):
        params = GenerationParams(max_new_tokens=MAX_NEW, **search)
        requests.append(Request(f"beams-{i}", [], params, prompt_ids=prompts[i]))
        greedy = GenerationParams(max_new_tokens=MAX_NEW)
        requests.append(Request(f"greedy-{i}", [], greedy, prompt_ids=prompts[i]))
    results = engine.generate(requests)
    ends = set(engine.vocab.end_ids())
    for request, result in zip(requests, results, strict=True):
        assert result.error is None, result.error
        params = request.params
        if params.num_beams == 1:
            continue
        best = searched_alone(model, request.prompt_ids, params, ends)
        expected = [tokenizer.decode(tokens) for tokens in best]
        assert [s.text for s in result.samples] == expected, request.id
        assert len(result.samples) == params.n
        assert len(set(expected)) == len(expected)  # the beams differ
    # The greedy rows beside them are greedy still: as they are with no beams beside them.
    alone = engine.generate([r for r in requests if r.params.num_beams == 1])
    beside = [r for r in results if r.request_id.startswith("greedy")]
    assert [r.samples[0].text for r in beside] == [r.samples[0].text for r in alone]
    # Every sequence came back once, and holds no more than the prompt it keeps for reuse.
    free = engine.scheduler.sequences.free
    assert sorted(free) == list(range(16))
    assert engine.sequences_in_flight() == 0
    assert engine.kv_cells_used() == engine.kv_cells_cached()


def test_a_row_whose_settings_a_beam_search_cannot_take_fails_alone_in_one_line(engine):
    params = GenerationParams(num_beams=2, stop_strings=["."])
    [result] = engine.generate([Request("r", [], params, prompt_ids=[1, 2])])
    assert (result.error.kind, result.error.message) == (
        "unsupported_param",
        "generation.stop_strings does not go with generation.num_beams 2: stop_token_ids end a "
        "beam instead",
    )
