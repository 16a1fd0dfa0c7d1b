"""The rows of an embed, score, rerank, classify or reward run (`vocabulary/embeddings.py`),
both ways.

Input, beside the generation shapes of `row_shapes`:
- embed, classify, reward:
          {"input": "..."} or {"input": ["...", ...]} (or token ids), a table's
          `--text-column`, or `--prompt-template` making the text from the columns
- score:  {"query": "...", "documents": ["...", ...], "top_n"?} (vLLM's /v1/rerank body) or
          {"queries": "...", "documents": "..." or [...]} (its /v1/score body, or its older
          form, "text_1" and "text_2"; two lists of one length score pairwise, the i-th with
          the i-th, in a score run); a score run and a rerank run take either
- OpenAI Batch lines to /v1/embeddings, /v1/score (or /score), /v1/rerank (or /rerank,
  /v2/rerank), /classify and /pooling (a reward run's), their bodies read by
  `wire.openai.pooling` as serve reads them. A line's task is its url's (`URL_TASKS`),
  whatever the run's; `batch.tasks` decides whether it runs.
Output: the input row with `embedding` (one input) or `embeddings` (a list), `scores` (a
score run), `results` (a rerank run: best first, cut to top_n), `label` and `probs` (a
classify run; `classifications` for a list), `reward` (`rewards` for a list), and a
`response` record with the usage, `truncated`, model, engine and latency.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from lmpress.data.columns import RowMapping, TemplateError
from lmpress.data.messages import RowError, json_type, row_shape
from lmpress.vocabulary.embeddings import (
    CLASSIFYING_TASKS,
    Classification,
    EmbedRequest,
    EmbedResult,
    ScoreRequest,
    ScoreResult,
    Task,
    reward_of,
)
from lmpress.vocabulary.likelihood import LoglikelihoodResult, PerplexityResult
from lmpress.vocabulary.types import round_usd
from lmpress.wire.openai import pooling as wire
from lmpress.wire.openai.errors import ApiError
from lmpress.wire.openai.requests import validate_body

# The task an OpenAI Batch line's url asks for.
URL_TASKS: dict[str, Task] = {
    wire.EMBEDDINGS_PATH: "embed",
    **{path: "score" for path in wire.SCORE_PATHS},
    **{path: "rerank" for path in wire.RERANK_PATHS},
    wire.CLASSIFY_PATH: "classify",
    wire.POOLING_PATH: "reward",
}
URLS = tuple(URL_TASKS)


@dataclass
class PoolingInput:
    """What a row asks of an embed, score or rerank run."""

    task: Task  # the run's
    inputs: list[Any] | None = None  # embed, classify, reward: strings, or lists of token ids
    single: bool = True  # the row gave one input, and gets one `embedding` (label, reward)
    dimensions: int | None = None
    normalize: bool = False
    encoding_format: wire.EncodingFormat = "float"  # how an OpenAI Batch output line has it
    query: str | list[str] | None = None  # score and rerank; a list: pairwise (a score run)
    documents: list[str] | None = None
    top_n: int | None = None

    def request(self, rid: str) -> EmbedRequest | ScoreRequest:
        if self.task in INPUT_TASKS:
            assert self.inputs is not None
            return EmbedRequest(rid, self.inputs, self.dimensions, self.normalize)
        assert self.query is not None and self.documents is not None
        return ScoreRequest(rid, self.query, self.documents, self.top_n)


def row_input(raw: dict[str, Any], task: Task, mapping: RowMapping) -> PoolingInput:
    """A plain row's (or a table row's) input to an embed, score, rerank, classify or reward
    run."""
    if task in INPUT_TASKS:
        return _embed_input(raw, mapping, task)
    if any(key in raw for key in _SCORE_KEYS):
        body = {key: raw[key] for key in ("documents", *_SCORE_KEYS) if key in raw}
        score = _validate(wire.ScoreBody, body, "")
        return _score_input(task, *_checked(lambda: wire.score_pair(score)))
    if "query" in raw or "documents" in raw:
        body = {key: raw.get(key) for key in ("query", "documents", "top_n") if key in raw}
        return _rerank_input(task, _validate(wire.RerankBody, body, ""), "")
    raise RowError(
        f"{_shape_of(raw)} in {run_of(task)}; give 'query' and 'documents' (or 'queries' and "
        f"'documents', or 'text_1' and 'text_2')"
    )


# The tasks whose rows give texts (or token ids), each answered on its own.
INPUT_TASKS: tuple[Task, ...] = ("embed", *CLASSIFYING_TASKS)
# The keys only a score body has (its current form's and its older one's).
_SCORE_KEYS = ("queries", "text_1", "text_2")


def body_input(url: str, body: dict[str, Any]) -> PoolingInput:
    """An OpenAI Batch line's body to /v1/embeddings, a score url or a rerank url, read for
    the task its url asks."""
    task = URL_TASKS[url]
    if task in CLASSIFYING_TASKS:
        model = wire.ClassifyBody if task == "classify" else wire.PoolingBody
        parsed = _validate(model, body, "body.")
        inputs = _checked(lambda: wire.inputs_of(parsed, "body."))
        encoding = getattr(parsed, "encoding_format", None) or "float"
        return PoolingInput(task, inputs, _single(parsed.input), encoding_format=encoding)
    if task == "embed":
        parsed = _validate(wire.EmbeddingsBody, body, "body.")
        got = _checked(lambda: wire.embeddings_input(parsed, "body."))
        return PoolingInput(
            task,
            got.inputs,
            _single(parsed.input),
            got.dimensions,
            got.normalize,
            got.encoding_format,
        )
    if task == "score":
        score = _validate(wire.ScoreBody, body, "body.")
        return _score_input(task, *_checked(lambda: wire.score_pair(score, "body.")))
    return _rerank_input(task, _validate(wire.RerankBody, body, "body."), "body.")


def _rerank_input(task: Task, rerank: wire.RerankBody, where: str) -> PoolingInput:
    top_n = _checked(lambda: wire.top_n_of(rerank.top_n, where))
    return PoolingInput(task, query=rerank.query, documents=rerank.documents, top_n=top_n)


def _score_input(task: Task, query: str | list[str], documents: list[str]) -> PoolingInput:
    if task == "rerank" and isinstance(query, list):
        raise RowError(
            "the first texts are a list, scored pairwise with the second, which a rerank run "
            "cannot rank against one query; run it with --task score, or give one query"
        )
    return PoolingInput(task, query=query, documents=documents)


def task_url(task: Task) -> str:
    """The endpoint a plain row of this task is written as, in OpenAI Batch output lines."""
    paths = {
        "embed": wire.EMBEDDINGS_PATH,
        "score": wire.SCORE_PATH,
        "classify": wire.CLASSIFY_PATH,
        "reward": wire.POOLING_PATH,
    }
    return paths.get(task, wire.RERANK_PATH)


def wrong_task(kind: str, task: Task) -> RowError:
    """A generation row (chat, prompt, text...) in a pooling run, or the other way round."""
    return RowError(f"a {kind} row in {run_of(task)}; {_fits(task)}")


def run_of(task: Task) -> str:
    return f"an {task} run" if task == "embed" else f"a {task} run"


def _fits(task: Task) -> str:
    if task in INPUT_TASKS:
        return f"give 'input' (or --text-column COL), or an OpenAI Batch line to {task_url(task)}"
    if task in ("score", "rerank"):
        return "give 'query' and 'documents' (or 'queries' and 'documents')"
    return "this run generates text (--task embed, score, rerank, classify or reward runs the other rows)"


def _embed_input(raw: dict[str, Any], mapping: RowMapping, task: Task) -> PoolingInput:
    if mapping.text_column is not None:
        if mapping.text_column not in raw:
            raise RowError(f"row has no '{mapping.text_column}' (the --text-column)")
        value = raw[mapping.text_column]
        if not isinstance(value, str):
            raise RowError(f"'{mapping.text_column}' must be text, got {json_type(value)}")
        return PoolingInput(task, [value])
    if mapping.prompt_template is not None:
        try:
            return PoolingInput(task, [mapping.prompt(raw)])
        except TemplateError as exc:
            raise RowError(str(exc)) from None
    if "input" not in raw:
        raise wrong_task(_shape_of(raw).removeprefix("a ").removesuffix(" row"), task)
    parsed = _validate(wire.EmbeddingsBody, {"input": raw["input"]}, "")
    got = _checked(lambda: wire.embeddings_input(parsed))
    return PoolingInput(task, got.inputs, _single(parsed.input))


def _single(value: Any) -> bool:
    """An input of one text (or one list of token ids), which gets one `embedding`."""
    return isinstance(value, str) or all(isinstance(v, int) for v in value)


def _shape_of(raw: dict[str, Any]) -> str:
    return row_shape(raw, (("messages", "chat"), ("prompt", "prompt"), ("text", "text")))


def _validate(model: Any, body: dict[str, Any], where: str) -> Any:
    return _checked(lambda: validate_body(model, body, where))


def _checked(read: Any) -> Any:
    try:
        return read()
    except ApiError as exc:
        raise RowError(exc.message) from None


# --- output -------------------------------------------------------------------------------


def values(pooled: PoolingInput, result: EmbedResult | ScoreResult) -> dict[str, Any]:
    """What a row gets: its vectors, scores, ranked documents, classes or rewards."""
    if isinstance(result, EmbedResult) and pooled.task == "classify":
        classes = [
            vars(Classification.of(e.vector, result.labels or [])) for e in result.embeddings
        ]
        return classes[0] if pooled.single else {"classifications": classes}
    if isinstance(result, EmbedResult) and pooled.task == "reward":
        rewards = [reward_of(e.vector) for e in result.embeddings]
        return {"reward": rewards[0]} if pooled.single else {"rewards": rewards}
    if isinstance(result, EmbedResult):
        vectors = [wire.encoded(e.vector, "float") for e in result.embeddings]
        return {"embedding": vectors[0]} if pooled.single else {"embeddings": vectors}
    if pooled.task == "rerank":
        assert pooled.documents is not None
        return {"results": wire.rerank_results(result, pooled.documents, pooled.top_n)}
    return {"scores": list(result.scores)}


def meta(
    result: EmbedResult | ScoreResult | LoglikelihoodResult | PerplexityResult,
) -> dict[str, Any]:
    """The `response` record beside a pooling or likelihood row's values: usage, truncation
    (an embedding's), who made it, at what cost."""
    tokens = result.usage.prompt_tokens
    record: dict[str, Any] = {"usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
    if isinstance(result, EmbedResult):
        truncated = [e.truncated for e in result.embeddings]
        record["truncated"] = truncated[0] if len(truncated) == 1 else truncated
    record.update(model=result.model, engine=result.engine, latency_s=round(result.latency_s, 4))
    if result.cost_usd is not None:
        record["cost_usd"] = round_usd(result.cost_usd)
    if result.cached:
        record["cached"] = True
    return record


def openai_body(
    url: str, pooled: PoolingInput, result: EmbedResult | ScoreResult, model: str, rid: str
) -> dict[str, Any]:
    """The response body an OpenAI Batch output line carries, as serve answers it."""
    if isinstance(result, EmbedResult) and pooled.task == "classify":
        return wire.classify_response(rid, int(time.time()), result, model)
    if isinstance(result, EmbedResult) and pooled.task == "reward":
        return wire.pooling_response(rid, int(time.time()), result, model, pooled.encoding_format)
    if isinstance(result, EmbedResult):
        return wire.embeddings_response(result, model, pooled.encoding_format)
    if url in wire.RERANK_PATHS:
        assert pooled.documents is not None
        return wire.rerank_response(rid, result, pooled.documents, pooled.top_n, model)
    return wire.score_response(rid, int(time.time()), result, model)
