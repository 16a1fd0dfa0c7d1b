"""/v1/completions: raw text in, no chat template, through the official openai client."""

from __future__ import annotations

import asyncio
import json

import openai
import pytest

MODEL = "tiny-llama"


def test_completion_replies_in_openai_shape(llama_server):
    reply = llama_server.client().completions.create(
        model=MODEL, prompt="The cat sat on the", max_tokens=6
    )
    assert reply.id.startswith("cmpl-")
    assert reply.object == "text_completion"
    [choice] = reply.choices
    assert isinstance(choice.text, str)
    assert choice.finish_reason in ("stop", "length")
    assert reply.usage.prompt_tokens > 0
    assert 0 < reply.usage.completion_tokens <= 6


def test_the_raw_prompt_reaches_the_engine_without_a_chat_template(echo_server):
    reply = echo_server.client().completions.create(model="echo-model", prompt="one two three")
    assert reply.choices[0].text == "ECHO " + json.dumps("one two three")


def test_a_list_of_prompts_gives_n_choices_per_prompt_in_order(echo_server):
    reply = echo_server.client().completions.create(
        model="echo-model", prompt=["first prompt", "second prompt"], n=2
    )
    assert [c.index for c in reply.choices] == [0, 1, 2, 3]
    texts = [c.text for c in reply.choices]
    assert texts == ['ECHO "first prompt"'] * 2 + ['ECHO "second prompt"'] * 2


def test_streamed_completion_with_usage(llama_server):
    client = llama_server.client()
    whole = client.completions.create(model=MODEL, prompt="The cat sat on the", max_tokens=6)
    chunks = list(
        client.completions.create(
            model=MODEL,
            prompt="The cat sat on the",
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == (
        whole.choices[0].finish_reason
    )
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_streamed_list_of_prompts_keeps_choices_apart(echo_server):
    chunks = list(
        echo_server.client().completions.create(
            model="echo-model", prompt=["a b c", "d e f"], stream=True
        )
    )
    texts: dict[int, str] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
    assert texts == {0: 'ECHO "a b c"', 1: 'ECHO "d e f"'}


def test_echo_puts_the_prompt_before_the_reply(echo_server):
    client = echo_server.client()
    reply = client.completions.create(model="echo-model", prompt="hello", echo=True)
    assert reply.choices[0].text == 'helloECHO "hello"'
    chunks = list(
        client.completions.create(model="echo-model", prompt="hello", echo=True, stream=True)
    )
    assert "".join(c.choices[0].text for c in chunks) == 'helloECHO "hello"'


def test_logprobs_in_the_completions_shape(llama_server):
    reply = llama_server.client().completions.create(
        model=MODEL, prompt="The cat", max_tokens=4, logprobs=2
    )
    logprobs = reply.choices[0].logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == reply.usage.completion_tokens
    assert all(1 <= len(top) <= 2 for top in logprobs.top_logprobs)  # tokens may decode alike
    assert all(lp <= 0 for lp in logprobs.token_logprobs)
    assert logprobs.text_offset == sorted(logprobs.text_offset)


def beams_of(model_dir: str, prompt: str, beams: int, n: int) -> list[str]:
    """transformers' `generate(num_beams=beams, num_return_sequences=n)` replies to a raw
    prompt, best first."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids, max_new_tokens=8, do_sample=False, num_beams=beams,
            num_return_sequences=n,
        )  # fmt: skip
    return [tokenizer.decode(o[ids.shape[1] :], skip_special_tokens=True) for o in out]


def test_use_beam_search_returns_the_best_n_of_best_of_beams_as_transformers_does(
    llama_server, tiny_llama
):
    """vLLM's body: `use_beam_search` with `best_of` beams and the best `n` back, equal to
    transformers' `generate(num_beams=best_of, num_return_sequences=n)`."""
    client = llama_server.client()
    prompt, beams = "The cat sat on the", {"use_beam_search": True, "best_of": 4}
    reply = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=8, n=2, extra_body=beams
    )
    expected = beams_of(tiny_llama, prompt, 4, 2)
    assert [c.text for c in reply.choices] == expected
    assert len(set(expected)) == 2
    # Streamed, each beam's text comes whole when the search ends.
    chunks = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=8, n=2, extra_body=beams, stream=True
    )
    streamed = ["", ""]
    for chunk in chunks:
        for choice in chunk.choices:
            streamed[choice.index] += choice.text
    assert streamed == expected
    # best_of fewer than n is refused, as is best_of without beams.
    for extra in ({"use_beam_search": True, "best_of": 1}, {"best_of": 4}):
        with pytest.raises(openai.BadRequestError, match="best_of"):
            client.completions.create(model=MODEL, prompt=prompt, n=2, extra_body=extra)


def test_remote_vllm_searches_beams_on_a_vllm_server_and_keeps_the_best_n(llama_server, tiny_llama):
    """REMOTE_VLLM sends generation.num_beams as vLLM's server takes it (`use_beam_search` with
    `n` beams, every one answered best first), through the SDK, and keeps the best
    generation.n: what transformers' beam search gives, streamed or not (a streamed raw
    prompt is asked without streaming: vLLM's /completions answers a beam search whole)."""
    from lmpress.configs import load_config
    from lmpress.engines.registry import create_engine
    from lmpress.vocabulary.types import Delta, GenerationParams, Request

    prompt = "The cat sat on the"
    engine = create_engine(load_config(overrides={
        "engine": "REMOTE_VLLM", "model.model_name": MODEL,
        "remote_params.api_url": f"{llama_server.url}/v1",
    }))  # fmt: skip
    params = GenerationParams(max_new_tokens=8, num_beams=4, n=2)
    try:
        [result] = engine.generate([Request("b", [], params, prompt=prompt)])
        assert result.error is None, result.error
        expected = beams_of(tiny_llama, prompt, 4, 2)
        assert [s.text for s in result.samples] == expected

        async def streamed() -> list[str]:
            texts = ["", ""]
            async for item in engine.stream(Request("s", [], params, prompt=prompt)):
                if isinstance(item, Delta):
                    texts[item.index] += item.text  # a third beam's index would raise
            return texts

        assert asyncio.run(streamed()) == expected
        [too_many] = engine.generate([Request("c", [], params.replace(n=5), prompt=prompt)])
        assert too_many.error.message == (
            "generation.n 5 is more than generation.num_beams 4: n returns beams"
        )
    finally:
        asyncio.run(engine.aclose())
