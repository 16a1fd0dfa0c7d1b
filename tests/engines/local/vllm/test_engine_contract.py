"""Contract tests of the VLLM engine against a stand-in for vLLM: what lmpress sends vLLM and
how it reads vLLM's outputs back, pinned exactly, in the main environment (which has no vLLM).

They run lmpress's VLLM engine against tests/engines/local/vllm_standin, which mirrors the public
signatures of the vLLM classes lmpress calls (AsyncLLM, AsyncEngineArgs, SamplingParams,
StructuredOutputsParams, LoRARequest, RequestOutput, CompletionOutput) and echoes prompts
instead of running a model. They prove the adapter, not vLLM: tests/engines/local/vllm_real/
runs the same engine against vLLM's CPU build (`make test-vllm`), and where a real test proves
a behaviour by its outcome the duplicate here was removed (structured outputs, a closed stream's
abort, a LoRA adapter on every request). What needs GPUs is in test_gpu_contract.py.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from lmpress.configs import load_config
from lmpress.engines.local.vllm.api import VllmApi
from lmpress.engines.local.vllm.engine import VllmEngine
from lmpress.engines.local.vllm.translate import OutputAssembler, engine_settings, sampling_params
from lmpress.engines.registry import check_engine, create_engine
from lmpress.vocabulary.chat_templates import CHATML_TEMPLATE
from lmpress.vocabulary.errors import (
    ConfigError,
    EngineUnavailableError,
    UnsupportedParamError,
)
from lmpress.vocabulary.types import (
    ContentPart,
    Delta,
    GenerationParams,
    Message,
    Request,
    Result,
    TokenLogprob,
)
from tests.engines.local.vllm.contract_support import model_dir, standin, write_model_dir

__all__ = ["model_dir", "standin"]  # fixtures


def make_engine(model: str, **overrides) -> VllmEngine:
    config = load_config(None, {"model.model_name": model, **overrides}, engine="VLLM")
    engine = create_engine(config)
    assert isinstance(engine, VllmEngine)
    return engine


def close(engine: VllmEngine) -> None:
    asyncio.run(engine.aclose())


def vllm_side():
    """The stand-in AsyncLLM the last engine started, with what it received."""
    from vllm.v1.engine.async_llm import ENGINES

    return ENGINES[-1]


def chat(text: str, rid: str = "row-1", **params) -> Request:
    return Request(rid, [Message("user", text)], GenerationParams(**params))


async def collect(engine: VllmEngine, request: Request) -> tuple[list[Delta], Result]:
    deltas, result = [], None
    async for item in engine.stream(request):
        if isinstance(item, Delta):
            deltas.append(item)
        else:
            result = item
    assert isinstance(result, Result)
    return deltas, result


# --- lmpress -> vLLM: GenerationParams to SamplingParams ----------------------------------------


def test_every_generation_field_reaches_sampling_params(standin):
    from vllm.sampling_params import RequestOutputKind, SamplingParams, StructuredOutputsParams

    api = VllmApi.load()
    params = GenerationParams(
        max_new_tokens=33, temperature=0.7, top_p=0.9, top_k=40, min_p=0.05,
        repetition_penalty=1.1, presence_penalty=0.5, frequency_penalty=-0.5,
        stop_strings=["END", "STOP"], stop_token_ids=[7, 9], min_tokens=3, seed=11, n=2,
        logprobs=True, top_logprobs=3, logit_bias={"42": -5.0},
        guided_decoding={"json": {"type": "object"}}, skip_special_tokens=False,
    )  # fmt: skip
    sp = sampling_params(api, params, stream=True)
    assert isinstance(sp, SamplingParams)
    assert (sp.n, sp.temperature, sp.top_p, sp.top_k, sp.min_p) == (2, 0.7, 0.9, 40, 0.05)
    assert (sp.repetition_penalty, sp.presence_penalty, sp.frequency_penalty) == (1.1, 0.5, -0.5)
    assert (sp.stop, sp.stop_token_ids) == (["END", "STOP"], [7, 9])
    assert (sp.max_tokens, sp.min_tokens, sp.seed) == (33, 3, 11)
    assert (sp.logprobs, sp.skip_special_tokens) == (3, False)
    assert sp.logit_bias == {42: -5.0}
    assert sp.structured_outputs == StructuredOutputsParams(json={"type": "object"})
    assert sp.output_kind == RequestOutputKind.DELTA


def test_defaults_are_greedy_unlimited_and_final_only(standin):
    from vllm.sampling_params import RequestOutputKind

    sp = sampling_params(VllmApi.load(), GenerationParams(), stream=False)
    assert (sp.temperature, sp.top_k, sp.top_p, sp.n) == (0.0, 0, 1.0, 1)
    assert (sp.max_tokens, sp.logprobs, sp.seed) == (256, None, None)
    assert (sp.stop, sp.stop_token_ids, sp.logit_bias, sp.structured_outputs) == (
        [],
        [],
        None,
        None,
    )
    assert sp.output_kind == RequestOutputKind.FINAL_ONLY


# One value away from the default for each field VLLM says it supports.
CHANGED = {
    "max_new_tokens": 5, "temperature": 0.5, "top_p": 0.5, "top_k": 3, "min_p": 0.1,
    "repetition_penalty": 1.3, "presence_penalty": 1.0, "frequency_penalty": 1.0,
    "stop_strings": ["x"], "stop_token_ids": [3], "min_tokens": 2, "seed": 5, "n": 2,
    "logprobs": True, "top_logprobs": 2, "logit_bias": {"5": 1.0},
    "guided_decoding": {"regex": "[a-z]+"}, "skip_special_tokens": False,
    "max_reasoning_tokens": 5, "prompt_logprobs": 2, "ignore_eos": True, "bad_words": ["x"],
}  # fmt: skip
# Fields honoured in the prompt rather than in SamplingParams: reasoning_effort sets the chat
# template's switches (local/reasoning.py; vllm_real/test_reasoning.py runs it on VLLM).
IN_THE_PROMPT = {"reasoning_effort"}
# Fields that send the request to vLLM's own beam search rather than into SamplingParams
# (vllm_real/test_smollm2.py::test_beam_search_equals_vllms_own runs it).
IN_THE_BEAM_SEARCH = {"num_beams", "length_penalty"}


@pytest.mark.parametrize(
    "name", sorted(VllmEngine.supported_params - IN_THE_PROMPT - IN_THE_BEAM_SEARCH)
)
def test_no_supported_field_is_silently_dropped(standin, name):
    api = VllmApi.load()
    base = (
        GenerationParams(temperature=0.5)
        if name in ("n", "top_p", "top_k", "min_p")
        else GenerationParams()
    )
    changed = {name: CHANGED[name]}
    if name == "top_logprobs":
        changed["logprobs"] = True
        base = base.replace(logprobs=True)
    before = sampling_params(api, base, stream=False)
    after = sampling_params(api, base.replace(**changed), stream=False)
    assert before != after, f"generation.{name} did not change vLLM's SamplingParams"


def test_n_above_one_needs_sampling(standin):
    with pytest.raises(
        ConfigError, match=r"generation\.n: 3 samples need generation\.temperature > 0"
    ):
        sampling_params(VllmApi.load(), GenerationParams(n=3), stream=False)


def test_settings_vllm_refuses_are_reported_with_its_reason(standin):
    with pytest.raises(
        ConfigError, match=r"vLLM refused these settings: temperature must be in \[0, 2\]"
    ):
        sampling_params(VllmApi.load(), GenerationParams(temperature=3.0), stream=False)


def test_structured_outputs(standin):
    from vllm.sampling_params import StructuredOutputsParams

    api = VllmApi.load()
    choice = GenerationParams(guided_decoding={"choice": ["yes", "no"]})
    assert sampling_params(api, choice, stream=False).structured_outputs == (
        StructuredOutputsParams(choice=["yes", "no"])
    )
    with pytest.raises(ConfigError, match=r"guided_decoding\.jsn: .*did you mean 'json'"):
        sampling_params(api, GenerationParams(guided_decoding={"jsn": {}}), stream=False)
    with pytest.raises(ConfigError, match=r"exactly one of .* \(got json, regex\)"):
        two = GenerationParams(guided_decoding={"json": {}, "regex": "a"})
        sampling_params(api, two, stream=False)


def test_logit_bias_keys_must_be_token_ids(standin):
    with pytest.raises(ConfigError, match=r"generation\.logit_bias: key 'hello' is not a token id"):
        sampling_params(VllmApi.load(), GenerationParams(logit_bias={"hello": 1.0}), stream=False)


# --- vLLM -> lmpress: RequestOutput to Delta and Result -----------------------------------------


def test_delta_outputs_become_deltas_and_one_result(standin):
    from vllm.logprobs import Logprob
    from vllm.outputs import CompletionOutput, RequestOutput

    def out(index, text, ids, logprobs=None, finish=None, finished=False):
        completion = CompletionOutput(index, text, ids, None, logprobs, finish_reason=finish)
        return RequestOutput("row-1-1", "the prompt", [1, 2, 3], None, [completion], finished)

    assembler = OutputAssembler("row-1", top_logprobs=1)
    deltas = []
    deltas += assembler.feed(
        out(0, "Hel", [5], [{5: Logprob(-0.1, 1, "Hel"), 9: Logprob(-2.0, 2, "X")}])
    )
    deltas += assembler.feed(
        out(1, "Other", [6], [{6: Logprob(-0.3, 2, "Other"), 8: Logprob(-0.2, 1, "Best")}])
    )
    deltas += assembler.feed(
        out(0, "lo", [7, 2], [{7: Logprob(-0.4, 1, "lo")}, {2: Logprob(-0.5, 1, "")}], "stop")
    )
    deltas += assembler.feed(out(1, "", [], None, "length", finished=True))
    assert [(d.request_id, d.text, d.index) for d in deltas] == [
        ("row-1", "Hel", 0), ("row-1", "Other", 1), ("row-1", "lo", 0)
    ]  # fmt: skip

    result = assembler.result(model="m", engine="VLLM", latency_s=0.5)
    assert [(s.text, s.finish_reason, s.completion_tokens) for s in result.samples] == [
        ("Hello", "stop", 3), ("Other", "length", 1)
    ]  # fmt: skip
    assert result.samples[0].logprobs == [
        TokenLogprob("Hel", -0.1, [("Hel", -0.1)], 5, [5]),
        TokenLogprob("lo", -0.4, [("lo", -0.4)], 7, [7]),
        TokenLogprob("", -0.5, [("", -0.5)], 2, [2]),
    ]
    assert result.samples[1].logprobs == [TokenLogprob("Other", -0.3, [("Best", -0.2)], 6, [8])]
    assert (result.usage.prompt_tokens, result.usage.completion_tokens) == (3, 4)
    assert (result.request_id, result.model, result.engine, result.ok) == (
        "row-1",
        "m",
        "VLLM",
        True,
    )


def test_prompt_logprobs_with_nothing_generated(standin):
    """vLLM's prompt logprobs (None first, then the prompt token and the top k at each
    position) become Result.prompt_logprobs; with max_new_tokens 0 the token vLLM had to
    generate (it refuses max_tokens 0) is dropped."""
    from vllm.logprobs import Logprob
    from vllm.outputs import CompletionOutput, RequestOutput

    sp = sampling_params(VllmApi.load(), GenerationParams(max_new_tokens=0), stream=False)
    assert sp.max_tokens == 1
    prompt = [
        None,
        {7: Logprob(-3.0, 4, " b"), 8: Logprob(-0.5, 1, " c"), 6: Logprob(-1.0, 2, " a")},
        {9: Logprob(-0.2, 1, " d"), 4: Logprob(-2.0, 2, " e")},
    ]
    generated = [CompletionOutput(0, " x", [11], None, None, finish_reason="length")]
    output = RequestOutput("r-1", None, [5, 7, 9], prompt, generated, True)
    assembler = OutputAssembler("r", top_prompt=2, generates=False)
    assert assembler.feed(output) == []
    result = assembler.result(model="m", engine="VLLM", latency_s=0.1)
    assert result.prompt_ids == [5, 7, 9]
    assert result.prompt_logprobs == [
        None,
        TokenLogprob(" b", -3.0, [(" c", -0.5), (" a", -1.0)], 7, [8, 6]),
        TokenLogprob(" d", -0.2, [(" d", -0.2), (" e", -2.0)], 9, [9, 4]),
    ]
    assert [lp.is_top for lp in result.prompt_logprobs[1:]] == [False, True]
    assert [(s.text, s.finish_reason, s.completion_tokens) for s in result.samples] == [
        ("", "length", 0)
    ]
    assert result.usage.completion_tokens == 0
    # From score_from on only: the positions before it are not read.
    later = OutputAssembler("r", top_prompt=0, score_from=2)
    later.feed(output)
    assert later.result(model="m", engine="VLLM", latency_s=0.1).prompt_logprobs == [
        None,
        None,
        TokenLogprob(" d", -0.2, [], 9, []),
    ]


def test_final_only_output_and_abort(standin):
    from vllm.outputs import CompletionOutput, RequestOutput

    done = [CompletionOutput(0, "all of it", [4, 5, 6], None, None, finish_reason="abort")]
    assembler = OutputAssembler("r")
    assert [d.text for d in assembler.feed(RequestOutput("r-1", None, [1], None, done, True))] == [
        "all of it"
    ]
    result = assembler.result(model="m", engine="VLLM", latency_s=0)
    assert (result.text, result.finish_reason, result.samples[0].logprobs) == (
        "all of it", "cancelled", None
    )  # fmt: skip


# --- the recipe's model section -> AsyncEngineArgs ---------------------------------------------


def config_with(model_dir: str, **model_fields):
    overrides = {"model.model_name": model_dir}
    overrides.update({f"model.{k}": v for k, v in model_fields.items()})
    return load_config(None, overrides, engine="VLLM")


def test_model_section_and_model_kwargs_become_engine_arguments(model_dir):
    kwargs = {
        "tensor_parallel_size": 2, "pipeline_parallel_size": 1, "gpu_memory_utilization": 0.8,
        "max_num_seqs": 64, "enable_prefix_caching": True, "quantization": "fp8",
        "enforce_eager": True, "max_model_len": 2048,
    }  # fmt: skip
    config = config_with(
        model_dir, torch_dtype_str="bf16", model_max_length=4096, trust_remote_code=True,
        model_revision="abc123", tokenizer_name=model_dir, model_kwargs=kwargs,
    )  # fmt: skip
    settings = engine_settings(config)
    assert settings.args == {
        "model": model_dir, "tokenizer": model_dir, "dtype": "bfloat16",
        "trust_remote_code": True, "revision": "abc123", "disable_log_stats": True,
        **kwargs,  # max_model_len from model_kwargs wins over model.model_max_length
    }  # fmt: skip
    assert (settings.data_parallel_size, settings.gpus) == (1, 2)


def test_the_kv_cache_dtype_becomes_vllms_and_one_vllm_lacks_is_refused(model_dir):
    assert (
        engine_settings(config_with(model_dir, kv_cache_dtype="fp8")).args["kv_cache_dtype"]
        == "fp8"
    )
    assert "kv_cache_dtype" not in engine_settings(config_with(model_dir)).args
    with pytest.raises(UnsupportedParamError, match="engine VLLM cannot hold .* as int8"):
        check_engine(config_with(model_dir, kv_cache_dtype="int8"))


def test_ngram_speculation_becomes_vllms_speculative_config(model_dir):
    config = config_with(
        model_dir, speculative_method="ngram", num_speculative_tokens=3, prompt_lookup_max=5
    )
    assert engine_settings(config).args["speculative_config"] == {
        "method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2,
        "prompt_lookup_max": 5,
    }  # fmt: skip
    assert "speculative_config" not in engine_settings(config_with(model_dir)).args


def test_a_draft_model_becomes_vllms_draft_model_speculative_config(model_dir, tmp_path):
    config = config_with(model_dir, draft_model=str(tmp_path), num_speculative_tokens=5)
    assert engine_settings(config).args["speculative_config"] == {
        "method": "draft_model", "model": str(tmp_path), "num_speculative_tokens": 5,
    }  # fmt: skip


def test_data_parallel_size_is_an_engine_argument_like_the_others(model_dir):
    kwargs = {"data_parallel_size": 4, "tensor_parallel_size": 2}
    settings = engine_settings(config_with(model_dir, model_kwargs=kwargs))
    assert (settings.args["data_parallel_size"], settings.args["tensor_parallel_size"]) == (4, 2)
    assert (settings.data_parallel_size, settings.gpus) == (4, 8)


def test_llamacpps_shared_cache_switch_from_the_smollm2_recipe_is_no_vllm_argument(
    standin, model_dir
):
    # `-c smollm2 --engine VLLM`: the recipe sets kv_unified for llama.cpp; vLLM's paged cache
    # is always shared, so the key is dropped rather than refused or passed on to vLLM.
    config = config_with(model_dir, model_kwargs={"kv_unified": True, "enforce_eager": True})
    settings = engine_settings(config, VllmApi.load().engine_arg_names())
    assert "kv_unified" not in settings.args and settings.args["enforce_eager"] is True


def test_misspelt_engine_argument_is_refused_with_the_closest_name(standin, model_dir):
    # A typo of a documented argument is refused as the config loads (VllmOptions); one of
    # any other argument once vLLM is imported, against AsyncEngineArgs' fields.
    typos = {"tensor_paralel_size": "tensor_parallel_size", "swap_spaec": "swap_space"}
    for key, meant in typos.items():
        with pytest.raises(ConfigError) as err:
            config = config_with(model_dir, model_kwargs={key: 2})
            engine_settings(config, VllmApi.load().engine_arg_names())
        assert str(err.value).startswith(
            f"model.model_kwargs.{key}: not an engine argument of vLLM (did you mean '{meant}'?)"
        )


def test_any_real_engine_argument_passes_through(standin, model_dir):
    config = config_with(model_dir, model_kwargs={"kv_cache_dtype": "fp8", "swap_space": 8})
    args = engine_settings(config, VllmApi.load().engine_arg_names()).args
    assert (args["kv_cache_dtype"], args["swap_space"]) == ("fp8", 8)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("gpu_memory_utilization", 1.5, "in (0, 1]"),
        ("tensor_parallel_size", "two", "whole number of GPUs"),
        ("data_parallel_size", 0, "whole number of model copies"),
        ("enforce_eager", "yes", "true or false"),
        ("max_model_len", -1, "number of tokens"),
    ],
)
def test_documented_engine_arguments_are_checked(model_dir, key, value, message):
    with pytest.raises(ConfigError) as err:
        engine_settings(config_with(model_dir, model_kwargs={key: value}))
    assert str(err.value).startswith(f"model.model_kwargs.{key}: {value!r} ")
    assert message in str(err.value)


def test_unknown_dtype(model_dir):
    with pytest.raises(ConfigError, match="model.torch_dtype_str: unknown dtype 'int3' for VLLM"):
        engine_settings(config_with(model_dir, torch_dtype_str="int3"))


# --- the engine against the stand-in --------------------------------------------------------------


def test_chat_rows_go_through_the_chat_template_once(standin, model_dir):
    engine = make_engine(model_dir)
    try:
        result = asyncio.run(engine.complete(chat("hello there")))
        sent = vllm_side().requests[-1]
    finally:
        close(engine)
    # The stand-in echoes the prompt it was given: the template applied, no BOS added twice.
    assert result.text == "<|im_start|>user hello there<|im_end|> <|im_start|>assistant"
    assert (result.finish_reason, result.engine, result.model) == ("stop", "VLLM", model_dir)
    assert sent.prompt == {
        "prompt": "<|im_start|>user\nhello there<|im_end|>\n<|im_start|>assistant\n"
    }
    assert sent.tokenization_kwargs == {"add_special_tokens": False}
    assert sent.prompt_token_ids[0] != 1  # no BOS: the template writes its own
    assert result.usage.prompt_tokens == len(sent.prompt_token_ids) == 4
    assert result.usage.completion_tokens == 5  # four words and EOS


def test_raw_prompts_are_tokenized_by_vllm(standin, model_dir):
    engine = make_engine(model_dir)
    try:
        request = Request("p", [], GenerationParams(), prompt="just some text")
        result = asyncio.run(engine.complete(request))
        sent = vllm_side().requests[-1]
    finally:
        close(engine)
    assert sent.prompt == {"prompt": "just some text"}
    assert sent.tokenization_kwargs is None
    assert (result.text, result.usage.prompt_tokens) == ("just some text", 4)  # BOS + 3 words


def test_streaming_sends_each_piece_as_it_comes(standin, model_dir):
    from vllm.sampling_params import RequestOutputKind

    engine = make_engine(model_dir)
    try:
        deltas, result = asyncio.run(collect(engine, chat("one two three four")))
        sent = vllm_side().requests[-1]
    finally:
        close(engine)
    assert sent.sampling_params.output_kind == RequestOutputKind.DELTA
    assert len(deltas) == 6
    assert "".join(d.text for d in deltas) == result.text
    assert result.text.startswith("<|im_start|>user one two")


def test_streaming_with_stop_strings_never_shows_the_stop(standin, model_dir):
    engine = make_engine(model_dir)
    try:
        request = chat("alpha beta gamma delta", stop_strings=["gamma"])
        deltas, result = asyncio.run(collect(engine, request))
    finally:
        close(engine)
    assert result.text == "<|im_start|>user alpha beta "
    assert "".join(d.text for d in deltas) == result.text
    assert result.finish_reason == "stop"
    assert result.samples[0].stop_sequence == "gamma"  # vLLM's stop_reason, kept


def test_samples_logprobs_and_limits_come_back(standin, model_dir):
    engine = make_engine(model_dir, **{"generation.temperature": 0.8})
    try:
        two = asyncio.run(engine.complete(chat("red green", n=2, temperature=0.8)))
        short = asyncio.run(engine.complete(chat("red green", max_new_tokens=2)))
        scored = asyncio.run(engine.complete(chat("red", logprobs=True, top_logprobs=2)))
    finally:
        close(engine)
    assert [s.text for s in two.samples] == [
        "<|im_start|>user red green<|im_end|> <|im_start|>assistant",
        "red green<|im_end|> <|im_start|>assistant <|im_start|>user",
    ]
    assert two.usage.completion_tokens == 10
    assert (short.text, short.finish_reason) == ("<|im_start|>user red", "length")
    tokens = scored.samples[0].logprobs
    assert [t.token for t in tokens] == [
        "<|im_start|>user",
        " red<|im_end|>",
        " <|im_start|>assistant",
        "",
    ]
    assert tokens[0].top == [("<|im_start|>user", -0.5), ("alt2", -2.0)]


def test_cancelling_a_request_aborts_it_in_vllm(standin, model_dir, monkeypatch):
    monkeypatch.setenv("VLLM_STANDIN_TOKEN_DELAY_S", "0.05")
    engine = make_engine(model_dir)

    async def give_up() -> None:
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(engine.complete(chat(" ".join(["w"] * 40), rid="slow")), 0.2)

    try:
        asyncio.run(give_up())
        llm = vllm_side()
        wait_until(lambda: llm.aborted and not llm.running)
    finally:
        close(engine)
    assert llm.aborted and all(rid.startswith("slow-") for rid in llm.aborted)


def wait_until(condition, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_prompt_too_long_fails_that_row_only(standin, model_dir):
    engine = make_engine(model_dir)

    async def both() -> list[Result]:
        return await asyncio.gather(
            engine.complete(chat(" ".join(["long"] * 100), rid="big")),
            engine.complete(chat("short", rid="small")),
        )

    try:
        big, small = asyncio.run(both())
    finally:
        close(engine)
    assert big.error is not None and big.error.kind == "context_length_exceeded"
    assert "the model's context length is only 64 tokens" in big.error.message
    assert big.finish_reason == "error"
    assert small.ok


def test_bad_settings_on_one_row_fail_that_row(standin, model_dir):
    engine = make_engine(model_dir)
    try:
        result = asyncio.run(engine.complete(chat("hi", temperature=3.0)))
        greedy_n = asyncio.run(engine.complete(chat("hi", n=2)))
    finally:
        close(engine)
    assert result.error.kind == "invalid_request"
    assert "temperature must be in [0, 2]" in result.error.message
    assert "generation.n: 2 samples need generation.temperature > 0" in greedy_n.error.message


def test_greedy_samples_refused_for_the_whole_job(standin, model_dir):
    with pytest.raises(ConfigError, match=r"generation\.n: 4 samples need"):
        make_engine(model_dir, **{"generation.n": 4})


def test_a_dead_engine_stops_the_job(standin, model_dir, monkeypatch):
    monkeypatch.setenv("VLLM_STANDIN_DIE_AFTER", "1")
    engine = make_engine(model_dir)
    try:
        first = asyncio.run(engine.complete(chat("fine")))
        with pytest.raises(EngineUnavailableError, match="vLLM's engine stopped"):
            asyncio.run(engine.complete(chat("too late")))
    finally:
        close(engine)
    assert first.ok


def test_rows_vllm_cannot_render_fail_alone(standin, tmp_path):
    bare = write_model_dir(tmp_path / "no-template", chat_template=None)
    engine = make_engine(bare)
    try:
        untemplated = asyncio.run(engine.complete(chat("hi")))
        picture = Request(
            "img", [Message("user", [ContentPart("image_url", image_url="file:///x.png")])]
        )
        imaged = asyncio.run(engine.complete(picture))
    finally:
        close(engine)
    assert "has no chat template; set model.chat_template" in untemplated.error.message
    assert imaged.error.message == "image 1 (file:///x.png): no such file"
    engine = make_engine(bare, **{"model.chat_template": "chatml"})
    try:
        templated = asyncio.run(engine.complete(chat("hi")))
    finally:
        close(engine)
    assert templated.text.startswith("<|im_start|>user hi")


def test_generate_works_across_event_loops(standin, model_dir):
    engine = make_engine(model_dir)
    try:
        first = engine.generate(["one", "two"])
        second = engine.generate([[{"role": "user", "content": "three"}]])
    finally:
        close(engine)
    assert [r.text.split()[1] for r in first + second] == [
        "one<|im_end|>",
        "two<|im_end|>",
        "three<|im_end|>",
    ]


def test_closing_the_engine_shuts_vllm_down(standin, model_dir):
    engine = make_engine(model_dir)
    llm = vllm_side()
    close(engine)
    assert llm.is_shut_down


def test_availability(standin, monkeypatch):
    assert VllmEngine.unavailable_reason() is None
    monkeypatch.setenv("VLLM_STANDIN_NO_GPU", "1")
    from tests.engines.local.vllm.contract_support import forget_vllm

    forget_vllm()
    assert VllmEngine.unavailable_reason().startswith("vLLM found no GPU on this machine")
    monkeypatch.delenv("VLLM_STANDIN_NO_GPU")
    monkeypatch.setenv("VLLM_STANDIN_VERSION", "0.11.2")
    forget_vllm()
    assert VllmEngine.unavailable_reason() == (
        "needs vllm>=0.12, found 0.11.2: pip install -U 'lmpress[vllm]'"
    )


@pytest.mark.parametrize(
    ("task", "pools", "labels", "message"),
    [
        ("embed", ["classify"], 1, "is a cross-encoder: it scores pairs and cannot embed; use "
         "task score or rerank, or an embedding model"),
        ("score", ["classify"], 3, "is a classifier with 3 labels; a cross-encoder for scoring "
         "has one. Use task classify"),
        ("embed", ["classify"], 3, "is a classifier with 3 labels: it has no vectors to give; "
         "use task classify, or an embedding model"),
        ("classify", ["embed"], 1, "has no classification head (none declared), so engine VLLM "
         "cannot classify with it; use a sequence-classification model "
         "(…ForSequenceClassification)"),
        ("rerank", ["token_classify"], 1, "neither embeds nor classifies pairs in vLLM's "
         "pooling runner, so it cannot score; use a cross-encoder or an embedding model"),
        ("embed", ["token_classify"], 1, "gives no vectors in vLLM's pooling runner, so it "
         "cannot embed; use an embedding model"),
    ],
)  # fmt: skip
def test_a_model_that_cannot_do_the_pooling_task_is_refused_at_start(
    standin, tmp_path, task, pools, labels, message
):
    from vllm.v1.engine.async_llm import ENGINES

    directory = Path(write_model_dir(tmp_path / "m"))
    config = json.loads((directory / "config.json").read_text())
    config.update(standin_tasks=pools, num_labels=labels)
    (directory / "config.json").write_text(json.dumps(config))
    overrides = {"engine": "VLLM", "task": task, "model.model_name": str(directory)}
    with pytest.raises(UnsupportedParamError) as refused:
        create_engine(load_config(overrides=overrides))
    assert str(refused.value) == f"task: {task}: model '{directory}' {message}"
    assert ENGINES[-1].engine_args.runner == "pooling"
    assert ENGINES[-1].is_shut_down  # the engine it started to find out is stopped


def test_a_cross_encoder_with_a_score_template_of_its_own_is_refused(
    standin, tmp_path, monkeypatch
):
    """vLLM builds such a model's prompts with the model class's get_score_template, which
    lmpress does not: refused rather than scored from other prompts than vLLM's."""
    directory = Path(write_model_dir(tmp_path / "m"))
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "standin_tasks": ["classify"]}))
    monkeypatch.setattr(VllmApi, "pair_format", staticmethod(lambda llm: "template"))
    overrides = {"engine": "VLLM", "task": "score", "model.model_name": str(directory)}
    with pytest.raises(UnsupportedParamError) as refused:
        create_engine(load_config(overrides=overrides))
    assert str(refused.value) == (
        f"task: score: model '{directory}' builds its (query, document) prompts with a score "
        f"template of its own, which lmpress's VLLM engine does not apply; serve it with vllm "
        f"serve and score through engine REMOTE_VLLM"
    )


def test_the_reasoning_parser_is_chosen_from_the_template_or_named(tmp_path):
    """vLLM's parser is an engine argument, so it is chosen from the template's files before
    vLLM starts (the real parsers read replies in vllm_real/test_reasoning.py)."""
    from lmpress.builtin_models.tiny import THINK_TEMPLATE
    from lmpress.configs.schema import ModelParams
    from lmpress.engines.local.vllm.reasoning import own_chat_template, parser_name

    def known() -> list[str]:
        return ["deepseek_r1", "qwen3"]

    def named(template: str | None, tokenizer_source: str | None = None, **model) -> str | None:
        return parser_name(ModelParams(**model), template, known, tokenizer_source)

    think = own_chat_template(write_model_dir(tmp_path / "think", chat_template=THINK_TEMPLATE))
    assert think == THINK_TEMPLATE and named(think) == "deepseek_r1"
    assert own_chat_template(write_model_dir(tmp_path / "plain")) == CHATML_TEMPLATE
    assert named(CHATML_TEMPLATE) is None
    assert named("<|channel|>analysis<|message|>") == "openai_gptoss"
    assert named(think, reasoning_parser="none") is None
    assert named(CHATML_TEMPLATE, reasoning_parser="qwen3") == "qwen3"
    with pytest.raises(ConfigError, match=r"'r2' is not one of vLLM's .*\(deepseek_r1, qwen3\)"):
        named(think, reasoning_parser="r2")
    assert own_chat_template(str(tmp_path / "nothing-here")) is None
    # A tokenizer without <think> and </think> as tokens: vLLM's parsers could not read it.
    tokens = {"added_tokens": [{"content": "<think>"}], "model": {"vocab": {"</think>": 5}}}
    with_marks = tmp_path / "think"
    (with_marks / "tokenizer.json").write_text(json.dumps(tokens))
    assert named(think, tokenizer_source=str(with_marks)) == "deepseek_r1"
    (with_marks / "tokenizer.json").write_text(json.dumps({"model": {"vocab": {"<think>": 4}}}))
    assert named(think, tokenizer_source=str(with_marks)) is None


def test_a_thinking_budget_for_a_model_that_does_not_think_is_refused_at_start(standin, model_dir):
    with pytest.raises(ConfigError, match=r"max_reasoning_tokens: model .* does not think \(its"):
        make_engine(model_dir, **{"generation.max_reasoning_tokens": 5})
