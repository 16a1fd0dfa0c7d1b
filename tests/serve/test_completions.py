"""/v1/completions: raw text in, no chat template, through the official openai client."""

from __future__ import annotations

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


def test_use_beam_search_returns_the_best_n_of_best_of_beams_as_transformers_does(
    llama_server, tiny_llama
):
    """vLLM's body: `use_beam_search` with `best_of` beams and the best `n` back, equal to
    transformers' `generate(num_beams=best_of, num_return_sequences=n)`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    client = llama_server.client()
    prompt, beams = "The cat sat on the", {"use_beam_search": True, "best_of": 4}
    reply = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=8, n=2, extra_body=beams
    )
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama)
    model = AutoModelForCausalLM.from_pretrained(tiny_llama)
    ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids, max_new_tokens=8, do_sample=False, num_beams=4,
            num_return_sequences=2,
        )  # fmt: skip
    expected = [tokenizer.decode(o[ids.shape[1] :], skip_special_tokens=True) for o in out]
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
