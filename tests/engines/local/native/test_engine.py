"""The NATIVE engine on tiny real transformers models (Llama + byte-level BPE, GPT-2 + Unigram)."""

from __future__ import annotations

import asyncio

import pytest

from lmpress.configs import load_config
from lmpress.engines.registry import create_engine
from lmpress.vocabulary.errors import ModelLoadError, UnsupportedParamError
from lmpress.vocabulary.types import Delta, GenerationParams, Message, Request, Result

PROMPTS = [("word " * (i % 7 + 1)) + f"question {i}?" for i in range(12)]


def make(model: str, **overrides):
    gen = {"max_new_tokens": 12, **overrides}
    return create_engine(
        load_config(
            overrides={"model.model_name": model, **{f"generation.{k}": v for k, v in gen.items()}}
        )
    )


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def engine(request):
    eng = make(f"tiny:{request.param}", batch_size=4)
    yield eng
    asyncio.run(eng.aclose())


@pytest.fixture(scope="module")
def llama(tiny_llama):
    eng = make(tiny_llama, batch_size=4)
    yield eng
    asyncio.run(eng.aclose())


def test_greedy_replies_depend_on_the_prompt_and_repeat(engine):
    first = [r.text for r in engine.generate(PROMPTS)]
    again = [r.text for r in engine.generate(PROMPTS)]
    assert first == again
    assert (
        len(set(first)) > len(PROMPTS) // 2
    )  # a random model still answers each prompt its own way


def test_greedy_is_the_same_at_any_batch_size(tiny_gpt2):
    one = make(tiny_gpt2, batch_size=1)
    many = make(tiny_gpt2, batch_size=8)
    try:
        assert [r.text for r in one.generate(PROMPTS)] == [r.text for r in many.generate(PROMPTS)]
    finally:
        asyncio.run(one.aclose())
        asyncio.run(many.aclose())


def test_usage_and_length_finish(engine):
    # min_tokens holds the end-of-sequence token back for all 5: a random model may pick it
    # at any step (a fresh run's tiny GPT-2 did at the 5th), and a reply that ends on it has
    # stopped, not been cut, so only a reply that cannot end early is sure to be cut.
    params = GenerationParams(max_new_tokens=5, min_tokens=5, stop_token_ids=[])
    result = engine.generate(["Tell me everything."], params)[0]
    assert result.ok
    assert result.usage.prompt_tokens > 3
    assert result.usage.completion_tokens == 5
    assert result.finish_reason == "length"


def test_seeded_sampling_is_reproducible_per_row(llama):
    params = GenerationParams(max_new_tokens=10, temperature=1.0, top_p=0.95, top_k=40, seed=11)
    alone = llama.generate(["Pick a word."], params)[0].text
    with_others = llama.generate(["Pick a word.", "Something else", "And more"], params)[0].text
    assert alone == with_others
    other_seed = llama.generate(["Pick a word."], params.replace(seed=12))[0].text
    unseeded = {r.text for r in llama.generate(["Pick a word."] * 4, params.replace(seed=None))}
    assert other_seed != alone or len(unseeded) > 1


def test_n_samples(llama):
    result = llama.generate(
        ["Name a colour."], GenerationParams(max_new_tokens=8, temperature=1.0, n=3, seed=1)
    )[0]
    assert len(result.samples) == 3
    assert len({s.text for s in result.samples}) > 1
    assert result.usage.completion_tokens == sum(s.completion_tokens for s in result.samples)


def test_stop_strings_cut_the_reply(llama):
    free = llama.generate(["Why is the sky blue?"], GenerationParams(max_new_tokens=24))[0].text
    stop = free[3:5]
    assert stop.strip(), f"reply too short to pick a stop string from: {free!r}"
    stopped = llama.generate(
        ["Why is the sky blue?"], GenerationParams(max_new_tokens=24, stop_strings=[stop])
    )[0]
    assert stopped.finish_reason == "stop"
    assert stopped.text == free[: free.index(stop)]
    # The sample names the stop string that ended it (the earliest, among several).
    assert stopped.samples[0].stop_sequence == stop
    both = llama.generate(
        ["Why is the sky blue?"],
        GenerationParams(max_new_tokens=24, stop_strings=[free[6:8], stop, "never"]),
    )[0]
    assert both.text == stopped.text and both.samples[0].stop_sequence == stop


def test_no_stop_string_names_none(llama, tiny_llama):
    from transformers import AutoTokenizer

    # Ended by the length limit, with a stop string that never appears.
    params = GenerationParams(max_new_tokens=4, stop_strings=["\x00never"])
    result = llama.generate(["Why is the sky blue?"], params)[0]
    assert result.finish_reason == "length" and result.samples[0].stop_sequence is None
    # Ended by a stop token (every token is one here): "stop", but no string named.
    every = list(range(len(AutoTokenizer.from_pretrained(tiny_llama))))
    result = llama.generate(["Why is the sky blue?"], params.replace(stop_token_ids=every))[0]
    assert result.finish_reason == "stop" and result.text == ""
    assert result.samples[0].stop_sequence is None


def test_streamed_deltas_add_up_to_the_reply(engine):
    async def run():
        request = Request(
            "s", [Message("user", "Stream this please")], GenerationParams(max_new_tokens=16)
        )
        deltas, final = [], None
        async for item in engine.stream(request):
            if isinstance(item, Delta):
                deltas.append(item.text)
            else:
                final = item
        return deltas, final

    deltas, final = asyncio.run(run())
    assert isinstance(final, Result) and final.ok
    assert len(deltas) > 1
    assert "".join(deltas) == final.text


def test_logprobs(llama):
    result = llama.generate(
        ["hi"], GenerationParams(max_new_tokens=4, logprobs=True, top_logprobs=3)
    )[0]
    logprobs = result.samples[0].logprobs
    assert logprobs is not None and len(logprobs) == result.usage.completion_tokens
    for entry in logprobs:
        assert entry.logprob <= 0
        assert len(entry.top) == 3
        assert entry.top[0][1] >= entry.logprob  # the best alternative is at least as likely


def test_min_tokens_holds_off_the_end(llama):
    result = llama.generate(["hi"], GenerationParams(max_new_tokens=30, min_tokens=30))[0]
    assert result.usage.completion_tokens == 30


def test_invalid_utf8_tokens_become_replacement_characters(tiny_llama):
    # Byte-level BPE emits raw bytes; a random model strings them together into broken UTF-8.
    eng = make(tiny_llama, batch_size=8)
    try:
        texts = [
            r.text
            for r in eng.generate(
                [f"bytes {i}" for i in range(16)], GenerationParams(max_new_tokens=32)
            )
        ]
    finally:
        asyncio.run(eng.aclose())
    assert any("\ufffd" in t for t in texts)
    for text in texts:
        text.encode("utf-8")  # always valid text


def test_raw_prompt_skips_the_chat_template(llama):
    result = llama.generate(
        [Request("raw", [], GenerationParams(max_new_tokens=4), prompt="Once upon")]
    )[0]
    assert result.ok


def test_image_parts_fail_the_row_not_the_engine(llama):
    from lmpress.vocabulary.types import ContentPart

    image = Message("user", [ContentPart("image_url", image_url="file:///x.png")])
    results = llama.generate([Request("img", [image], GenerationParams(max_new_tokens=4)), "fine"])
    assert results[0].error is not None and "text only" in results[0].error.message
    assert results[1].ok


def test_prompt_longer_than_the_context_fails_that_row(llama):
    results = llama.generate(["word " * 2000, "short"], GenerationParams(max_new_tokens=4))
    assert results[0].error is not None
    assert results[0].error.kind == "context_length_exceeded"
    assert results[1].ok


def test_chat_template_override(tiny_llama):
    eng = create_engine(load_config(overrides={
        "model.model_name": tiny_llama,
        "model.chat_template": "{% for m in messages %}{{ m['content'] }}{% endfor %}",
        "generation.max_new_tokens": 4,
    }))  # fmt: skip
    try:
        assert (
            eng.encode(Request("t", [Message("user", "abc")]))
            == eng.hf_tokenizer("abc", add_special_tokens=False)["input_ids"]
        )
    finally:
        asyncio.run(eng.aclose())


def test_unsupported_param_is_refused_before_loading():
    with pytest.raises(UnsupportedParamError, match=r"NATIVE does not support generation.logit"):
        create_engine(
            load_config(
                overrides={"model.model_name": "tiny:llama", "generation.logit_bias": {"5": 1}}
            )
        )


def test_missing_model_path():
    with pytest.raises(ModelLoadError, match="'./no/such/model' does not exist"):
        create_engine(load_config(overrides={"model.model_name": "./no/such/model"}))


def test_a_row_stops_where_the_context_ends(llama):
    result = llama.generate(["hi"], GenerationParams(max_new_tokens=5000, min_tokens=5000))[0]
    assert result.ok and result.finish_reason == "length"
    assert result.usage.prompt_tokens + result.usage.completion_tokens == llama.context_length
