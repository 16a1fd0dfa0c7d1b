"""The scoring cases test_smollm2.py asks of raw vLLM beside its other cases (so that they cost
no engine start of their own), and how lmpress's prompt logprobs are held against vLLM's.

vLLM's side is always `LLM.generate` with `prompt_logprobs` in SamplingParams written here by
hand; it generates at least one token (it refuses max_tokens 0), which lmpress's side drops
where it asks for none.
"""

from __future__ import annotations

import pytest

from lmpress.vocabulary.likelihood import encode_pair

TEXT = "The capital of France is Paris. It is known for"
TOP = 3  # likeliest alternatives asked at each prompt position
# A multiple-choice question as lm-eval scores one: each choice a continuation of the context.
CONTEXT = "Question: What is the capital of France?\nAnswer:"
CHOICES = [" Berlin", " Paris", " London", " Madrid"]


def choice_tokens(model_dir: str) -> tuple[list[int], list[list[int]]]:
    """The context's and each choice's token ids, split as lm-eval splits them, by the model's
    own tokenizer (transformers, as vLLM loads it)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    pairs = [
        encode_pair(
            lambda text: tokenizer.encode(text, add_special_tokens=False),
            CONTEXT,
            choice,
            tokenizer.eos_token_id,
        )
        for choice in CHOICES
    ]
    assert all(context == pairs[0][0] for context, _ in pairs)
    return pairs[0][0], [choice for _, choice in pairs]


def raw_cases(context: list[int], choices: list[list[int]]) -> list[dict]:
    """vLLM's cases: TEXT scored with TOP alternatives; TEXT scored while 8 tokens are
    generated with their logprobs; then each choice after the context, by token ids."""
    scored = {"temperature": 0, "max_tokens": 1, "prompt_logprobs": TOP}
    generating = {"temperature": 0, "max_tokens": 8, "logprobs": 3, "prompt_logprobs": TOP}
    choice = {"temperature": 0, "max_tokens": 1, "prompt_logprobs": 1}
    return [
        {"prompt": TEXT, "sampling": scored},
        {"prompt": TEXT, "sampling": generating},
        *({"prompt": {"prompt_token_ids": context + c}, "sampling": choice} for c in choices),
    ]


def listed(position: list) -> dict[int, tuple[float, int, str]]:
    """One of raw vLLM's prompt positions: token id -> (logprob, rank, decoded token)."""
    return {token: (logprob, rank, text) for token, logprob, rank, text in position}


def assert_prompt_logprobs(result, raw: dict, top: int) -> None:
    """lmpress's prompt logprobs are vLLM's: the same prompt ids, None first, then at each
    position the prompt token (its text, id and logprob within 1e-3) and the `top` likeliest
    by vLLM's rank, most likely first."""
    ids = raw["prompt_token_ids"]
    assert result.ok, result.error
    assert result.prompt_ids == ids
    assert len(result.prompt_logprobs) == len(ids)
    assert result.prompt_logprobs[0] is None and raw["prompt_logprobs"][0] is None
    for ours, position, token in zip(
        result.prompt_logprobs[1:], raw["prompt_logprobs"][1:], ids[1:], strict=True
    ):
        theirs = listed(position)
        assert (ours.id, ours.token) == (token, theirs[token][2])
        assert ours.logprob == pytest.approx(theirs[token][0], abs=1e-3)
        ranked = sorted((i for i in theirs if theirs[i][1] <= top), key=lambda i: theirs[i][1])
        assert ours.top_ids == ranked
        assert [t for t, _ in ours.top] == [theirs[i][2] for i in ranked]
        assert [lp for _, lp in ours.top] == pytest.approx([theirs[i][0] for i in ranked], abs=1e-3)


def raw_choice_score(raw: dict, context_length: int) -> tuple[float, bool]:
    """A choice's summed logprob and greedy flag (every token of rank 1) by vLLM's numbers."""
    ids = raw["prompt_token_ids"]
    positions = range(context_length, len(ids))
    chosen = [listed(raw["prompt_logprobs"][i])[ids[i]] for i in positions]
    return sum(logprob for logprob, _, _ in chosen), all(rank == 1 for _, rank, _ in chosen)


# `/v1/completions` bodies as lm-eval's `local-completions` sends them to score a prompt (echo
# with logprobs, nothing generated), and with a short reply after the echo; "model" is added.
ECHO_BODIES = [
    {"prompt": TEXT, "echo": True, "logprobs": 2, "max_tokens": 0, "temperature": 0},
    {"prompt": [504, 3575, 282, 4649], "echo": True, "logprobs": 1, "max_tokens": 0},
    {"prompt": TEXT, "echo": True, "logprobs": 2, "max_tokens": 4, "temperature": 0},
]


def assert_same_echo(ours: dict, theirs: dict) -> None:
    """lmpress serve's completion is vLLM's in what an evaluator reads: each choice's text,
    finish reason and logprobs, the same keys with values of the same types, the same tokens
    and offsets, and logprobs within 1e-3 (null where vLLM writes null)."""
    assert ours["object"] == theirs["object"] == "text_completion"
    assert ours["usage"]["prompt_tokens"] == theirs["usage"]["prompt_tokens"]
    assert len(ours["choices"]) == len(theirs["choices"])
    for mine, vllm in zip(ours["choices"], theirs["choices"], strict=True):
        assert (mine["text"], mine["finish_reason"]) == (vllm["text"], vllm["finish_reason"])
        a, b = mine["logprobs"], vllm["logprobs"]
        assert set(a) == set(b) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
        assert (a["tokens"], a["text_offset"]) == (b["tokens"], b["text_offset"])
        assert [x is None for x in a["token_logprobs"]] == [x is None for x in b["token_logprobs"]]
        assert [x for x in a["token_logprobs"] if x is not None] == pytest.approx(
            [x for x in b["token_logprobs"] if x is not None], abs=1e-3
        )
        assert [x is None for x in a["top_logprobs"]] == [x is None for x in b["top_logprobs"]]
        for top, expected in zip(a["top_logprobs"], b["top_logprobs"], strict=True):
            if expected is not None:
                assert list(top) == list(expected)  # most likely first, as vLLM orders them
                assert list(top.values()) == pytest.approx(list(expected.values()), abs=1e-3)
