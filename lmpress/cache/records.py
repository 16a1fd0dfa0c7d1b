"""A reply as the response cache keeps it: the engine's answer as JSON, without what belongs
to one run (the request's id, its latency, its price, the structure check the batch makes on
every reply), and the same answer rebuilt from it.

JSON, not pickle: a cache directory may be shared between users, and reading one must never run
code. Vectors are kept as base64 of their float32 bytes, exactly as the engine gave them.
"""

from __future__ import annotations

import base64
import dataclasses
import json
from typing import Any

import orjson

from lmpress.vocabulary.embeddings import Embedding, EmbedResult, ScoreResult
from lmpress.vocabulary.likelihood import (
    ContinuationScore,
    LoglikelihoodResult,
    PerplexityResult,
)
from lmpress.vocabulary.types import Result, Sample, TokenLogprob, ToolCall, Usage

FORMAT = 1
AnyResult = Result | EmbedResult | ScoreResult | LoglikelihoodResult | PerplexityResult


def dump(result: AnyResult) -> bytes:
    if isinstance(result, Result):
        body: dict[str, Any] = {
            "kind": "generate",
            "samples": [_sample_fields(sample) for sample in result.samples],
        }
    elif isinstance(result, EmbedResult):
        body = {"kind": "embed", "embeddings": [_embedding(e) for e in result.embeddings]}
        if result.labels is not None:
            body["labels"] = result.labels
    elif isinstance(result, LoglikelihoodResult):
        body = {"kind": "loglikelihood", "scores": [vars(s) for s in result.scores]}
    elif isinstance(result, PerplexityResult):
        body = {"kind": "perplexity", "logprob": result.logprob, "tokens": result.tokens}
    else:
        body = {"kind": "score", "scores": list(result.scores)}
    body.update(
        v=FORMAT,
        usage=dict(vars(result.usage)),
        model=result.model,
        engine=result.engine,
    )
    return _encode(body)


def _encode(body: dict[str, Any]) -> bytes:
    """orjson where it writes what json would read back the same: not for a lone surrogate
    (refused) nor NaN or infinity (written as null; a body has no null otherwise, fields that
    are None being left out). json, ASCII-escaped, for those."""
    try:
        data = orjson.dumps(body)
    except TypeError:
        return json.dumps(body, separators=(",", ":")).encode()
    if b"null" in data:
        return json.dumps(body, separators=(",", ":")).encode()
    return data


def load(value: bytes, request_id: str) -> AnyResult:
    """The reply `dump` kept, for the request `request_id`; ValueError when it is not one."""
    try:
        body = _decode(value)
        if body.get("v") != FORMAT:
            raise ValueError(f"record format {body.get('v')}")
        usage = _known(Usage, body["usage"])
        common = {"usage": usage, "model": body["model"], "engine": body["engine"]}
        kind = body["kind"]
        if kind == "generate":
            samples = [_sample(s) for s in body["samples"]]
            return Result(request_id, samples, **common)
        if kind == "embed":
            vectors = [_vector(e) for e in body["embeddings"]]
            return EmbedResult(request_id, vectors, **common, labels=body.get("labels"))
        if kind == "score":
            return ScoreResult(request_id, [float(s) for s in body["scores"]], **common)
        if kind == "loglikelihood":
            scores = [_known(ContinuationScore, s) for s in body["scores"]]
            return LoglikelihoodResult(request_id, scores, **common)
        if kind == "perplexity":
            logprob, tokens = float(body["logprob"]), int(body["tokens"])
            return PerplexityResult(request_id, logprob, tokens, **common)
        raise ValueError(f"record kind {kind!r}")
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"damaged record ({exc!r})") from exc


def _decode(value: bytes) -> Any:
    try:
        return orjson.loads(value)
    except orjson.JSONDecodeError:  # NaN, infinity or a lone surrogate escape: json reads them
        return json.loads(value)


def _sample_fields(sample: Sample) -> dict[str, Any]:
    """A sample's fields as JSON values, those that are None left out (a load fills them in).
    By hand: `dataclasses.asdict` deep-copies every value, and a run at full speed keeps
    thousands of replies a second."""
    fields = {k: v for k, v in vars(sample).items() if v is not None}
    if sample.tool_calls is not None:
        fields["tool_calls"] = [vars(call) for call in sample.tool_calls]
    if sample.logprobs is not None:
        fields["logprobs"] = [vars(t) for t in sample.logprobs]
    return fields


def _known(cls: type, fields: dict[str, Any]) -> Any:
    """`cls` from the fields it has: a record written by another lmpress version may have
    more or fewer."""
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in fields.items() if k in names})


def _sample(fields: dict[str, Any]) -> Sample:
    sample = _known(Sample, fields)
    if sample.logprobs is not None:
        sample.logprobs = [
            TokenLogprob(t["token"], t["logprob"], [tuple(pair) for pair in t.get("top", [])])
            for t in sample.logprobs
        ]
    if sample.tool_calls is not None:
        sample.tool_calls = [ToolCall(**call) for call in sample.tool_calls]
    return sample


def _embedding(embedding: Embedding) -> dict[str, Any]:
    import numpy as np

    vector = embedding.vector
    array = isinstance(vector, np.ndarray)
    raw = np.asarray(vector, dtype=np.float32 if array else np.float64).tobytes()
    return {
        "b64": base64.b64encode(raw).decode(),
        "dtype": "float32" if array else "float64",
        "prompt_tokens": embedding.prompt_tokens,
        "truncated": embedding.truncated,
    }


def _vector(fields: dict[str, Any]) -> Embedding:
    import numpy as np

    raw = np.frombuffer(base64.b64decode(fields["b64"]), dtype=fields["dtype"])
    vector: Any = raw.copy() if fields["dtype"] == "float32" else raw.tolist()
    return Embedding(vector, fields["prompt_tokens"], fields["truncated"])
