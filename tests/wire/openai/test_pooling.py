"""The pooling endpoints' bodies both ways, checked against the `openai` package's own types and
its base64 decoding, and against vLLM's score and rerank response models."""

from __future__ import annotations

import base64

import numpy as np
import pytest
from openai.types import CreateEmbeddingResponse

from lmpress.vocabulary.embeddings import Embedding, EmbedResult, ScoreResult
from lmpress.vocabulary.types import Usage
from lmpress.wire.openai import pooling as wire
from lmpress.wire.openai.errors import ApiError
from tests.wire.openai.vllm_shapes import RerankResponse, ScoreResponse


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


def test_both_of_vllm_s_score_forms_read_alike():
    current = wire.ScoreBody.model_validate({"queries": "q", "documents": ["a", "b"]})
    older = wire.ScoreBody.model_validate({"text_1": "q", "text_2": ["a", "b"]})
    assert wire.score_pair(current) == wire.score_pair(older) == ("q", ["a", "b"])
    pairwise = wire.ScoreBody.model_validate({"queries": ["q1", "q2"], "documents": ["a", "b"]})
    assert wire.score_pair(pairwise) == (["q1", "q2"], ["a", "b"])
    one_text = wire.ScoreBody.model_validate({"queries": "q", "documents": "a"})
    assert wire.score_pair(one_text) == ("q", ["a"])
    mixed = wire.ScoreBody.model_validate({"queries": "q", "text_2": ["a"]})
    with pytest.raises(ApiError) as refused:
        wire.score_pair(mixed, "body.")
    assert refused.value.message == (
        "'body.queries' and 'body.text_2' are two forms of one score body; give 'queries' and "
        "'documents', or 'text_1' and 'text_2'"
    )
    with pytest.raises(ApiError, match=r"^Missing required parameter: 'documents'$"):
        wire.score_pair(wire.ScoreBody.model_validate({"queries": "q"}))
    uneven = wire.ScoreBody.model_validate({"queries": ["a", "b"], "documents": ["c"]})
    with pytest.raises(ApiError, match=r"^'queries' has 2 texts and 'documents' 1: give one"):
        wire.score_pair(uneven)


def test_rerank_and_score_bodies_are_vllm_s_response_models():
    result = ScoreResult("r", [0.1, 0.9], Usage(7))
    rerank = RerankResponse.model_validate(wire.rerank_response("id", result, ["a", "b"], 1, "m"))
    assert rerank.usage.prompt_tokens == 7 and rerank.usage.total_tokens == 7
    assert [r.index for r in rerank.results] == [1]
    scored = ScoreResponse.model_validate(wire.score_response("id", 5, result, "m"))
    assert [d.score for d in scored.data] == [0.1, 0.9] and scored.usage.prompt_tokens == 7


def test_top_n_0_keeps_every_document_as_vllm_s_default_does():
    assert wire.top_n_of(0) is None and wire.top_n_of(None) is None and wire.top_n_of(2) == 2
    with pytest.raises(ApiError, match=r"^'body.top_n': -1 must not be negative$"):
        wire.top_n_of(-1, "body.")
