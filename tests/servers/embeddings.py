"""What the loopback server answers to /v1/embeddings: a vector that depends only on the input,
so a test can compute the one each row must get (`vector`); and to vLLM's /v1/score, a score
that depends only on the pair (`score`).

A vector has DIMS values, each a byte of the input's SHA-256 as (byte - 128) / 128: exact in
float32, so a vector survives the base64 encoding (float32, little-endian) unchanged.
`dimensions` keeps the first N values, as a Matryoshka model does; more than DIMS is refused.
An input's tokens are its words (token ids: their count), at least one.
"""

from __future__ import annotations

import base64
import hashlib
import json
import struct
from typing import Any

DIMS = 16


def vector(text: str | list[int], dimensions: int | None = None) -> list[float]:
    """The vector the server gives an input (a string, or a list of token ids)."""
    key = text if isinstance(text, str) else json.dumps(text)
    digest = hashlib.sha256(key.encode("utf-8")).digest()
    return [(byte - 128) / 128 for byte in digest[: dimensions or DIMS]]


def tokens(text: str | list[int]) -> int:
    return max(1, len(text) if isinstance(text, list) else len(text.split()))


def inputs(body: dict[str, Any]) -> list[str | list[int]]:
    """A body's `input` as a list of inputs: a string, token ids, or a list of either."""
    value = body["input"]
    if isinstance(value, str) or (value and isinstance(value[0], int)):
        return [value]
    return list(value)


def problem(body: dict[str, Any]) -> str | None:
    """What the real API refuses in a body of the right shape, or None."""
    if not body.get("model"):
        return "model: field required"
    if body["input"] in ("", []):
        return "'input' : input cannot be an empty string"
    dimensions = body.get("dimensions")
    if dimensions is not None and not 1 <= dimensions <= DIMS:
        return f"This model does not support specifying dimensions above {DIMS}."
    return None


def reply(body: dict[str, Any], model: str) -> dict[str, Any]:
    """The embeddings list for a body, floats or base64 as `encoding_format` asks."""
    data = []
    for index, item in enumerate(inputs(body)):
        values = vector(item, body.get("dimensions"))
        if body.get("encoding_format") == "base64":
            packed = struct.pack(f"<{len(values)}f", *values)
            embedding: Any = base64.b64encode(packed).decode("ascii")
        else:
            embedding = values
        data.append({"object": "embedding", "index": index, "embedding": embedding})
    used = sum(tokens(item) for item in inputs(body))
    usage = {"prompt_tokens": used, "total_tokens": used}
    return {"object": "list", "data": data, "model": model, "usage": usage}


SCORE_FIELDS = frozenset({"model", "text_1", "text_2"})


def score(query: str, document: str) -> float:
    """The relevance score the server gives a pair: in [0, 1), exact in a double."""
    digest = hashlib.sha256(f"{query}\0{document}".encode()).digest()
    return int.from_bytes(digest[:4], "big") / 2**32


def _texts(value: Any) -> list[str] | None:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return value
    return None


def score_problem(body: dict[str, Any]) -> str | None:
    """What vLLM's /v1/score refuses (a 400), or None: text_1 and text_2 each a text or a
    list, 1:1, 1:N or N:N (pairwise), as vLLM's validate_score_input takes them."""
    unknown = sorted(set(body) - SCORE_FIELDS)
    if unknown:
        return f"Unrecognized request argument supplied: {', '.join(unknown)}"
    if not body.get("model"):
        return "model: field required"
    first, second = _texts(body.get("text_1")), _texts(body.get("text_2"))
    if first is None:
        return "text_1: Input should be a string or a non-empty list of strings"
    if second is None:
        return "text_2: Input should be a string or a non-empty list of strings"
    if len(first) > 1 and len(first) != len(second):
        return "Input lengths must be either 1:1, 1:N or N:N"
    return None


def score_reply(body: dict[str, Any], model: str) -> dict[str, Any]:
    """vLLM's ScoreResponse: one score per text_2, in order."""
    documents = _texts(body["text_2"]) or []
    firsts = _texts(body["text_1"]) or []
    if len(firsts) == 1:
        firsts = firsts * len(documents)
    pairs = list(zip(firsts, documents, strict=True))
    data = [
        {"index": i, "object": "score", "score": score(first, doc)}
        for i, (first, doc) in enumerate(pairs)
    ]
    used = sum(tokens(first) + tokens(doc) for first, doc in pairs)
    usage = {"prompt_tokens": used, "total_tokens": used, "completion_tokens": 0}
    return {"id": "score-test", "object": "list", "created": 0, "model": model, "data": data,
            "usage": usage}  # fmt: skip
