"""`lmpress serve` scores prompts as vLLM answers and lm-eval reads: `/v1/completions` with
`echo`, `logprobs` and `max_tokens: 0` (and prompts as token ids), vLLM's `prompt_logprobs`, the
tokenizer routes lm-eval's `remote` backend uses, and a REMOTE engine's log-likelihood through
the server. The numbers are checked against transformers' own forward pass on the same
weights (the tiny Llama, and once SmolLM2's real weights), and read by lm-eval's own code."""

from __future__ import annotations

import asyncio
import functools
from types import SimpleNamespace

import pytest

from lmpress.builtin_models.packaged import SMOLLM2
from lmpress.configs import load_config
from lmpress.engines.common.checkpoints import model_source
from lmpress.engines.registry import create_engine
from lmpress.vocabulary.likelihood import LoglikelihoodRequest

TEXT = "The cat sat on the mat and looked at the door."
MODEL = "tiny-llama"


@functools.cache
def reference_model(model_name: str):
    """transformers' own model on the served weights, in float32."""
    from transformers import AutoModelForCausalLM

    path, gguf = model_source(load_config(overrides={"model.model_name": model_name}).model)
    return AutoModelForCausalLM.from_pretrained(path, gguf_file=gguf, dtype="float32").eval()


def reference_steps(model_name: str, ids: list[int]):
    """transformers' log-softmax at each position of `ids`."""
    import torch

    model = reference_model(model_name)
    with torch.inference_mode():
        return model(torch.tensor([ids])).logits[0].float().log_softmax(dim=-1)


def tokenize(http, text: str, special: bool = True) -> list[int]:
    reply = http.post("/tokenize", json={"prompt": text, "add_special_tokens": special})
    assert reply.status_code == 200, reply.text
    return reply.json()["tokens"]


def completion(http, **body) -> dict:
    reply = http.post("/v1/completions", json={"model": MODEL, **body})
    assert reply.status_code == 200, reply.text
    return reply.json()


@pytest.fixture(scope="module")
def http(llama_server):
    with llama_server.http() as client:
        yield client


@pytest.fixture(scope="module")
def ids(http) -> list[int]:
    return tokenize(http, TEXT)


@pytest.fixture(scope="module")
def reference(tiny_llama, ids):
    return reference_steps(tiny_llama, ids)


def test_echo_with_max_tokens_zero_scores_the_prompt_as_transformers(http, ids, reference):
    body = completion(http, prompt=ids, echo=True, logprobs=2, max_tokens=0)
    choice = body["choices"][0]
    logprobs = choice["logprobs"]
    assert choice["text"] == http.post("/detokenize", json={"tokens": ids}).json()["prompt"]
    assert "".join(logprobs["tokens"]) == choice["text"]
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    assert len(logprobs["tokens"]) == len(ids) == body["usage"]["prompt_tokens"]
    assert body["usage"]["completion_tokens"] == 0
    for i in range(1, len(ids)):
        step = reference[i - 1]
        assert logprobs["token_logprobs"][i] == pytest.approx(float(step[ids[i]]), abs=1e-5)
        top = logprobs["top_logprobs"][i]
        # the token itself and the two likeliest: OpenAI's "up to logprobs + 1"
        assert 2 <= len(top) <= 3 and logprobs["tokens"][i] in top
        assert max(top.values()) == pytest.approx(float(step.max()), abs=1e-5)
    # vLLM's prompt_logprobs beside it, keyed by token id
    vllm = choice["prompt_logprobs"]
    assert vllm[0] is None
    for i in range(1, len(ids)):
        own = next(iter(vllm[i]))
        assert int(own) == ids[i]
        best = min(vllm[i].values(), key=lambda e: e["rank"] or 99)
        assert best["rank"] == 1
        assert best["logprob"] == pytest.approx(float(reference[i - 1].max()), abs=1e-5)


def test_text_and_token_id_prompts_give_the_same_numbers(http, ids):
    """lm-eval's request: max_tokens 1, the prompt echoed with one alternative; the last entry
    is the generated token, the rest the prompt's."""
    by_ids = completion(http, prompt=[ids], echo=True, logprobs=1, max_tokens=1, temperature=0)
    by_text = completion(http, prompt=TEXT, echo=True, logprobs=1, max_tokens=1, temperature=0)
    ids_lp = by_ids["choices"][0]["logprobs"]
    text_lp = by_text["choices"][0]["logprobs"]
    assert ids_lp["token_logprobs"] == text_lp["token_logprobs"]
    assert ids_lp["tokens"] == text_lp["tokens"]
    assert len(ids_lp["tokens"]) == len(ids) + 1
    assert by_text["choices"][0]["text"].startswith(TEXT)


def test_lm_evals_own_reading_gives_transformers_log_likelihoods(http, tiny_llama):
    """local-completions' own payload and parser (lm-eval 0.4.13) on two continuations of one
    context, sent as a list of token-id prompts, as it batches them."""
    from lm_eval.models.openai_completions import LocalCompletionsAPI

    context = tokenize(http, "The cat sat on the")
    continuations = [tokenize(http, " mat", False), tokenize(http, " door and the", False)]
    prompts = [context + c for c in continuations]
    payload = LocalCompletionsAPI._create_payload(SimpleNamespace(model=MODEL), prompts)
    reply = http.post("/v1/completions", json=payload)
    assert reply.status_code == 200, reply.text
    got = LocalCompletionsAPI.parse_logprobs(reply.json(), prompts, [len(context)] * 2)
    for prompt, continuation, (logprob, greedy) in zip(prompts, continuations, got, strict=True):
        steps = reference_steps(tiny_llama, prompt)[len(context) - 1 : -1]
        expected = [float(s[t]) for s, t in zip(steps, continuation, strict=True)]
        assert logprob == pytest.approx(sum(expected), abs=1e-4)
        tops = [int(s.argmax()) for s in steps]
        assert greedy == (tops == continuation)


def test_chat_prompt_logprobs_come_beside_the_choices(http):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
            "prompt_logprobs": 1}  # fmt: skip
    reply = http.post("/v1/chat/completions", json=body)
    assert reply.status_code == 200, reply.text
    scored = reply.json()["prompt_logprobs"]
    assert scored[0] is None and len(scored) == reply.json()["usage"]["prompt_tokens"]
    assert all(len(step) in (1, 2) for step in scored[1:])


def test_lm_evals_remote_tokenizer_reads_the_tokenizer_routes(llama_server, ids):
    from lm_eval.utils import RemoteTokenizer, check_remote_tokenizer_support

    url = f"{llama_server.url}/v1/completions"
    assert check_remote_tokenizer_support(url)
    remote = RemoteTokenizer(url)
    with llama_server.http() as client:
        assert remote.encode(TEXT) == tokenize(client, TEXT, special=False)
        info = client.get("/tokenizer_info").json()
    assert remote.decode(remote.encode(TEXT)) == TEXT
    # the EOS token's text reads back as the one id, which lm-eval's prefix token falls back to
    assert remote.eos_token == info["eos_token"] and remote.eos_token_id is not None
    assert remote.decode([remote.eos_token_id]) == remote.eos_token


def test_tokenize_a_conversation_as_the_engine_prompts_it(http):
    messages = [{"role": "user", "content": "hi"}]
    tokens = http.post("/tokenize", json={"messages": messages}).json()
    chat = http.post("/v1/chat/completions", json={"model": MODEL, "messages": messages,
                                                   "max_tokens": 1})  # fmt: skip
    assert tokens["count"] == len(tokens["tokens"]) == chat.json()["usage"]["prompt_tokens"]
    assert tokens["max_model_len"] > 0


@pytest.mark.parametrize(
    ("path", "body", "said"),
    [
        ("/v1/completions", {"prompt": "x", "echo": True, "logprobs": 1, "stream": True},
         "'echo' with logprobs is not available when 'stream' is true"),
        ("/v1/completions", {"prompt": [[1, -3]]}, "item 0: neither a text nor a list"),
        ("/tokenize", {"prompt": "x", "messages": []}, "give either 'prompt'"),
        ("/detokenize", {"tokens": [-1]}, "tokens"),
    ],
)  # fmt: skip
def test_bad_scoring_requests_are_one_line(http, path, body, said):
    reply = http.post(path, json={"model": MODEL, **body})
    assert reply.status_code == 400
    message = reply.json()["error"]["message"]
    assert said in message and "\n" not in message


@pytest.mark.parametrize(
    ("path", "body", "said"),
    [
        ("/v1/completions", {"prompt": "x", "echo": True, "logprobs": 1},
         "engine ECHO does not support 'logprobs', 'echo'"),
        ("/v1/completions", {"prompt": "x", "max_tokens": 0},
         "'max_tokens' 0 only scores the prompt, which engine ECHO cannot do"),
        ("/tokenize", {"prompt": "x"}, "engine ECHO cannot tokenize"),
    ],
)  # fmt: skip
def test_an_engine_that_cannot_score_refuses_in_one_line(echo_server, path, body, said):
    with echo_server.http() as client:
        reply = client.post(path, json={"model": "echo-model", **body})
    assert reply.status_code == 400, reply.text
    message = reply.json()["error"]["message"]
    assert said in message and "\n" not in message


def test_a_remote_engine_scores_through_the_server(llama_server, http, tiny_llama):
    """REMOTE pointed at lmpress serve: Engine.loglikelihood over the wire gives what the
    served engine computes (transformers' numbers), choice by choice."""
    context = tokenize(http, "The cat sat on the")
    choices = [tokenize(http, " mat", False), tokenize(http, " door", False)]
    engine = create_engine(load_config(overrides={
        "engine": "REMOTE", "remote_params.api_url": f"{llama_server.url}/v1",
        "model.model_name": MODEL,
    }))  # fmt: skip

    async def score():
        try:
            return await engine.loglikelihood(LoglikelihoodRequest("q", context, choices))
        finally:
            await engine.aclose()

    result = asyncio.run(score())
    assert result.error is None, result.error
    for choice, got in zip(choices, result.scores, strict=True):
        steps = reference_steps(tiny_llama, context + choice)[len(context) - 1 : -1]
        assert got.logprob == pytest.approx(
            sum(float(s[t]) for s, t in zip(steps, choice, strict=True)), abs=1e-4
        )
        assert got.is_greedy == ([int(s.argmax()) for s in steps] == choice)
        assert got.tokens == len(choice)


def test_smollm2_served_scores_equal_transformers(serve_process):
    """Once on real weights (SmolLM2, float32): lm-eval's request through the server."""
    from lm_eval.models.openai_completions import LocalCompletionsAPI

    served = serve_process("--engine", "NATIVE", "--model.model_name", SMOLLM2,
                           "--serve.served_model_name", "smol")  # fmt: skip
    with served.http() as client:
        context = tokenize(client, "The capital of France is")
        choices = [tokenize(client, " Paris", False), tokenize(client, " Berlin", False)]
        prompts = [context + c for c in choices]
        payload = LocalCompletionsAPI._create_payload(SimpleNamespace(model="smol"), prompts)
        reply = client.post("/v1/completions", json=payload)
    assert reply.status_code == 200, reply.text
    got = LocalCompletionsAPI.parse_logprobs(reply.json(), prompts, [len(context)] * 2)
    for prompt, choice, (logprob, _) in zip(prompts, choices, got, strict=True):
        steps = reference_steps(SMOLLM2, prompt)[len(context) - 1 : -1]
        expected = sum(float(s[t]) for s, t in zip(steps, choice, strict=True))
        assert logprob == pytest.approx(expected, abs=1e-4)
    assert got[0][0] > got[1][0] and got[0][1]  # Paris, and greedily so
