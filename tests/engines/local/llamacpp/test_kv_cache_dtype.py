"""`model.kv_cache_dtype` on LLAMACPP, on SmolLM2: llama.cpp's own account of the KV cache it
made (its log) holds about twice the tokens per byte at int8 (q8_0) and 3.5 times at int4
(q4_0); greedy replies at int8 match the unquantized cache's on most of 64 rows; and what an
engine cannot hold is refused in one line naming it.
"""

from __future__ import annotations

import asyncio
import re

import pytest

from lmpress.builtin_models.packaged import SMOLLM2
from lmpress.configs import load_config
from lmpress.engines.registry import create_engine
from lmpress.vocabulary.errors import ConfigError, UnsupportedParamError
from lmpress.vocabulary.types import GenerationParams, Message, Request
from tests.conftest import run_lmpress

# llama.cpp's line for the cache it allocated, e.g. "llama_kv_cache: size = 90.00 MiB (512
# cells, 30 layers, 8/8 seqs), K (f16): 45.00 MiB, ...": a split cache gives each sequence's cells.
KV_LINE = re.compile(r"llama_kv_cache: size = +([\d.]+) MiB \( *(\d+) cells, +\d+ layers, +(\d+)/")


def kv_mib_per_cell(kv_cache_dtype: str) -> float:
    run = run_lmpress(
        "infer", "--engine", "LLAMACPP", "--model.model_name", SMOLLM2, "--cache", "off",
        "--model.kv_cache_dtype", kv_cache_dtype, "--model.model_kwargs.verbose", "true",
        "--model.model_kwargs.n_ctx", "2048", "--generation.max_new_tokens", "2", "Hi",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    # The last cache made is the batched context's; Llama()'s own one-sequence cache is freed.
    size, cells, seqs = (float(x) for x in KV_LINE.findall(run.stderr)[-1])
    return size / (cells * seqs)


def test_a_quantized_cache_holds_twice_the_tokens_and_more_in_the_same_memory():
    full, int8, int4 = (kv_mib_per_cell(dtype) for dtype in ("auto", "int8", "int4"))
    # q8_0 keeps 32 values in 34 bytes, q4_0 in 18, f16 in 64: 1.88 and 3.56 times as many.
    assert full / int8 == pytest.approx(64 / 34, rel=0.01)
    assert full / int4 == pytest.approx(64 / 18, rel=0.01)


def greedy(kv_cache_dtype: str, requests: list[Request]) -> list[str]:
    overrides = {"engine": "LLAMACPP", "model.model_name": SMOLLM2, "generation.batch_size": 16,
                 "model.kv_cache_dtype": kv_cache_dtype}  # fmt: skip
    engine = create_engine(load_config(overrides=overrides))
    try:
        return [r.text for r in engine.generate(requests)]
    finally:
        asyncio.run(engine.aclose())


def test_greedy_replies_at_int8_match_the_unquantized_cache_on_most_rows():
    topics = ["rain", "the sea", "cats", "roads", "bread", "music", "trees", "the moon"]
    requests = [
        Request(f"r{i}", [Message("user", f"Tell me one fact about {topics[i % 8]} ({i}).")],
                GenerationParams(max_new_tokens=32))
        for i in range(64)
    ]  # fmt: skip
    same = sum(
        a == b for a, b in zip(greedy("auto", requests), greedy("int8", requests), strict=True)
    )
    # Measured: 55 of 64 replies of 32 tokens (86%; at int4, 4 of 64), the same with flash
    # attention on both sides, so the cache's rounding alone moves the rest at a near-tie.
    # The bound leaves room for another CPU's kernels; benchmarks/kv_cache.py measures it.
    assert same >= 0.75 * len(requests), f"{same} of {len(requests)} replies match"


def test_what_an_engine_cannot_hold_is_refused_in_one_line():
    with pytest.raises(
        UnsupportedParamError, match=r"engine LLAMACPP cannot hold .* as fp8; it takes int4, int8"
    ):
        create_engine(load_config(overrides={"engine": "LLAMACPP", "model.model_name": SMOLLM2,
                                             "model.kv_cache_dtype": "fp8"}))  # fmt: skip
    with pytest.raises(
        UnsupportedParamError, match=r"engine NATIVE cannot hold .* as fp8; it takes int8"
    ):
        create_engine(load_config(overrides={"engine": "NATIVE", "model.model_name": SMOLLM2,
                                             "model.kv_cache_dtype": "fp8"}))  # fmt: skip
    with pytest.raises(ConfigError, match="needs flash attention"):
        create_engine(load_config(overrides={
            "engine": "LLAMACPP", "model.model_name": SMOLLM2, "model.kv_cache_dtype": "int8",
            "model.model_kwargs": {"flash_attn": False},
        }))  # fmt: skip
    run = run_lmpress("infer", "--engine", "LLAMACPP", "--model.model_name", SMOLLM2,
                      "--model.kv_cache_dtype", "fp16", "Hi")  # fmt: skip
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert (
        "model.kv_cache_dtype" in run.stderr
        and "must be one of auto, int8, int4, fp8" in run.stderr
    )
