"""lmpress's VLLM engine against vLLM itself, on real weights: SmolLM2-135M-Instruct (the
packaged model, dequantized once into the Hugging Face directory NATIVE loads too).

Each case is asked twice with the same messages, settings and engine arguments: of raw vLLM
(`vllm.LLM.chat` and `LLM.generate` in a process of its own, raw_vllm.py, with SamplingParams
written here by hand) and of lmpress's engine (GenerationParams through lmpress's own
translation). The replies must be the same text, token for token, with the same logprobs.
"""

from __future__ import annotations

import asyncio
import json
import re

import httpx
import jsonschema
import pytest

from lmpress.builtin_models.packaged import SMOLLM2
from lmpress.configs import load_config
from lmpress.engines.local.vllm import scheduling as scheduling_module
from lmpress.engines.registry import create_engine
from lmpress.vocabulary.errors import ModelLoadError
from lmpress.vocabulary.likelihood import LoglikelihoodRequest
from lmpress.vocabulary.types import Delta, GenerationParams, Message, Request
from tests.conftest import run_lmpress
from tests.engines.local.vllm_real import scoring_cases
from tests.engines.local.vllm_real.conftest import (
    RAW_VLLM_ENV,
    REQUIRED,
    VLLM_TEST_TIMEOUT_S,
    raw_vllm_beside,
    vllm_server_beside,
    worker_in_the_engine_core,
)
from tests.engines.local.vllm_real.scoring_cases import TEXT, TOP, assert_prompt_logprobs
from tests.serve.conftest import Served

MAX_MODEL_LEN = 1024
# What both sides run with. lmpress's `auto` dtype is float32 on a CPU (the rule NATIVE follows
# too), so the raw side names it; eager, because compiling the model costs minutes here.
# vLLM 0.32's structured-output backends read `disable_any_whitespace` from the engine's
# structured_outputs_config only (the per-request field is ignored), for a backend named there:
# without it a sampled small model fills JSON with newlines until max_tokens. llguidance is
# the grammar engine NATIVE and LLAMACPP use too.
COMPACT_JSON = {"backend": "guidance", "disable_any_whitespace": True}
ENGINE_ARGS = {
    "dtype": "float32",
    "max_model_len": MAX_MODEL_LEN,
    "enforce_eager": True,
    "structured_outputs_config": COMPACT_JSON,
}
LMPRESS_MODEL = {
    "model.model_name": SMOLLM2,
    "model.model_max_length": MAX_MODEL_LEN,
    "model.model_kwargs": {"enforce_eager": True, "structured_outputs_config": COMPACT_JSON},
}

FRANCE = "What is the capital of France?"
HAIKU = "Write a haiku about the sea."
PARIS = 7042  # " Paris" in SmolLM2's vocabulary
FULL_STOP = 30  # "."
EOS = 2  # "<|im_end|>", SmolLM2-Instruct's end of sequence
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer"},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 20}, "zip": {"type": "string"}},
            "required": ["city", "zip"],
            "additionalProperties": False,
        },
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 3},
    },
    "required": ["name", "age", "address", "tags"],
    "additionalProperties": False,
}
STRUCTURED = {"json": PERSON}

# (question, lmpress GenerationParams fields, vLLM SamplingParams fields)
CHAT_CASES = [
    (FRANCE, {"max_new_tokens": 48, "logprobs": True, "top_logprobs": 3},
     {"temperature": 0, "max_tokens": 48, "logprobs": 3}),
    ("What is 2+2?", {"max_new_tokens": 48, "logprobs": True, "top_logprobs": 3},
     {"temperature": 0, "max_tokens": 48, "logprobs": 3}),
    (HAIKU, {"max_new_tokens": 48}, {"temperature": 0, "max_tokens": 48}),
    ("Who wrote Romeo and Juliet?", {"max_new_tokens": 48}, {"temperature": 0, "max_tokens": 48}),
    (HAIKU, {"temperature": 0.9, "seed": 1234, "n": 2, "max_new_tokens": 32},
     {"temperature": 0.9, "seed": 1234, "n": 2, "max_tokens": 32}),
    (HAIKU, {"temperature": 1.0, "top_k": 5, "top_p": 0.9, "min_p": 0.05, "seed": 7,
             "max_new_tokens": 32},
     {"temperature": 1.0, "top_k": 5, "top_p": 0.9, "min_p": 0.05, "seed": 7, "max_tokens": 32}),
    (FRANCE, {"stop_strings": ["Paris"], "max_new_tokens": 32},
     {"temperature": 0, "stop": ["Paris"], "max_tokens": 32}),
    (FRANCE, {"stop_token_ids": [FULL_STOP], "max_new_tokens": 32},
     {"temperature": 0, "stop_token_ids": [FULL_STOP], "max_tokens": 32}),
    ("What is 2+2?", {"min_tokens": 16, "max_new_tokens": 40},
     {"temperature": 0, "min_tokens": 16, "max_tokens": 40}),
    (HAIKU, {"repetition_penalty": 1.5, "presence_penalty": 0.8, "frequency_penalty": 0.6,
             "max_new_tokens": 48},
     {"temperature": 0, "repetition_penalty": 1.5, "presence_penalty": 0.8,
      "frequency_penalty": 0.6, "max_tokens": 48}),
    (FRANCE, {"logit_bias": {str(PARIS): -100}, "max_new_tokens": 32},
     {"temperature": 0, "logit_bias": {str(PARIS): -100}, "max_tokens": 32}),
    ("Describe a person as JSON.", {"guided_decoding": STRUCTURED, "max_new_tokens": 120},
     {"temperature": 0, "structured_outputs": STRUCTURED, "max_tokens": 120}),
    ("Is the sea blue? Answer yes or no, then why.",
     {"guided_decoding": {"regex": "(yes|no), because [a-z ]{5,40}\\."}, "max_new_tokens": 40},
     {"temperature": 0, "structured_outputs": {"regex": "(yes|no), because [a-z ]{5,40}\\."},
      "max_tokens": 40}),
    (FRANCE, {"guided_decoding": {"choice": ["London", "Paris", "Berlin"]}, "max_new_tokens": 8},
     {"temperature": 0, "structured_outputs": {"choice": ["London", "Paris", "Berlin"]},
      "max_tokens": 8}),
    # vLLM's bad_words and ignore_eos, passed through: the reply routes round " Paris", and
    # one that would end after a few words runs on to max_tokens.
    (FRANCE, {"bad_words": ["Paris"], "max_new_tokens": 24},
     {"temperature": 0, "bad_words": ["Paris"], "max_tokens": 24}),
    ("Say hi.", {"ignore_eos": True, "max_new_tokens": 24},
     {"temperature": 0, "ignore_eos": True, "max_tokens": 24}),
]  # fmt: skip
# Conversations asked of raw vLLM beside CHAT_CASES, greedy, with lmpress's default length.
# PARIS_REPLY is vLLM's first reply to FRANCE (asserted below), so CHAT_FOLLOW_UP is the
# conversation a client holds after that reply and a follow-up.
CHAT_MAX_TOKENS = 256  # generation.max_new_tokens' default
PARIS_REPLY = "The capital of France is Paris."
FOLLOW_UP = "And Germany?"
CHAT_FOLLOW_UP = [
    {"role": "user", "content": FRANCE},
    {"role": "assistant", "content": PARIS_REPLY},
    {"role": "user", "content": FOLLOW_UP},
]
# A system prompt of several hundred tokens (several of vLLM's KV-cache blocks) that two
# questions share: the second is prefilled from vLLM's prefix cache.
LONG_SYSTEM = "You answer from these notes only. " + " ".join(
    f"Note {i}: room {i} of the museum holds {i * 3} paintings and {i + 7} statues."
    for i in range(30)
)
SHARED_PREFIX = [
    [{"role": "system", "content": LONG_SYSTEM}, {"role": "user", "content": q}]
    for q in ("How many paintings does room 4 hold?", "How many statues does room 9 hold?")
]
FOLLOW_UP_ALONE = [{"role": "user", "content": FOLLOW_UP}]
EXTRA_CHATS = [CHAT_FOLLOW_UP, FOLLOW_UP_ALONE, *SHARED_PREFIX]
PROMPT_CASES = [
    ("The capital of France is", {"max_new_tokens": 24, "logprobs": True, "top_logprobs": 2},
     {"temperature": 0, "max_tokens": 24, "logprobs": 2}),
    ("def fibonacci(n):", {"max_new_tokens": 24}, {"temperature": 0, "max_tokens": 24}),
]  # fmt: skip

# Beam searches, lmpress's settings and vLLM's BeamSearchParams: n returns the best n beams.
BEAM_CASES = [
    ("The capital of France is", {"max_new_tokens": 16, "num_beams": 4, "n": 2},
     {"beam_width": 4, "max_tokens": 16}),
    ("def fibonacci(n):", {"max_new_tokens": 16, "num_beams": 3, "n": 3, "length_penalty": 0.5},
     {"beam_width": 3, "max_tokens": 16, "length_penalty": 0.5}),
]  # fmt: skip


@pytest.fixture(scope="module")
def model_dir() -> str:
    from lmpress.engines.local.vllm.translate import model_directory

    return model_directory(SMOLLM2, "model.model_name")


@pytest.fixture(scope="module")
def choices(model_dir) -> tuple[list[int], list[list[int]]]:
    return scoring_cases.choice_tokens(model_dir)


@pytest.fixture(scope="module")
def raw_answers(model_dir, choices, tmp_path_factory):
    """vLLM's own answers, from a process that starts before this module's engine and runs
    beside it (each takes tens of seconds to start): call it for them."""
    cases = {
        "model": model_dir,
        "engine_args": ENGINE_ARGS,
        "chat": [{"messages": [{"role": "user", "content": q}], "sampling": s}
                 for q, _, s in CHAT_CASES]
                + [{"messages": m, "sampling": {"temperature": 0, "max_tokens": CHAT_MAX_TOKENS}}
                   for m in EXTRA_CHATS],
        "generate": [{"prompt": p, "sampling": s} for p, _, s in PROMPT_CASES],
        "beam_search": [{"prompt": p, "params": s} for p, _, s in BEAM_CASES],
        "prompt_logprobs": scoring_cases.raw_cases(*choices),
    }  # fmt: skip
    with raw_vllm_beside(cases, tmp_path_factory.mktemp("raw-smollm2")) as answers:
        yield answers


@pytest.fixture(scope="module")
def reference(raw_answers) -> dict:
    return raw_answers()


@pytest.fixture(scope="module")
def engine(raw_answers):
    with worker_in_the_engine_core():
        engine = create_engine(load_config(overrides={"engine": "VLLM", **LMPRESS_MODEL}))
    yield engine
    asyncio.run(engine.aclose())


def assert_same(result, raw: list[dict], what: str) -> None:
    assert result.ok, f"{what}: {result.error}"
    assert [s.text for s in result.samples] == [r["text"] for r in raw], what
    assert [s.completion_tokens for s in result.samples] == [len(r["token_ids"]) for r in raw]
    finish = {"stop": "stop", "length": "length"}
    assert [s.finish_reason for s in result.samples] == [finish[r["finish_reason"]] for r in raw]
    for sample, expected in zip(result.samples, raw, strict=True):
        if expected["logprobs"] is None:
            assert sample.logprobs is None, what
            continue
        assert [lp.token for lp in sample.logprobs] == [e[0] for e in expected["logprobs"]]
        ours = [lp.logprob for lp in sample.logprobs]
        assert ours == pytest.approx([e[1] for e in expected["logprobs"]], abs=1e-4), what
        for lp, e in zip(sample.logprobs, expected["logprobs"], strict=True):
            assert [t for t, _ in lp.top] == [t for t, _ in e[2][: len(lp.top)]], what
            assert len(lp.top) == min(len(e[2]), 3)


def test_chat_replies_equal_vllm_chat(engine, reference):
    requests = [
        Request(f"c{i}", [Message("user", q)], GenerationParams(**p))
        for i, (q, p, _) in enumerate(CHAT_CASES)
    ]
    results = engine.generate(requests)
    for (question, params, _), result, raw in zip(
        CHAT_CASES, results, reference["chat"][: len(CHAT_CASES)], strict=True
    ):
        assert_same(result, raw, f"{question} {params}")
    # What the cases are there to show, on vLLM's own side too.
    first = reference["chat"]
    assert first[0][0]["text"] == PARIS_REPLY
    assert first[6][0]["text"] == "The capital of France is "  # stop string, not shown
    assert "Paris" not in first[10][0]["text"]  # logit_bias -100 on " Paris"
    assert first[4][0]["text"] != first[4][1]["text"]  # n=2 samples differ
    bad_words, ignored = first[len(CHAT_CASES) - 2][0], first[len(CHAT_CASES) - 1][0]
    assert "Paris" not in bad_words["text"]
    assert len(ignored["token_ids"]) == 24 and ignored["finish_reason"] == "length"
    assert results[-1].samples[0].completion_tokens == 24  # ignore_eos
    # vLLM's stop_reason names the stop string that ended a sample, and only a string.
    stopped_by = [r.samples[0].stop_sequence for r in results]
    assert stopped_by[6] == "Paris" and stopped_by[0] is None and stopped_by[7] is None
    # A greedy reply with logprobs that ends on EOS lists it last, as a token it generated.
    pairs = zip(results[:2], first[:2], strict=True)
    ended = [r.samples[0] for r, raw in pairs if raw[0]["token_ids"][-1] == EOS]
    assert ended, "no case with logprobs ends on EOS"
    for sample in ended:
        assert sample.finish_reason == "stop" and sample.stop_sequence is None
        assert (sample.logprobs[-1].id, sample.logprobs[-1].token) == (EOS, "<|im_end|>")
        assert len(sample.logprobs) == sample.completion_tokens


def test_raw_prompts_equal_vllm_generate(engine, reference):
    requests = [
        Request(f"p{i}", [], GenerationParams(**p), prompt=text)
        for i, (text, p, _) in enumerate(PROMPT_CASES)
    ]
    for result, raw in zip(engine.generate(requests), reference["generate"], strict=True):
        assert_same(result, raw, result.request_id)


def kv_cache_tokens(engine) -> int:
    """The tokens vLLM's KV cache holds, as it sized it in its memory (VLLM_CPU_KVCACHE_SPACE,
    the same for every engine here)."""
    cache = engine.scheduler.llm.vllm_config.cache_config
    return cache.num_gpu_blocks * cache.block_size


def test_an_fp8_kv_cache_holds_four_times_the_tokens_in_the_same_memory(engine):
    """`model.kv_cache_dtype: fp8` against this module's float32 cache: a quarter of the bytes
    a token, so four times the context in the same space; and it answers. vLLM's CPU attention
    keeps an fp8 cache only with AVX-512 or AMX (its own test, asked here): on other CPUs (an
    AVX2-only AMD EPYC, for one) the engine is refused in one line that says what to set."""
    import torch

    config = load_config(overrides={
        "engine": "VLLM", **LMPRESS_MODEL, "model.kv_cache_dtype": "fp8",
    })  # fmt: skip
    if not (torch.cpu._is_avx512_supported() or torch.cpu._is_amx_tile_supported()):
        with worker_in_the_engine_core(), pytest.raises(ModelLoadError) as refused:
            create_engine(config)
        message = str(refused.value)
        assert "\n" not in message and "FP8 KV cache on CPU requires" in message
        assert "leave model.kv_cache_dtype at auto on VLLM here" in message
        return
    with worker_in_the_engine_core():
        fp8 = create_engine(config)
    try:
        assert fp8.scheduler.llm.vllm_config.cache_config.cache_dtype == "fp8"
        ratio = kv_cache_tokens(fp8) / kv_cache_tokens(engine)
        assert ratio == pytest.approx(4, rel=0.01)  # whole blocks: a rounding at most
        [result] = fp8.generate(
            [Request("f", [Message("user", FRANCE)], GenerationParams(max_new_tokens=12))]
        )
        assert result.ok and "Paris" in result.text
    finally:
        asyncio.run(fp8.aclose())


def test_beam_search_equals_vllms_own(engine, reference):
    requests = [
        Request(f"b{i}", [], GenerationParams(**p), prompt=text)
        for i, (text, p, _) in enumerate(BEAM_CASES)
    ]
    for request, result, raw in zip(
        requests, engine.generate(requests), reference["beam_search"], strict=True
    ):
        assert result.ok, result.error
        best = raw[: request.params.n]
        assert [s.text for s in result.samples] == [b["text"] for b in best], request.id
        # vLLM's online search leaves a beam's end token out of its ids, the offline one not.
        generated = [len([t for t in b["token_ids"] if t != EOS]) for b in best]
        assert [s.completion_tokens for s in result.samples] == generated
        assert len({b["text"] for b in best}) == len(best)  # the beams differ


def test_prompt_logprobs_equal_vllms_own(engine, reference):
    """A prompt scored as text and as token ids, generating nothing (vLLM's side generates one
    token, as it must), and scored while generating, read whole and streamed."""
    scored, generating = reference["prompt_logprobs"][:2]
    ids = scored["prompt_token_ids"]
    nothing = GenerationParams(max_new_tokens=0, prompt_logprobs=TOP)
    alongside = GenerationParams(
        max_new_tokens=8, logprobs=True, top_logprobs=3, prompt_logprobs=TOP
    )
    requests = [
        Request("text", [], nothing, prompt=TEXT),
        Request("ids", [], nothing, prompt_ids=ids),
        Request("generating", [], alongside, prompt=TEXT),
    ]
    by_text, by_ids, answered = engine.generate(requests)
    for result in (by_text, by_ids):
        assert_prompt_logprobs(result, scored, TOP)
        assert [(s.text, s.finish_reason, s.completion_tokens) for s in result.samples] == [
            ("", "length", 0)
        ]
        assert result.usage.completion_tokens == 0
    assert_prompt_logprobs(answered, generating, TOP)
    assert_same(answered, generating["samples"], "generating")
    items = asyncio.run(streamed(engine, requests[2]))
    assert "".join(d.text for d in items if isinstance(d, Delta)) == answered.text
    assert_prompt_logprobs(items[-1], generating, TOP)
    # Nothing generated, nothing streamed.
    assert [type(i) for i in asyncio.run(streamed(engine, requests[0]))] == [type(by_text)]


async def streamed(engine, request) -> list:
    return [item async for item in engine.stream(request)]


def test_serve_echoes_prompt_logprobs_as_vllm_serve_does(engine, model_dir, tmp_path):
    """`/v1/completions` with echo and logprobs, as lm-eval's local-completions scores with it:
    lmpress's app over this module's engine answers as vLLM's own server (`vllm serve`, with
    the same engine arguments) answers the same body."""
    from fastapi.testclient import TestClient

    from lmpress.serve.app import create_app

    args = ["--dtype", "float32", "--max-model-len", str(MAX_MODEL_LEN), "--enforce-eager"]
    with vllm_server_beside(model_dir, args, tmp_path) as vllm_url:
        app = create_app(engine, engine.config.serve)  # the test owns the engine, not the app
        served = app.state.server.model_name
        ours = [
            TestClient(app).post("/v1/completions", json={**body, "model": served})
            for body in scoring_cases.ECHO_BODIES
        ]
        url = vllm_url()
        theirs = [
            httpx.post(f"{url}/v1/completions", json={**body, "model": model_dir}, timeout=120)
            for body in scoring_cases.ECHO_BODIES
        ]
    for body, mine, vllm in zip(scoring_cases.ECHO_BODIES, ours, theirs, strict=True):
        assert (mine.status_code, vllm.status_code) == (200, 200), (mine.text, vllm.text)
        scoring_cases.assert_same_echo(mine.json(), vllm.json())
        if body["max_tokens"] == 0:  # vLLM counts the token it generated and dropped
            used = (mine.json()["usage"], vllm.json()["usage"])
            assert [u["completion_tokens"] for u in used] == [0, 1]


def test_the_tokenizer_is_the_one_vllm_reads_prompts_with(engine, reference):
    scored = reference["prompt_logprobs"][0]
    tokenizer = engine.tokenizer()
    ids = tokenizer.encode(TEXT, special=True)
    assert ids == scored["prompt_token_ids"] == tokenizer.encode(TEXT)  # SmolLM2 adds no BOS
    assert tokenizer.decode(ids) == "".join(tokenizer.pieces(ids)) == TEXT
    positions = zip(scored["prompt_logprobs"][1:], ids[1:], strict=True)
    pieces = [scoring_cases.listed(position)[i][2] for position, i in positions]
    assert tokenizer.pieces(ids)[1:] == pieces  # the text prompt logprobs give each token
    assert (tokenizer.eos_id, tokenizer.context_length) == (2, MAX_MODEL_LEN)  # <|im_end|>


def test_loglikelihood_of_four_choices_equals_each_alone_and_vllms_own(engine, reference, choices):
    context, continuations = choices
    together = asyncio.run(engine.loglikelihood(LoglikelihoodRequest("q", context, continuations)))
    alone = [
        asyncio.run(engine.loglikelihood(LoglikelihoodRequest(f"q{i}", context, [c])))
        for i, c in enumerate(continuations)
    ]
    assert together.error is None and all(a.error is None for a in alone)
    assert [s.tokens for s in together.scores] == [len(c) for c in continuations]
    for score, one in zip(together.scores, alone, strict=True):
        assert score.logprob == pytest.approx(one.scores[0].logprob, abs=1e-5)
        assert score.is_greedy == one.scores[0].is_greedy
    raw = [
        scoring_cases.raw_choice_score(r, len(context)) for r in reference["prompt_logprobs"][2:]
    ]
    assert [s.logprob for s in together.scores] == pytest.approx([r[0] for r in raw], abs=1e-3)
    assert [s.is_greedy for s in together.scores] == [r[1] for r in raw]
    assert together.best == max(range(len(raw)), key=lambda i: raw[i][0])


JSON_ROWS = 30


def test_structured_outputs_are_valid_every_time(engine):
    """vLLM's own structured-output backend, through lmpress: 30 sampled replies, each valid.
    Unseeded: vLLM 0.32's CPU backend dies when a seeded request's prompt is prefilled in
    chunks, as 40 prompts at once are ("CPU Generator does not use offset")."""
    json_rows = [
        Request(
            f"j{i}",
            [Message("user", "Describe a person as JSON.")],
            GenerationParams(temperature=0.8, max_new_tokens=160, guided_decoding=STRUCTURED),
        )
        for i in range(JSON_ROWS)
    ]
    regex = "[A-Z][a-z]{2,8} (is|was) (blue|green|grey)\\."
    other_rows = [
        Request(
            f"r{i}",
            [Message("user", "What colour is the sea?")],
            GenerationParams(temperature=1.0, max_new_tokens=24, guided_decoding=g),
        )
        for i in range(5)
        for g in ({"regex": regex}, {"choice": ["red", "green", "blue"]})
    ]
    results = engine.generate(json_rows + other_rows)
    for result in results[:JSON_ROWS]:
        assert result.ok and result.samples[0].finish_reason == "stop", result.text
        jsonschema.validate(json.loads(result.text), PERSON)
    for result in results[JSON_ROWS:]:
        assert re.fullmatch(regex, result.text) or result.text in ("red", "green", "blue")
    assert len({r.text for r in results[:JSON_ROWS]}) > 10  # sampled, not one reply 30 times


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city now.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 30},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
    },
}


def test_tool_choice_required_gives_a_valid_call_every_time(engine):
    """Tools go into the prompt; with tool_choice required vLLM's structured outputs hold the
    reply to a call whose arguments follow the tool's schema, and lmpress reads it back."""
    requests = [
        Request(
            f"t{i}",
            [Message("user", f"What is the weather like in {city}?")],
            GenerationParams(temperature=0.8, max_new_tokens=80, tool_choice="required"),
            tools=[WEATHER, TIME],
        )
        for i, city in enumerate(["Paris", "Tokyo", "Lima", "Oslo", "Cairo"])
    ]
    for result in engine.generate(requests):
        sample = result.samples[0]
        assert sample.finish_reason == "tool_calls", (result.error, sample.text)
        (call,) = sample.tool_calls
        assert call.name in ("get_weather", "get_time")
        if call.name == "get_weather":
            jsonschema.validate(json.loads(call.arguments), WEATHER["function"]["parameters"])


def unfinished(engine) -> int:
    """Requests vLLM's AsyncLLM still holds (its output processor's count)."""
    return engine.scheduler.llm.output_processor.get_num_unfinished_requests()


def test_a_stream_closed_early_aborts_its_request_in_vllm(engine):
    request = Request(
        "long", [Message("user", HAIKU)], GenerationParams(min_tokens=900, max_new_tokens=900)
    )

    async def read_two_pieces() -> int:
        stream = engine.stream(request)
        pieces = 0
        async for item in stream:
            assert isinstance(item, Delta)
            pieces += 1
            if pieces == 2:
                break
        await stream.aclose()
        # vLLM frees the request on its own loop; wait for it (a long reply takes minutes).
        for _ in range(200):
            if unfinished(engine) == 0:
                return pieces
            await asyncio.sleep(0.05)
        return -1

    assert asyncio.run(read_two_pieces()) == 2
    # The engine goes on answering.
    assert engine.generate([Request("after", [Message("user", FRANCE)])])[0].ok


def test_a_prompt_too_long_fails_alone(engine):
    long = " ".join(["word"] * (MAX_MODEL_LEN + 50))
    results = engine.generate([
        Request("long", [Message("user", long)]),
        Request("fine", [Message("user", FRANCE)], GenerationParams(max_new_tokens=16)),
    ])  # fmt: skip
    assert results[0].error is not None and results[0].error.kind == "context_length_exceeded"
    assert (
        "maximum context length" in results[0].error.message or "1024" in results[0].error.message
    )
    assert results[1].ok and results[1].text.startswith("The capital of France is")


def test_token_ids_vllm_cannot_read_fail_alone(engine):
    scoring = GenerationParams(max_new_tokens=0, prompt_logprobs=1)
    results = engine.generate([
        Request("past", [], scoring, prompt_ids=[504, 10**6]),
        Request("none", [], scoring, prompt_ids=[]),
        Request("fine", [], scoring, prompt_ids=[504, 3575]),
    ])  # fmt: skip
    assert [(r.error.kind, r.error.message) for r in results[:2]] == [
        ("invalid_request", "Token id 1000000 is out of vocabulary"),  # vLLM's own words
        ("invalid_request", "The decoder prompt cannot be empty"),
    ]
    assert results[2].ok and results[2].prompt_logprobs[1].id == 3575


# --- the fronts: each an `lmpress` process of its own, with the same engine arguments ----------

CLI_MODEL = [
    "--engine", "VLLM", "--model.model_name", SMOLLM2,
    "--model.model_max_length", str(MAX_MODEL_LEN), "--model.model_kwargs.enforce_eager", "true",
]  # fmt: skip


def test_batch_on_ray_writes_what_vllm_answers(reference, tmp_path):
    """`lmpress batch --ray` with one replica, on a local Ray that lmpress starts: the replica
    runs the same engine on vLLM, and every row is vLLM's greedy answer."""
    if not REQUIRED:
        pytest.importorskip("ray", reason="the ray extra is not installed")
    greedy = [i for i, (_, p, _) in enumerate(CHAT_CASES[:4]) if p["max_new_tokens"] == 48]
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    rows = [{"id": f"r{i}", "prompt": CHAT_CASES[i][0]} for i in greedy]
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    # The replica runs vLLM's model worker in its engine-core process (RAW_VLLM_ENV reaches it
    # through the local Ray's workers): one vLLM and torch import fewer. The serve test below
    # keeps vLLM's default processes, as users run it.
    run = run_lmpress(
        "batch", *CLI_MODEL, "--generation.max_new_tokens", "48", "-i", str(source),
        "-o", str(out), "--ray", "--ray.replicas", "1", "--ray.cpus_per_replica", "1",
        timeout=VLLM_TEST_TIMEOUT_S - 120,  # under the hang guard the conftest sets
        env=RAW_VLLM_ENV,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert "started Ray" in run.stderr
    written = {row["id"]: row["response"]["text"] for row in map(json.loads, out.open())}
    assert written == {f"r{i}": reference["chat"][i][0]["text"] for i in greedy}


def test_serve_with_ngram_speculation_answers_as_vllm_and_a_client_that_leaves_frees_it(
    reference,
):
    """`lmpress serve` decoding speculatively by prompt lookup: greedy text is the same with
    vLLM's own speculation as without it (the reference), a conversation's last turn is
    answered with the turns before it, and a streaming client that leaves frees its request.
    (One front carries the speculation setting: chat, infer and serve reach vLLM the same way,
    create_engine and engine.stream, chat's history is engine-independent and tested on the
    other engines, and each vLLM start costs tens of seconds of CPU here.)"""
    served = Served([*CLI_MODEL, "--model.speculative_method", "ngram"], start_timeout=600)
    try:
        client = served.client(timeout=300)
        reply = client.chat.completions.create(
            model=SMOLLM2, messages=[{"role": "user", "content": FRANCE}], temperature=0,
            max_tokens=48, logprobs=True, top_logprobs=3,
        )  # fmt: skip
        expected = reference["chat"][0][0]
        assert reply.choices[0].message.content == expected["text"] == PARIS_REPLY
        assert [t.logprob for t in reply.choices[0].logprobs.content] == pytest.approx(
            [e[1] for e in expected["logprobs"]], abs=1e-4
        )
        # The follow-up is answered with the first exchange before it, as vLLM answers the
        # whole conversation.
        follow_up = extra(reference, CHAT_FOLLOW_UP)["text"]
        assert follow_up != extra(reference, FOLLOW_UP_ALONE)["text"]  # it needs the history
        answered = client.chat.completions.create(
            model=SMOLLM2, messages=CHAT_FOLLOW_UP, temperature=0, max_tokens=CHAT_MAX_TOKENS
        )
        assert answered.choices[0].message.content == follow_up
        stream = client.chat.completions.create(
            model=SMOLLM2, messages=[{"role": "user", "content": HAIKU}], temperature=0,
            max_tokens=48, stream=True,
        )  # fmt: skip
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        assert text == reference["chat"][2][0]["text"]
        # A streaming client that leaves after two chunks: its request ends, the server goes on.
        leaving = client.chat.completions.create(
            model=SMOLLM2, messages=[{"role": "user", "content": HAIKU}], max_tokens=900,
            stream=True, extra_body={"min_tokens": 900},
        )  # fmt: skip
        for i, _ in enumerate(leaving):
            if i == 2:
                break
        leaving.close()
        served.wait_until_idle(timeout=120)
        again = client.chat.completions.create(
            model=SMOLLM2, messages=[{"role": "user", "content": FRANCE}], temperature=0
        )
        assert again.choices[0].message.content == expected["text"]
    finally:
        served.stop()


def extra(reference: dict, conversation: list[dict]) -> dict:
    """vLLM's greedy answer to one of EXTRA_CHATS."""
    return reference["chat"][len(CHAT_CASES) + EXTRA_CHATS.index(conversation)][0]


def test_a_shared_prefix_is_read_from_vllms_cache_and_the_reply_is_unchanged(
    engine, reference, monkeypatch
):
    """vLLM's prefix cache (on by default) serves lmpress's requests: the second of two
    conversations with the same long system prompt is prefilled mostly from the cache, as
    vLLM's own RequestOutput.num_cached_tokens says, and its reply is still vLLM's."""
    cached: dict[str, int | None] = {}

    class Recording(scheduling_module.OutputAssembler):  # records what vLLM sent; changes nothing
        def feed(self, output):
            cached[self.request_id] = output.num_cached_tokens
            return super().feed(output)

    monkeypatch.setattr(scheduling_module, "OutputAssembler", Recording)
    greedy = GenerationParams(max_new_tokens=CHAT_MAX_TOKENS)
    results = []
    for i, conversation in enumerate(SHARED_PREFIX):  # one after the other
        messages = [Message(m["role"], m["content"]) for m in conversation]
        (result,) = engine.generate([Request(f"shared{i}", messages, greedy)])
        assert result.ok and result.text == extra(reference, conversation)["text"], result.text
        results.append(result)
    prompt = results[1].usage.prompt_tokens
    assert prompt > 400
    assert cached["shared0"] < prompt / 2  # nothing before it shared the system prompt
    assert cached["shared1"] > prompt / 2  # the system prompt came from the cache
