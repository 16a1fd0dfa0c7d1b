"""A prompt's logprobs on the wire (`wire/openai/prompt_logprobs.py`, and the bodies that ask for
them): the legacy echo shape and vLLM's `prompt_logprobs` as clients read them, the body a
remote engine sends for them, and the reply it reads back into the Result it was given."""

from __future__ import annotations

import json

import pytest
from openai.types import Completion

from lmpress.engines.base import check_params
from lmpress.engines.remote.base import check_prompt_ids
from lmpress.engines.remote.presets import engine_class
from lmpress.vocabulary.errors import RequestError, UnsupportedParamError
from lmpress.vocabulary.types import (
    GenerationParams,
    Message,
    Request,
    Result,
    Sample,
    TokenLogprob,
    Usage,
)
from lmpress.wire.openai import requests
from lmpress.wire.openai.client import Dialect, request_body
from lmpress.wire.openai.errors import ApiError
from lmpress.wire.openai.prompt_logprobs import Echo, echo_of, read_scored
from lmpress.wire.openai.replies import parse_chat_completion
from lmpress.wire.openai.responses import chat_completion, text_completion
from tests.servers.request_types import VLLM_EXTENSIONS, body_problem
from tests.wire.openai.vllm_shapes import VllmChatResponse, VllmCompletionResponse

# "The cat sat" as ids 7, 8, 9, then one generated token, " down" (id 10). Position 1's token
# (8) was the likeliest there; position 2's (9) was not (id 11 was).
PROMPT_IDS = [7, 8, 9]
SCORED = [
    None,
    TokenLogprob(" cat", -1.5, [(" cat", -1.5)], 8, [8]),
    TokenLogprob(" sat", -3.0, [(" ran", -0.5)], 9, [11]),
]
DOWN = TokenLogprob(" down", -0.25, [(" down", -0.25)], 10, [10])


class Pieces:
    """A tokenizer of four words, as `Tokenizer` says one (a real one is the engines')."""

    bos_id, eos_id, context_length = None, 0, 8
    words = {7: "The", 8: " cat", 9: " sat", 10: " down"}

    def encode(self, text: str, special: bool = False) -> list[int]:
        raise NotImplementedError  # echoes never encode

    def decode(self, ids: list[int]) -> str:
        return "".join(self.pieces(ids))

    def pieces(self, ids: list[int]) -> list[str]:
        return [self.words[i] for i in ids]


def scored_result(generated: list[TokenLogprob] | None) -> Result:
    text = "".join(t.token for t in generated or ())
    sample = Sample(text, "length", generated)
    return Result("r", [sample], Usage(3, len(generated or ())), prompt_logprobs=SCORED,
                  prompt_ids=PROMPT_IDS)  # fmt: skip


@pytest.mark.parametrize("prompt", ["The cat sat", PROMPT_IDS])
def test_echo_with_logprobs_is_the_legacy_shape_prompt_first(prompt):
    """What lm-eval's local-completions reads: the prompt's tokens, null first, then the reply's;
    each alternatives dict holds the token itself and the likeliest."""
    result = scored_result([DOWN])
    echo = echo_of(prompt, result, Pieces(), logprobs=True)
    body = text_completion("c", 1, "m", [result], [echo])
    choice = VllmCompletionResponse.model_validate(body).choices[0]
    assert choice.text == "The cat sat down"
    assert choice.logprobs.tokens == ["The", " cat", " sat", " down"]
    assert choice.logprobs.token_logprobs == [None, -1.5, -3.0, -0.25]
    assert choice.logprobs.top_logprobs == [
        None, {" cat": -1.5}, {" sat": -3.0, " ran": -0.5}, {" down": -0.25},
    ]  # fmt: skip
    assert choice.logprobs.text_offset == [0, 3, 7, 11]
    # the official client reads it (it does not validate a reply)
    assert Completion.construct(**body).choices[0].logprobs.token_logprobs[:2] == [None, -1.5]
    # lm-eval's reading: the continuation " sat" after "The cat" is not greedy
    logprobs = body["choices"][0]["logprobs"]
    pairs = zip(logprobs["token_logprobs"][1:], logprobs["top_logprobs"][1:], strict=True)
    assert [lp == max(top.values()) for lp, top in pairs] == [True, False, True]


def test_max_tokens_zero_echoes_only_the_prompt():
    result = scored_result([])
    body = text_completion("c", 1, "m", [result], [echo_of("The cat sat", result, None, True)])
    choice = VllmCompletionResponse.model_validate(body).choices[0]
    assert choice.text == "The cat sat"
    # without a tokenizer the first token's text is what the others leave of the prompt
    assert choice.logprobs.tokens == ["The", " cat", " sat"]
    assert choice.logprobs.token_logprobs == [None, -1.5, -3.0]


def test_vllm_prompt_logprobs_key_each_position_by_token_id():
    result = scored_result([DOWN])
    body = text_completion("c", 1, "m", [result], [Echo()])
    VllmCompletionResponse.model_validate(body)
    assert body["choices"][0]["prompt_logprobs"] == [
        None,
        {"8": {"logprob": -1.5, "rank": 1, "decoded_token": " cat"}},
        {"9": {"logprob": -3.0, "rank": None, "decoded_token": " sat"},
         "11": {"logprob": -0.5, "rank": 1, "decoded_token": " ran"}},
    ]  # fmt: skip
    assert body["choices"][0]["text"] == " down"  # no echo: the reply alone
    assert body["choices"][0]["logprobs"] is not None
    chat = chat_completion("c", 1, "m", result)
    VllmChatResponse.model_validate(chat)
    assert chat["prompt_logprobs"] == body["choices"][0]["prompt_logprobs"]


def test_minus_infinity_is_written_as_openai_writes_it():
    ruled_out = TokenLogprob(" sat", float("-inf"), [(" ran", -0.5)], 9, [11])
    result = Result("r", [Sample("", "length", [])], prompt_logprobs=[None, ruled_out],
                    prompt_ids=[7, 9])  # fmt: skip
    body = text_completion("c", 1, "m", [result], [echo_of([7, 9], result, Pieces(), True)])
    json.dumps(body, allow_nan=False)
    assert body["choices"][0]["logprobs"]["token_logprobs"] == [None, -9999.0]


# --- the bodies that ask -----------------------------------------------------------------


def completion(**body) -> requests.Sampling:
    return requests.completion_sampling(requests.CompletionBody.model_validate(body))


def test_echo_with_logprobs_asks_for_the_prompts_logprobs():
    sampling = completion(prompt="x", echo=True, logprobs=1, max_tokens=0)
    assert sampling.overrides["prompt_logprobs"] == 1
    assert sampling.overrides["max_new_tokens"] == 0
    assert sampling.source["prompt_logprobs"] == "echo"
    assert "prompt_logprobs" not in completion(prompt="x", echo=True).overrides
    assert completion(prompt="x", prompt_logprobs=3).overrides["prompt_logprobs"] == 3


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ({"echo": True, "logprobs": 1, "stream": True}, "'echo' with logprobs is not available"),
        ({"prompt_logprobs": 2, "stream": True}, "'prompt_logprobs' with logprobs is not"),
        ({"prompt_logprobs": 21}, "'prompt_logprobs' must be in [0, 20]"),
    ],
)
def test_prompt_logprobs_refusals_are_one_line(body, said):
    with pytest.raises(ApiError) as caught:
        completion(prompt="x", **body)
    assert said in caught.value.message and "\n" not in caught.value.message


@pytest.mark.parametrize(
    ("prompt", "prompts"),
    [
        ("text", ["text"]),
        ([1, 2, 3], [[1, 2, 3]]),
        ([[1, 2], [3]], [[1, 2], [3]]),
        (["a", [4, 5]], ["a", [4, 5]]),
    ],
)
def test_prompts_may_be_token_ids_or_lists_of_either(prompt, prompts):
    body = requests.CompletionBody.model_validate({"prompt": prompt})
    assert requests.completion_prompts(body) == prompts


@pytest.mark.parametrize(
    ("prompt", "said"),
    [
        ([], "must be a string, a list of token ids, or a non-empty list of either"),
        ([[1, -2]], "item 0: neither a text nor a list of token ids"),
        ([[]], "item 0: neither a text nor a list of token ids"),
        ([True], "item 0: neither"),
        ("", "'prompt' is empty"),
    ],
)
def test_bad_prompts_are_named(prompt, said):
    body = requests.CompletionBody.model_validate({"prompt": prompt})
    with pytest.raises(ApiError) as caught:
        requests.completion_prompts(body)
    assert said in caught.value.message


# --- a remote engine: the body it sends, the reply it reads ---------------------------------


def scoring_request(**params) -> Request:
    p = GenerationParams(max_new_tokens=0, prompt_logprobs=1, **params)
    return Request("r", [], p, prompt_ids=PROMPT_IDS, score_from=2)


def test_a_scoring_request_goes_as_an_echo_of_token_ids():
    body = request_body(scoring_request(), "m", Dialect())
    assert body["prompt"] == PROMPT_IDS and body["max_tokens"] == 0
    assert body["echo"] is True and body["logprobs"] == 1
    assert body_problem(body, "completions") is None
    chat = Request("c", [Message("user", "hi")], GenerationParams(prompt_logprobs=2))
    chat_body = request_body(chat, "m", Dialect())
    assert chat_body["prompt_logprobs"] == 2 and "echo" not in chat_body
    assert body_problem(chat_body, "chat", VLLM_EXTENSIONS) is None


@pytest.mark.parametrize("vllm_field", [True, False])
def test_the_reply_reads_back_into_the_scores_that_were_sent(vllm_field):
    """What serve answers, read by the REMOTE engine: with vLLM's prompt_logprobs (ids), or from
    the legacy echo alone (an older server): the same logprobs and greedy flags either way."""
    result = scored_result([DOWN])
    data = text_completion("c", 1, "m", [result], [echo_of(PROMPT_IDS, result, Pieces(), True)])
    if not vllm_field:
        del data["choices"][0]["prompt_logprobs"]
    request = scoring_request(logprobs=True, top_logprobs=1)
    reply = read_scored(data, request, parse_chat_completion(data))
    got = reply.prompt_logprobs
    assert got[0] is None
    assert [(t.token, t.logprob, t.is_top) for t in got[1:]] == [
        (" cat", -1.5, True), (" sat", -3.0, False),
    ]  # fmt: skip
    assert reply.prompt_ids == PROMPT_IDS
    assert reply.samples[0].text == " down"  # the echoed prompt is not the reply's
    assert [(t.token, t.logprob) for t in reply.samples[0].logprobs] == [(" down", -0.25)]


def test_a_text_prompt_echo_is_cut_off_the_reply():
    result = scored_result([DOWN])
    data = text_completion("c", 1, "m", [result], [echo_of("The cat sat", result, None, True)])
    del data["choices"][0]["prompt_logprobs"]
    request = Request("r", [], GenerationParams(prompt_logprobs=1), prompt="The cat sat")
    reply = read_scored(data, request, parse_chat_completion(data))
    assert reply.samples[0].text == " down"
    assert len(reply.prompt_logprobs) == 3  # the usage's prompt tokens


def test_providers_that_cannot_score_refuse_in_one_line():
    openai = engine_class("OPENAI")
    with pytest.raises(UnsupportedParamError, match="generation.prompt_logprobs") as caught:
        check_params(openai, GenerationParams(prompt_logprobs=1))
    assert "\n" not in str(caught.value)
    with pytest.raises(RequestError, match="takes prompts as text, not token ids"):
        check_prompt_ids(openai, scoring_request())
    for name in ("REMOTE", "REMOTE_VLLM", "SGLANG"):
        check_params(engine_class(name), GenerationParams(prompt_logprobs=1))
        check_prompt_ids(engine_class(name), scoring_request())
