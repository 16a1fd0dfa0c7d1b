"""Prompt tokens counted without generating equal what the engine then reports.

On the real SmolLM2 model, on NATIVE and LLAMACPP, the counter (which loads no weights) counts
each of a handful of varied rows exactly as the engine's `usage.prompt_tokens`, and knows the
context the engine refuses prompts at. Remote engines count with a tokenizer the config names,
checked against transformers' own chat template, or else estimate and say so.
"""

from __future__ import annotations

import asyncio

import pytest

from lmpress.builtin_models.packaged import SMOLLM2
from lmpress.configs import load_config
from lmpress.dryrun.prompt_tokens import prompt_counter
from lmpress.engines.prompt_count import estimate_request_tokens
from lmpress.engines.registry import create_engine
from lmpress.vocabulary.errors import ModelLoadError, RequestError
from lmpress.vocabulary.types import ContentPart, GenerationParams, Message, Request, ToolCall

PARAMS = GenerationParams(max_new_tokens=2)
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def rows() -> list[Request]:
    called = ToolCall("call_1", "get_weather", '{"city": "Paris"}')
    return [
        Request("user", [Message("user", "What is the capital of France?")], PARAMS),
        Request(
            "system",
            [Message("system", "You answer in one word."), Message("user", "Sky colour?")],
            PARAMS,
        ),
        Request(
            "turns",
            [
                Message("user", "Name a fruit."),
                Message("assistant", "An apple."),
                Message("user", "And a vegetable? Café, naïve, 東京 ☀ welcome."),
            ],
            PARAMS,
        ),
        Request("raw", [], PARAMS, prompt="The capital of France is"),
        Request("tools", [Message("user", "Weather in Paris?")], PARAMS, tools=[WEATHER]),
        Request(
            "tool-turns",
            [
                Message("user", "Weather in Paris?"),
                Message("assistant", "", tool_calls=[called]),
                Message("tool", '{"celsius": 21}', tool_call_id="call_1"),
            ],
            PARAMS,
            tools=[WEATHER],
        ),
        Request(
            "parts",
            [Message("user", [ContentPart("text", "Two "), ContentPart("text", "parts.")])],
            PARAMS,
        ),
    ]


TOO_LONG = Request("long", [Message("user", "word " * 700)], PARAMS)

# A small context on each engine, so that one row goes over it: LLAMACPP's 2048 tokens shared
# by 4 sequences (512 each), NATIVE capped at 512 by model_max_length.
SETTINGS = {
    "LLAMACPP": {"model.model_kwargs": {"n_ctx": 2048}, "generation.batch_size": 4},
    "NATIVE": {"model.model_max_length": 512, "generation.batch_size": 4},
}


@pytest.fixture(scope="module", params=["LLAMACPP", "NATIVE"])
def smollm2(request):
    config = load_config(
        overrides={"engine": request.param, "model.model_name": SMOLLM2, **SETTINGS[request.param]}
    )
    engine = create_engine(config)
    yield config, engine
    asyncio.run(engine.aclose())


def test_counts_equal_the_prompt_tokens_the_engine_reports(smollm2):
    config, engine = smollm2
    counter = prompt_counter(config)
    requests = rows()
    counted = {r.id: counter.count(r) for r in requests}
    results = engine.generate(requests)
    assert [r.error for r in results] == [None] * len(requests)
    reported = {r.request_id: r.usage.prompt_tokens for r in results}
    assert counted == reported
    assert counter.exact
    # The rows differ, so equal dicts are not a coincidence of one length.
    assert len(set(counted.values())) == len(counted)
    assert counted["tool-turns"] > counted["tools"] > counted["user"]


def test_the_counter_knows_the_context_the_engine_refuses_prompts_at(smollm2):
    config, engine = smollm2
    counter = prompt_counter(config)
    engine_context = engine.n_ctx_seq if config.engine == "LLAMACPP" else engine.context_length
    assert counter.context == engine_context == 512
    assert counter.count(TOO_LONG) >= counter.context
    (result,) = engine.generate([TOO_LONG])
    assert result.error is not None and result.error.kind == "context_length_exceeded"


def test_a_row_the_engine_refuses_before_generating_fails_the_count_the_same_way(smollm2):
    config, engine = smollm2
    image = ContentPart("image_url", image_url="data:image/png;base64,AAAA")
    request = Request("image", [Message("user", [ContentPart("text", "What?"), image])], PARAMS)
    with pytest.raises(RequestError, match="text only"):
        prompt_counter(config).count(request)
    (result,) = engine.generate([request])
    assert result.error is not None and result.error.kind == "invalid_request"


def test_llamacpp_context_follows_n_ctx_and_batch_size_as_llama_cpp_makes_it():
    """The counter predicts a sequence's part of the KV cache without loading the weights;
    the engine's real context says whether it predicted right (llama.cpp rounds n_ctx up to a
    multiple of 256, and each of batch_size sequences gets an equal part, also of 256)."""
    from lmpress.builtin_models.tiny_gguf import tiny_gguf

    path = str(tiny_gguf("llama"))  # trained with a context of 2048
    for n_ctx, batch_size in [(0, 1), (0, 3), (300, 1), (1000, 3), (4000, 8)]:
        config = load_config(overrides={
            "engine": "LLAMACPP", "model.model_name": path,
            "model.model_kwargs": {"n_ctx": n_ctx}, "generation.batch_size": batch_size,
        })  # fmt: skip
        engine = create_engine(config)
        try:
            assert prompt_counter(config).context == engine.n_ctx_seq, (n_ctx, batch_size)
        finally:
            asyncio.run(engine.aclose())


# --- remote engines ---------------------------------------------------------------------------


def test_a_hosted_provider_without_a_tokenizer_gets_an_estimate_marked_as_one():
    counter = prompt_counter(load_config("openai"))
    assert not counter.exact
    assert counter.context is None
    assert "estimate" in counter.tokenizer_label
    for request in rows():
        assert counter.count(request) == estimate_request_tokens(request)


def test_a_tool_schema_counts_in_the_estimate():
    counter = prompt_counter(load_config("openai"))
    with_tools, without = rows()[4], Request("t", rows()[4].messages, PARAMS)
    assert counter.count(with_tools) > counter.count(without)


def test_model_tokenizer_name_counts_exactly_as_transformers_renders(tiny_llama):
    from transformers import AutoTokenizer

    config = load_config(overrides={"engine": "REMOTE_VLLM", "model.model_name": "served-model",
                                    "model.tokenizer_name": tiny_llama})  # fmt: skip
    counter = prompt_counter(config)
    assert counter.exact
    assert tiny_llama in counter.tokenizer_label
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama)
    for request in rows()[:3]:
        messages = [{"role": m.role, "content": m.text()} for m in request.messages]
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        assert counter.count(request) == len(ids), request.id
    raw = rows()[3]
    assert counter.count(raw) == len(tokenizer(raw.prompt)["input_ids"])


def test_a_tokenizer_the_config_names_must_load_and_nothing_is_downloaded():
    config = load_config(overrides={"engine": "OPENAI", "model.model_name": "gpt-4o",
                                    "model.tokenizer_name": "nobody/no-such-tokenizer"})  # fmt: skip
    with pytest.raises(ModelLoadError, match="no-such-tokenizer"):
        prompt_counter(config)


# --- VLLM ---------------------------------------------------------------------------------------


def test_vllm_counts_with_the_model_tokenizer_and_its_max_model_len(tiny_llama):
    from transformers import AutoTokenizer

    base = {"engine": "VLLM", "model.model_name": tiny_llama}
    counter = prompt_counter(load_config(overrides=base))
    assert counter.exact
    assert counter.context == 512  # the tiny model's max_position_embeddings
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama)
    raw = rows()[3]
    assert counter.count(raw) == len(tokenizer(raw.prompt)["input_ids"])
    capped = load_config(overrides={**base, "model.model_kwargs": {"max_model_len": 128}})
    assert prompt_counter(capped).context == 128


def test_vllm_with_a_model_not_on_this_machine_gets_an_estimate():
    config = load_config(overrides={"engine": "VLLM", "model.model_name": "nobody/no-such-model"})
    counter = prompt_counter(config)
    assert not counter.exact and "estimate" in counter.tokenizer_label
