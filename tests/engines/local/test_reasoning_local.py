"""Reasoning models on NATIVE (tiny:think) and LLAMACPP (tiny-gguf:think): two tiny random
models whose chat template opens a `<think>` block, as the DeepSeek-R1 distills' and Qwen3's
do. What a user sees: the thinking in `reasoning` and the answer in `text`, a thinking budget
cut at exactly its tokens with the answer following (the same tokens the reference library
gives for that prompt and that thinking), a JSON schema that applies to the answer, thinking
switched off, and streamed thinking before the answer."""

from __future__ import annotations

import asyncio
import json

import jsonschema
import pytest

from lmpress.batch.guided_check import check_structure
from lmpress.configs import load_config
from lmpress.engines.registry import create_engine
from lmpress.vocabulary.errors import ConfigError
from lmpress.vocabulary.types import Delta, GenerationParams, Message, Request, Result

MODELS = {"NATIVE": "tiny:think", "LLAMACPP": "tiny-gguf:think"}
CLOSE = "\n</think>\n\n"
SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 8},
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
    },
    "required": ["city", "n"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module", params=list(MODELS))
def engine(request):
    config = load_config(None, {
        "engine": request.param, "model.model_name": MODELS[request.param],
        "generation.batch_size": 8, "generation.max_new_tokens": 24,
        # LLAMACPP: 1024 tokens a sequence, which a prompt offering tools needs
        **({"model.model_kwargs": {"n_ctx": 8192}} if request.param == "LLAMACPP" else {}),
    })  # fmt: skip
    engine = create_engine(config)
    yield engine
    asyncio.run(engine.aclose())


def ask(text: str, **params) -> Request:
    return Request(text[:12], [Message("user", text)], GenerationParams(**params))


def run(engine, *requests: Request) -> list[Result]:
    results = engine.generate(list(requests))
    for result in results:
        assert result.ok, result.error
    return results


@pytest.fixture(scope="module")
def reference(engine):
    """(thinking, answer) of a request as the reference library writes them greedily
    (transformers' generate, llama-cpp-python's Llama): `thinking` tokens from the prompt, then
    the close written in, then the rest of `total` tokens."""
    if engine.name == "NATIVE":
        import torch

        tokenizer = engine.hf_tokenizer

        def more(ids: list[int], n: int) -> list[int]:
            out = engine.model.generate(
                torch.tensor([ids]), max_new_tokens=n, do_sample=False, min_new_tokens=n,
                attention_mask=torch.ones((1, len(ids)), dtype=torch.long),
            )  # fmt: skip
            return out[0, len(ids) :].tolist()

        def decode(ids: list[int]) -> str:
            return tokenizer.decode(ids)

        close = tokenizer.encode(CLOSE, add_special_tokens=False)
        llama = None
    else:
        import llama_cpp

        llama, vocab = llama_cpp.Llama(engine.path, n_ctx=256, verbose=False), engine.vocab

        def more(ids: list[int], n: int) -> list[int]:
            out = []
            for token in llama.generate(ids, top_k=1, temp=0.0, reset=True):
                out.append(token)
                if len(out) == n:
                    break
            return out

        def decode(ids: list[int]) -> str:
            return b"".join(vocab.piece(t, special=False) for t in ids).decode(errors="replace")

        close = llama.tokenize(CLOSE.encode(), add_bos=False, special=True)

    def written(request: Request, thinking: int, total: int) -> tuple[str, str]:
        prompt = engine.encode(request)
        thought = more(prompt, thinking)
        if total == thinking:
            return decode(thought).strip("\n"), ""
        answer = more(prompt + thought + close, total - thinking - len(close))
        return decode(thought).strip("\n"), decode(answer)

    yield written
    if llama is not None:
        llama.close()


def test_thinking_is_apart_from_the_answer_and_cut_at_exactly_its_budget(engine, reference):
    request = ask("Where is the harbour?", max_reasoning_tokens=6, max_new_tokens=24)
    (result,) = run(engine, request)
    sample = result.samples[0]
    assert sample.reasoning_tokens == 6 and result.usage.reasoning_tokens == 6
    assert result.usage.completion_tokens == 24  # thinking, the close and the answer together
    assert sample.reasoning and sample.text
    for mark in ("<think>", "</think>"):
        assert mark not in sample.reasoning and mark not in sample.text
    assert (sample.reasoning, sample.text) == reference(request, 6, 24)


def test_a_budget_of_zero_closes_the_thinking_at_once(engine):
    (result,) = run(engine, ask("Where is the harbour?", max_reasoning_tokens=0))
    assert result.samples[0].reasoning == "" and result.usage.reasoning_tokens == 0
    assert result.text and "</think>" not in result.text


def test_each_row_of_one_batch_is_cut_at_its_own_budget(engine):
    budgets = [0, 1, 3, 5, 8, 13]
    requests = [
        ask(f"Row {i}: name a ship.", max_reasoning_tokens=n) for i, n in enumerate(budgets)
    ]
    together = run(engine, *requests)
    assert [r.usage.reasoning_tokens for r in together] == budgets
    if engine.config.engine == "LLAMACPP":
        # llama.cpp computes one sequence's logits with other kernels than several sequences'
        # (docs/batch/index.md, "Seeds"), and on these random weights a greedy pick often
        # rests on a near-tie that the difference flips (on an AVX2-only CPU, not on AVX-512):
        # the same rows in the opposite order, whose steps decode the same rows, must agree.
        again = run(engine, *reversed(requests))[::-1]
        assert [r.usage.reasoning_tokens for r in again] == budgets
        assert [(r.reasoning, r.text) for r in again] == [(r.reasoning, r.text) for r in together]
        return
    alone = [run(engine, request)[0] for request in requests[1::2]]
    assert [(r.reasoning, r.text) for r in alone] == [(r.reasoning, r.text) for r in together[1::2]]


def test_without_a_budget_every_token_before_the_end_mark_is_thinking(engine, reference):
    request = ask("Where is the harbour?", max_new_tokens=10)
    (result,) = run(engine, request)
    sample = result.samples[0]
    thought, _ = reference(request, 10, 10)  # this random model does not close it so soon
    assert (sample.reasoning, sample.text, sample.reasoning_tokens) == (thought, "", 10)
    assert result.finish_reason == "length"


def test_each_sample_of_a_request_keeps_its_own_budget(engine):
    request = ask("Name a ship.", max_reasoning_tokens=4, n=2, temperature=1.0, seed=3)
    (result,) = run(engine, request)
    assert [s.reasoning_tokens for s in result.samples] == [4, 4]
    assert result.usage.reasoning_tokens == 8
    assert all(s.reasoning is not None for s in result.samples)


def test_a_json_schema_applies_to_the_answer_after_the_thinking(engine):
    guided = {"json": SCHEMA, "disable_any_whitespace": True}
    requests = [
        ask(f"Give city {i} as JSON.", max_reasoning_tokens=n, max_new_tokens=48,
            guided_decoding=guided)
        for i, n in enumerate((0, 4, 9))
    ]  # fmt: skip
    results = [check_structure(q, r) for q, r in zip(requests, run(engine, *requests), strict=True)]
    for result, budget in zip(results, (0, 4, 9), strict=True):
        assert result.ok, result.error
        assert result.structured["valid"]
        jsonschema.validate(json.loads(result.text), SCHEMA)
        assert result.usage.reasoning_tokens == budget
        assert result.reasoning is not None and result.text.startswith("{")


def test_reasoning_effort_none_turns_the_thinking_off(engine):
    (result,) = run(engine, ask("Where is the harbour?", reasoning_effort="none"))
    assert result.reasoning is None and result.usage.reasoning_tokens == 0
    assert result.text
    # a budget has nothing to bound then
    (bounded,) = run(
        engine, ask("Where is the harbour?", reasoning_effort="none", max_reasoning_tokens=2)
    )
    assert (bounded.reasoning, bounded.text) == (None, result.text)


def test_the_dry_run_counts_the_prompt_that_reasoning_effort_renders(engine):
    counter = type(engine).prompt_counter(engine.config)
    for effort in (None, "none"):
        request = ask("Where is the harbour?", reasoning_effort=effort, max_new_tokens=2)
        (result,) = run(engine, request)
        assert counter.count(request) == result.usage.prompt_tokens
    assert counter.count(ask("x", reasoning_effort="none")) > counter.count(ask("x"))


def test_an_effort_the_template_cannot_take_is_refused_in_one_line(engine):
    (result,) = engine.generate([ask("Where is the harbour?", reasoning_effort="high")])
    assert not result.ok
    message = result.error.message
    assert "reasoning_effort 'high'" in message and MODELS[engine.name] in message
    assert "max_reasoning_tokens" in message and "\n" not in message


def test_streamed_thinking_comes_before_the_answer_and_joins_up_to_the_result(engine):
    request = ask("Where is the harbour?", max_reasoning_tokens=5, max_new_tokens=20)

    async def collect():
        return [item async for item in engine.stream(request)]

    items = asyncio.run(collect())
    result = items[-1]
    deltas = [item for item in items if isinstance(item, Delta)]
    kinds = [delta.reasoning for delta in deltas]
    assert kinds == sorted(kinds, reverse=True) and True in kinds and False in kinds
    assert "".join(d.text for d in deltas if d.reasoning) == result.reasoning
    assert "".join(d.text for d in deltas if not d.reasoning) == result.text
    assert result.usage.reasoning_tokens == 5


def test_earlier_turns_thinking_is_left_out_of_the_prompt(engine):
    turns = [
        Message("user", "Where is the harbour?"),
        Message("assistant", "Down the hill.", reasoning="SECRETPLAN"),
        Message("user", "And the ship?"),
    ]
    request = Request("turns", turns, GenerationParams(max_reasoning_tokens=3))
    (result,) = run(engine, request)
    assert result.usage.reasoning_tokens == 3 and result.text
    prompt = (
        engine.render(request)
        if engine.name == "LLAMACPP"
        else engine.hf_tokenizer.decode(engine.encode(request))
    )
    assert "Down the hill." in prompt and "SECRETPLAN" not in prompt


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 8}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


def test_a_required_tool_call_is_read_from_the_answer_after_the_thinking(engine):
    if engine.name == "NATIVE":
        pytest.skip("tiny:think's 512-token context cannot hold the tools' instruction")
    params = GenerationParams(max_new_tokens=160, max_reasoning_tokens=5, tool_choice="required")
    request = Request("tool", [Message("user", "Weather in Oslo?")], params, tools=[WEATHER])
    (result,) = run(engine, request)
    sample = result.samples[0]
    assert sample.finish_reason == "tool_calls" and sample.text == ""
    [call] = sample.tool_calls
    assert call.name == "get_weather"
    jsonschema.validate(json.loads(call.arguments), WEATHER["function"]["parameters"])
    assert sample.reasoning and sample.reasoning_tokens == 5


@pytest.mark.parametrize("name", list(MODELS))
def test_harmony_channels_under_a_grammar_are_opened_closed_and_read_by_the_engine(name):
    """model.reasoning_parser: openai_gptoss on a model whose template opens no block: under a
    grammar the engine writes the analysis header, closes the thinking with the final
    channel's header at the budget, and the JSON follows; the channels' marks stay out of
    both parts."""
    engine = create_engine(load_config(None, {
        "engine": name, "model.model_name": MODELS[name], "generation.batch_size": 2,
        "model.reasoning_parser": "openai_gptoss",
    }))  # fmt: skip
    try:
        guided = {"json": SCHEMA, "disable_any_whitespace": True}
        request = ask("Give a city as JSON.", max_reasoning_tokens=3, max_new_tokens=200,
                      guided_decoding=guided)  # fmt: skip
        (result,) = run(engine, request)
        assert check_structure(request, result).ok
        jsonschema.validate(json.loads(result.text), SCHEMA)
        assert result.usage.reasoning_tokens == 3 and result.reasoning
        assert "<|" not in result.reasoning and "<|" not in result.text
        # without a grammar the reply may open the channel itself; this one answers at once
        (plain,) = run(engine, ask("Give a city.", max_new_tokens=8))
        assert plain.reasoning is None and plain.usage.reasoning_tokens == 0
    finally:
        asyncio.run(engine.aclose())


@pytest.mark.parametrize("name", list(MODELS))
def test_the_recipes_enable_thinking_false_gives_answers_without_thinking(name):
    engine = create_engine(load_config(None, {
        "engine": name, "model.model_name": MODELS[name], "generation.batch_size": 2,
        "model.chat_template_kwargs": {"enable_thinking": False},
    }))  # fmt: skip
    try:
        (result,) = run(engine, ask("Where is the harbour?", max_new_tokens=8))
        assert result.reasoning is None and result.usage.reasoning_tokens == 0
        assert result.text and result.usage.completion_tokens == 8
    finally:
        asyncio.run(engine.aclose())


def test_reasoning_parser_none_leaves_the_reply_whole():
    engine = create_engine(load_config(None, {
        "engine": "LLAMACPP", "model.model_name": "tiny-gguf:think", "generation.batch_size": 2,
        "model.reasoning_parser": "none",
    }))  # fmt: skip
    try:
        (result,) = run(engine, ask("Where is the harbour?", max_new_tokens=8))
        assert result.reasoning is None and result.usage.reasoning_tokens == 0
        assert len(result.text) > 0
        (refused,) = engine.generate([ask("Where is the harbour?", max_reasoning_tokens=2)])
        assert not refused.ok and "reasoning_parser is none" in refused.error.message
    finally:
        asyncio.run(engine.aclose())


def test_a_reasoning_parser_outside_the_list_fails_the_load_in_one_line():
    with pytest.raises(ConfigError, match="^model.reasoning_parser 'r1' is not one of [^\n]*$"):
        create_engine(load_config(None, {
            "engine": "LLAMACPP", "model.model_name": "tiny-gguf:think",
            "model.reasoning_parser": "r1",
        }))  # fmt: skip


def test_a_budget_on_a_model_that_does_not_think_is_refused_in_one_line():
    engine = create_engine(load_config(None, {
        "engine": "LLAMACPP", "model.model_name": "tiny-gguf:gpt2", "generation.batch_size": 2,
    }))  # fmt: skip
    try:
        (result,) = engine.generate([ask("Hello there", max_reasoning_tokens=4)])
        assert not result.ok and "max_reasoning_tokens" in result.error.message
        assert (
            "tiny-gguf:gpt2" in result.error.message and "reasoning_parser" in result.error.message
        )
        (plain,) = run(engine, ask("Hello there", max_new_tokens=4))
        assert plain.reasoning is None and plain.text
    finally:
        asyncio.run(engine.aclose())


@pytest.mark.parametrize(
    ("model", "setting", "says"),
    [
        ("tiny-gguf:gpt2", {"generation.max_reasoning_tokens": 4}, "does not think"),
        ("tiny-gguf:think", {"generation.reasoning_effort": "high"}, "reads no reasoning_effort"),
    ],
)
def test_a_recipe_setting_no_row_could_take_fails_the_load_in_one_line(model, setting, says):
    config = load_config(None, {"engine": "LLAMACPP", "model.model_name": model, **setting})
    with pytest.raises(ConfigError, match=f"^[^\n]*{says}[^\n]*$"):
        create_engine(config)
