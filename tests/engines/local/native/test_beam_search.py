"""Beam search on NATIVE, on SmolLM2's real weights: every request's beams equal transformers'
own `generate(num_beams=...)`, token for token, while greedy rows share the batch with them."""

from __future__ import annotations

import asyncio

import pytest

from lmpress.builtin_models.packaged import SMOLLM2
from lmpress.configs import load_config
from lmpress.engines.registry import create_engine
from lmpress.vocabulary.errors import UnsupportedParamError
from lmpress.vocabulary.types import GenerationParams, Message, Request
from tests.engines.local.test_reasoning_local import WEATHER

QUESTIONS = [
    "What is the capital of France?",
    "Tell me about cats.",
    "Why is the sky blue?",
    "Name three rivers.",
    "What is 2+2?",
]
# One of each way a search can be set: the returned beams, the length penalty either way,
# and each early_stopping.
SEARCHES = [
    {"num_beams": 4, "n": 2},
    {"num_beams": 3, "length_penalty": 0.5},
    {"num_beams": 4, "n": 4, "early_stopping": True},
    {"num_beams": 2, "n": 2, "early_stopping": "never", "length_penalty": 2.0},
    {"num_beams": 4, "length_penalty": -1.0},
]
MAX_NEW = 24


@pytest.fixture(scope="module")
def engine():
    config = load_config(overrides={
        "engine": "NATIVE", "model.model_name": SMOLLM2, "generation.batch_size": 16,
    })  # fmt: skip
    engine = create_engine(config)
    yield engine
    asyncio.run(engine.aclose())


def transformers_generate(engine, question: str, params: GenerationParams) -> list[tuple]:
    """transformers' own `generate` on the engine's model, one prompt alone: each returned
    sequence's text and its token count (its end token included, as a sample counts it)."""
    import torch

    tokenizer = engine.hf_tokenizer
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, return_tensors="pt"
    )["input_ids"]
    search = {}
    if params.num_beams > 1:
        search = {"num_beams": params.num_beams, "num_return_sequences": params.n,
                  "length_penalty": params.length_penalty,
                  "early_stopping": params.early_stopping}  # fmt: skip
    with torch.inference_mode():
        out = engine.model.generate(
            input_ids=ids, max_new_tokens=MAX_NEW, do_sample=False, **search
        )
    replies = []
    for sequence in out[:, ids.shape[1] :].tolist():
        ends = [i for i, t in enumerate(sequence) if t in engine.eos_ids]
        tokens = sequence[: ends[0] + 1] if ends else sequence  # what follows is padding
        replies.append((tokenizer.decode(tokens, skip_special_tokens=True), len(tokens)))
    return replies


def test_beams_equal_transformers_generate_beside_greedy_rows_in_one_batch(engine):
    requests = []
    for i, (question, search) in enumerate(zip(QUESTIONS, SEARCHES, strict=True)):
        params = GenerationParams(max_new_tokens=MAX_NEW, **search)
        requests.append(Request(f"beams-{i}", [Message("user", question)], params))
        greedy = GenerationParams(max_new_tokens=MAX_NEW)
        requests.append(Request(f"greedy-{i}", [Message("user", question)], greedy))
    results = engine.generate(requests)
    ended = set()
    for request, result in zip(requests, results, strict=True):
        assert result.error is None, result.error
        ours = [(s.text, s.completion_tokens) for s in result.samples]
        question = request.messages[0].text()
        assert ours == transformers_generate(engine, question, request.params), request.id
        ended |= {s.finish_reason for s in result.samples}
        if request.params.num_beams > 1:
            assert len(result.samples) == request.params.n
            assert result.usage.completion_tokens == sum(n for _, n in ours)
    assert ended == {"stop", "length"}  # beams that ended on the end token, and at the limit
    # The beams' different endings: n returns that many distinct texts, best first.
    [wide] = [r for r in results if r.request_id == "beams-2"]
    assert len({s.text for s in wide.samples}) == 4


def test_what_a_beam_search_cannot_take_is_refused_in_one_line(engine):
    with pytest.raises(UnsupportedParamError) as refused:
        create_engine(load_config(overrides={
            "model.model_name": "tiny:llama", "generation.num_beams": 2,
            "generation.temperature": 0.7,
        }))  # fmt: skip
    assert str(refused.value) == (
        "generation.temperature does not go with generation.num_beams 2: beam search here is greedy"
    )
    asks = [
        GenerationParams(num_beams=2, n=3),
        GenerationParams(num_beams=3, stop_strings=["."]),
    ]
    requests = [Request(str(i), [Message("user", "Hi")], p) for i, p in enumerate(asks)]
    # A required tool call is generated under a grammar, which no beam follows.
    required = GenerationParams(num_beams=2, tool_choice="required")
    requests.append(
        Request("tool", [Message("user", "Weather in Oslo?")], required, tools=[WEATHER])
    )
    results = engine.generate(requests)
    assert [(r.error.kind, r.error.message) for r in results] == [
        ("unsupported_param", "generation.n 3 is more than generation.num_beams 2: n returns beams"),
        ("unsupported_param", "generation.stop_strings does not go with generation.num_beams 3: "
         "stop_token_ids end a beam instead"),
        ("unsupported_param", "generation.num_beams: a beam follows no grammar, and this "
         "request's tool_choice needs one; ask without beams"),
    ]  # fmt: skip
