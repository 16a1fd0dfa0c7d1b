"""The pooling endpoints' wire format, both ways: OpenAI's `/v1/embeddings`, and vLLM's
`/v1/score` and `/v1/rerank` (the shapes llama-server's rerank also takes), each also at the
other paths vLLM answers it on (`/score`; `/rerank`, `/v2/rerank`), and vLLM's `/classify`
(a classifier's labels' probabilities) and `/pooling` (the pooled values themselves: a reward
model's score).

`lmpress serve` reads these bodies from HTTP and `lmpress batch` from an OpenAI Batch line's
`body`, through the same models, so a body means the same in both. Embeddings responses are
built from the `openai` package's own types; a base64 vector is the float32 values,
little-endian, as OpenAI sends them and the official client decodes them.
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from lmpress.vocabulary.embeddings import Classification, EmbedResult, ScoreResult
from lmpress.wire.openai.errors import ApiError

EMBEDDINGS_PATH = "/v1/embeddings"
SCORE_PATH = "/v1/score"
RERANK_PATH = "/v1/rerank"
# Every path vLLM's score and rerank routers answer, the first the one lmpress writes.
SCORE_PATHS = (SCORE_PATH, "/score")
RERANK_PATHS = (RERANK_PATH, "/rerank", "/v2/rerank")
CLASSIFY_PATH = "/classify"
POOLING_PATH = "/pooling"

EncodingFormat = Literal["float", "base64"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class EmbeddingsBody(_Strict):
    input: str | list[str] | list[int] | list[list[int]]
    model: str | None = None  # serve requires it; a batch line may leave it
    dimensions: int | None = None
    encoding_format: EncodingFormat | None = None
    user: str | None = None  # accepted; it changes nothing here
    normalize: bool | None = None  # vLLM's extension: L2-normalise the vectors


class ClassifyBody(_Strict):
    """vLLM's /classify: texts (or token-id lists) to classify."""

    input: str | list[str] | list[int] | list[list[int]]
    model: str | None = None
    user: str | None = None  # accepted; it changes nothing here


class PoolingBody(_Strict):
    """vLLM's /pooling: texts (or token-id lists) whose pooled values to return."""

    input: str | list[str] | list[int] | list[list[int]]
    model: str | None = None
    encoding_format: EncodingFormat | None = None
    user: str | None = None


class ScoreBody(_Strict):
    """vLLM's /v1/score, in its current form (`queries`, `documents`) or its older one
    (`text_1`, `text_2`): the first against each of the second, or both lists of one length,
    scored pairwise."""

    queries: str | list[str] | None = None
    documents: str | list[str] | None = None
    text_1: str | list[str] | None = None
    text_2: str | list[str] | None = None
    model: str | None = None


class RerankBody(_Strict):
    """vLLM's (and Jina's, llama-server's) /v1/rerank."""

    query: str
    documents: list[str]
    top_n: int | None = None  # vLLM's default, 0, is every document too
    model: str | None = None
    return_documents: bool | None = None


@dataclass
class Embeddings:
    """An embeddings body read: the inputs, and what to do with their vectors."""

    inputs: list[str] | list[list[int]]
    dimensions: int | None = None
    encoding_format: EncodingFormat = "float"
    normalize: bool = False


def embeddings_input(body: EmbeddingsBody, where: str = "") -> Embeddings:
    """A body's inputs, one list, each a string or a list of token ids; an empty input, a
    `dimensions` under 1, is a 400 naming the argument."""
    value = body.input
    if isinstance(value, str):
        inputs: list[Any] = [value]
    elif value and all(isinstance(v, int) for v in value):
        inputs = [value]
    else:
        inputs = list(value)
    if not inputs or any(isinstance(i, list) and not i for i in inputs):
        raise ApiError(400, f"'{where}input' must not be empty", param="input")
    if body.dimensions is not None and body.dimensions < 1:
        message = f"'{where}dimensions': {body.dimensions} must be at least 1"
        raise ApiError(400, message, param="dimensions")
    return Embeddings(
        inputs, body.dimensions, body.encoding_format or "float", bool(body.normalize)
    )


def inputs_of(body: ClassifyBody | PoolingBody, where: str = "") -> list[Any]:
    """A classify or pooling body's inputs, as `embeddings_input` reads an embeddings body's."""
    got = EmbeddingsBody.model_construct(input=body.input)
    return embeddings_input(got, where).inputs


def score_pair(body: ScoreBody, where: str = "") -> tuple[str | list[str], list[str]]:
    """A score body's query and documents, as vLLM pairs them: one first text against each
    second (1:1, 1:N), or two lists of one length, the i-th with the i-th (N:N), when the
    query comes back as that list."""
    names = _score_form(body, where)
    first, second = (_texts(getattr(body, name)) for name in names)
    for name, texts in zip(names, (first, second), strict=True):
        if not texts:
            raise ApiError(400, f"'{where}{name}' must not be empty", param=name)
    if len(first) == 1:
        return first[0], second
    if len(first) != len(second):
        one, two = names
        raise ApiError(
            400,
            f"'{where}{one}' has {len(first)} texts and '{where}{two}' {len(second)}: give "
            f"one {one} to score against every {two}, or as many as {two} to score them "
            f"pairwise ({one}[i] with {two}[i])",
            param=one,
        )
    return first, second


def _score_form(body: ScoreBody, where: str) -> tuple[str, str]:
    """Which of vLLM's two score forms a body uses: its names for the first and second texts."""
    given = body.model_fields_set
    current, older = {"queries", "documents"} & given, {"text_1", "text_2"} & given
    if current and older:
        raise ApiError(
            400,
            f"'{where}{min(current)}' and '{where}{min(older)}' are two forms of one score "
            f"body; give 'queries' and 'documents', or 'text_1' and 'text_2'",
            param=min(older),
        )
    names = ("text_1", "text_2") if older else ("queries", "documents")
    for name in names:
        if getattr(body, name) is None:
            raise ApiError(400, f"Missing required parameter: '{where}{name}'", param=name)
    return names


def _texts(value: str | list[str] | None) -> list[str]:
    return [value] if isinstance(value, str) else list(value or [])


def top_n_of(top_n: int | None, where: str = "") -> int | None:
    """How many ranked documents a rerank body keeps; None: all (vLLM's 0 says that too)."""
    if top_n is not None and top_n < 0:
        raise ApiError(400, f"'{where}top_n': {top_n} must not be negative", param="top_n")
    return top_n or None


def encoded(vector: Sequence[float], encoding_format: EncodingFormat) -> list[float] | str:
    """A vector as a body carries it: floats, or base64 of its float32 values (a numpy array
    or a list alike)."""
    values = [float(v) for v in vector]
    if encoding_format == "base64":
        return base64.b64encode(struct.pack(f"<{len(values)}f", *values)).decode("ascii")
    return values


def decoded(value: list[float] | str) -> list[float]:
    """A vector as a body carries it, back to floats: base64 is float32, little-endian."""
    if isinstance(value, str):
        raw = base64.b64decode(value, validate=True)
        if len(raw) % 4:
            raise ValueError(f"{len(raw)} bytes of base64 are not float32 values")
        return list(struct.unpack(f"<{len(raw) // 4}f", raw))
    return [float(v) for v in value]


def embeddings_response(
    result: EmbedResult, model: str, encoding_format: EncodingFormat = "float"
) -> dict[str, Any]:
    """The `/v1/embeddings` response body for a result."""
    # Imported here: the openai package takes most of a second to import, and a batch job
    # reads this module's request bodies without building a response.
    from openai.types import CreateEmbeddingResponse
    from openai.types import Embedding as OpenAIEmbedding
    from openai.types.create_embedding_response import Usage as EmbeddingUsage

    data = [
        OpenAIEmbedding(embedding=[], index=i, object="embedding")
        for i in range(len(result.embeddings))
    ]
    usage = EmbeddingUsage(
        prompt_tokens=result.usage.prompt_tokens, total_tokens=result.usage.prompt_tokens
    )
    body = CreateEmbeddingResponse(data=data, model=model, object="list", usage=usage)
    out = body.model_dump(mode="json")
    for item, embedding in zip(out["data"], result.embeddings, strict=True):
        item["embedding"] = encoded(embedding.vector, encoding_format)
    return out


def ranked(scores: list[float], top_n: int | None) -> list[tuple[int, float]]:
    """(index, score) of the documents, best first, cut to `top_n`."""
    order = sorted(enumerate(scores), key=lambda pair: -pair[1])
    return order[:top_n] if top_n is not None else order


def rerank_results(
    result: ScoreResult, documents: list[str], top_n: int | None
) -> list[dict[str, Any]]:
    return [
        {"index": index, "relevance_score": score, "document": {"text": documents[index]}}
        for index, score in ranked(result.scores, top_n)
    ]


def rerank_response(
    id: str, result: ScoreResult, documents: list[str], top_n: int | None, model: str
) -> dict[str, Any]:
    """vLLM's /v1/rerank response body (its RerankResponse, whose usage has both counts)."""
    tokens = result.usage.prompt_tokens
    return {
        "id": id,
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        "results": rerank_results(result, documents, top_n),
    }


def score_response(id: str, created: int, result: ScoreResult, model: str) -> dict[str, Any]:
    """vLLM's /v1/score response body."""
    data = [
        {"index": i, "object": "score", "score": score} for i, score in enumerate(result.scores)
    ]
    return _listed(id, created, model, data, result.usage.prompt_tokens)


def classify_response(id: str, created: int, result: EmbedResult, model: str) -> dict[str, Any]:
    """vLLM's /classify response body: each input's likeliest label and every label's
    probability, in the model's label order."""
    labels = result.labels or []
    data = []
    for i, embedding in enumerate(result.embeddings):
        classified = Classification.of(embedding.vector, labels)
        probs = list(classified.probs.values())
        data.append(
            {"index": i, "label": classified.label, "probs": probs, "num_classes": len(probs)}
        )
    return _listed(id, created, model, data, result.usage.prompt_tokens)


def pooling_response(
    id: str, created: int, result: EmbedResult, model: str, encoding_format: EncodingFormat
) -> dict[str, Any]:
    """vLLM's /pooling response body: each input's pooled values (a reward model's score)."""
    data = [
        {"index": i, "object": "pooling", "data": encoded(e.vector, encoding_format)}
        for i, e in enumerate(result.embeddings)
    ]
    return _listed(id, created, model, data, result.usage.prompt_tokens)


def _listed(id: str, created: int, model: str, data: list, tokens: int) -> dict[str, Any]:
    return {
        "id": id,
        "object": "list",
        "created": created,
        "model": model,
        "data": data,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0},
    }
