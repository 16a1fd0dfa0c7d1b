"""The pooling endpoints' bodies both ways, checked against the `openai` package's own types and
its base64 decoding."""

from __future__ import annotations

import base64

import numpy as np
import pytest
from openai.types import CreateEmbeddingResponse

from lmpress.openai_wire import pooling as wire
from lmpress.openai_wire.errors import ApiError
from lmpress.vocabulary.embeddings import Embedding, EmbedResult, ScoreResult
from lmpress.vocabulary.types import Usage


def test_a_local_engine_s_float32_vectors_as_floats_and_as_base64():
    vectors = [np.array([0.1, -2.5, 3.25], dtype=np.float32), np.array([1, 0, 0], np.float32)]
    result = EmbedResult("r", [Embedding(v, 3) for v in vectors], Usage(6), "m", "NATIVE")
    body = CreateEmbeddingResponse.model_validate(wire.embeddings_response(result, "served"))
    assert [d.embedding for d in body.data] == [v.tolist() for v in vectors]
    assert body.model == "served" and body.usage.prompt_tokens == 6
    packed = wire.embeddings_response(result, "served", "base64")["data"]
    # Decoded as the official client decodes it (numpy's frombuffer of little-endian float32).
    decoded = [np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in packed]
    assert all((a == b).all() for a, b in zip(decoded, vectors, strict=True))


def test_inputs_read_as_openai_reads_them():
    read = wire.embeddings_input(wire.EmbeddingsBody(input=[[1, 2], [3]], dimensions=2))
    assert read.inputs == [[1, 2], [3]] and read.dimensions == 2
    with pytest.raises(ApiError, match="'body.dimensions': 0 must be at least 1"):
        wire.embeddings_input(wire.EmbeddingsBody(input="x", dimensions=0), "body.")


def test_rerank_sorts_best_first_and_cuts_to_top_n():
    result = ScoreResult("r", [0.1, 0.9, 0.5], Usage(9))
    body = wire.rerank_response("id", result, ["a", "b", "c"], 2, "m")
    assert body["results"] == [
        {"index": 1, "relevance_score": 0.9, "document": {"text": "b"}},
        {"index": 2, "relevance_score": 0.5, "document": {"text": "c"}},
    ]
    scores = wire.score_response("id", 0, result, "m")["data"]
    assert [(d["index"], d["score"]) for d in scores] == [(0, 0.1), (1, 0.9), (2, 0.5)]
