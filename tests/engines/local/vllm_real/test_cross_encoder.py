"""lmpress's VLLM engine started for `task: score` on a cross-encoder (vLLM's pooling runner with
the model's classification head) against vLLM's own `LLM.score`, and against NATIVE, on
`tiny:cross-encoder-head32`: `tiny:cross-encoder`'s 16-wide heads are refused by vLLM's CPU
attention ("Unsupported CPU attention configuration: head_dim=16"), which takes 32 and up.

lmpress scores a cross-encoder by its raw logit on every engine; `LLM.score` applies a one-label
model's sigmoid unless its PoolingParams say `use_activation=False`, so the reference is asked
both ways. One engine start and one raw `vllm.LLM` (side by side) for the module: vLLM takes
tens of seconds to start here."""

from __future__ import annotations

import asyncio
import math

import pytest

from lmpress.builtin_models.tiny import tiny_model
from lmpress.configs import load_config
from lmpress.engines.registry import create_engine
from lmpress.vocabulary.embeddings import EmbedRequest, ScoreRequest
from lmpress.vocabulary.errors import ErrorKind, UnsupportedParamError
from tests.engines.local.vllm_real.conftest import raw_vllm_beside, worker_in_the_engine_core

QUERY = "why is the sky blue"
# "" last: vLLM (and lmpress's VLLM engine with it) tokenizes each pair alone, and a
# tokenizer called with one pair whose second text is empty reads the first text alone,
# while NATIVE tokenizes a batch of pairs, which keeps the empty segment's [SEP].
DOCUMENTS = ["the sky is blue because of the sun", "Ünïcode café", "cat dog " * 400, ""]
PAIRS = (["a quick brown fox", "why", "model data file"], ["over the moon", "because", "line"])


def test_scores_equal_vllms_own_score_and_natives(tmp_path):
    directory = str(tiny_model("cross-encoder-head32"))
    raw_pooling = {"use_activation": False}
    cases = {
        "model": directory,
        "engine_args": {"runner": "pooling", "dtype": "float32", "enforce_eager": True},
        "score": {"query": QUERY, "documents": DOCUMENTS[:2] + DOCUMENTS[3:],
                  "pooling": raw_pooling},
        "pairwise_score": {"query": PAIRS[0], "documents": PAIRS[1], "pooling": raw_pooling},
        "default_score": {"query": QUERY, "documents": DOCUMENTS[:2]},
    }  # fmt: skip
    overrides = {"engine": "VLLM", "task": "score", "model.model_name": directory,
                 "model.model_kwargs": {"enforce_eager": True}}  # fmt: skip
    # vLLM's own answers, from a process started while lmpress's engine starts
    with raw_vllm_beside(cases, tmp_path) as raw_answers:
        with worker_in_the_engine_core():
            engine = create_engine(load_config(overrides=overrides))
        try:

            async def ask():
                return await asyncio.gather(
                    engine.score(ScoreRequest("s", QUERY, DOCUMENTS)),
                    engine.score(ScoreRequest("p", *PAIRS)),
                    engine.embed(EmbedRequest("e", ["a text"])),
                )

            scored, pairwise, embedded = asyncio.run(ask())
            # A cross-encoder cannot embed: refused when the engine starts, as it checks here.
            with pytest.raises(UnsupportedParamError) as refused:
                engine._check_pooling("embed", engine.scheduler.pooling_task)
        finally:
            asyncio.run(engine.aclose())
        raw = raw_answers()
    assert engine.cross_encoder
    assert str(refused.value).startswith(
        f"task: embed: model '{directory}' is a cross-encoder: it scores pairs"
    )
    assert "\n" not in str(refused.value)
    assert embedded.error is not None and embedded.error.kind == ErrorKind.UNSUPPORTED_PARAM
    assert scored.error is None and pairwise.error is None
    # vLLM's own LLM.score, without activation; the 800-token document, which lmpress cuts at
    # the model's 512 positions, is left out of the reference.
    got = scored.scores[:2] + scored.scores[3:]
    assert got == pytest.approx(raw["score"], abs=1e-5)
    assert pairwise.scores == pytest.approx(raw["pairwise_score"], abs=1e-5)
    sigmoid = [1 / (1 + math.exp(-s)) for s in scored.scores[:2]]
    assert sigmoid == pytest.approx(raw["default_score"], abs=1e-5)  # LLM.score's default
    assert scored.usage.prompt_tokens > 512

    # NATIVE on the same directory: the same logits, the empty document aside (see DOCUMENTS).
    native = create_engine(
        load_config(overrides={"engine": "NATIVE", "task": "score", "model.model_name": directory})
    )
    try:
        ours = asyncio.run(native.score(ScoreRequest("n", QUERY, DOCUMENTS[:3])))
        ours_pairwise = asyncio.run(native.score(ScoreRequest("np", *PAIRS)))
    finally:
        asyncio.run(native.aclose())
    assert scored.scores[:3] == pytest.approx(ours.scores, abs=1e-4)
    assert pairwise.scores == pytest.approx(ours_pairwise.scores, abs=1e-4)
