"""What one row of an output says, for each kind of line lmpress (or lm-eval) writes: the few
facts the index keeps of every row (`facts`), the line a table shows (`summary`), and the whole
row as the page draws it (`detail`).

The kinds, and the writers they follow:
- batch:    a generated row (`data.row_shapes._render_lmpress`): the input with the reply
            appended and a `response` record (`data.response_records`); embed, score and
            likelihood rows carry their values and a `response` record without text
- openai:   an OpenAI Batch output line (`data.openai_batch.render_output`): the reply in
            `response.body`, an error in `error`
- errors:   an OUT.errors.jsonl line (`data.row_shapes.render_failure`), lmpress's or OpenAI's
- journal:  a Parquet output's journal line (`data.parquet_out.journal_line`), read while the
            job runs and OUT.parquet is not written yet
- parquet:  a row of a Parquet output (`data.parquet_out`'s columns: `response` is the text)
- pipeline: a pipeline's dataset or step row: the columns as the steps left them
- rejects:  a pipeline's rejects line: `key`, `step`, `failed` or `dropped`, `row`
- eval:     an lm-eval samples line: `doc`, `arguments`, `resps`, the metrics

Every function takes the row as parsed (a dict) and never raises on a row of another shape:
what a row does not say is None.
"""

from __future__ import annotations

import json
import math
from enum import Enum
from typing import Any

from lmpress.data.row_shapes import output_row_id
from lmpress.vocabulary.errors import ErrorKind

PREVIEW_CHARS = 200


class RowKind(str, Enum):
    BATCH = "batch"
    OPENAI = "openai"
    ERRORS = "errors"
    JOURNAL = "journal"
    PARQUET = "parquet"
    PIPELINE = "pipeline"
    REJECTS = "rejects"
    EVAL = "eval"


class Status(int, Enum):
    """A row's status as the index stores it (one byte)."""

    OK = 0
    FAILED = 1
    DROPPED = 2  # a pipeline's filter or dedupe dropped it
    PENDING = 3  # its line is indexed, its facts not read yet (index.py reads them behind)

    @property
    def word(self) -> str:
        return self.name.lower()


# The index's per-row facts, in this order (`facts` returns a tuple of them).
# `text` is what compare sets side by side: the reply, or why the row failed.
FACTS = (
    "id", "status", "cached", "error_kind", "model", "step", "finish_reason",
    "prompt_tokens", "completion_tokens", "latency_s", "cost_usd", "text",
)  # fmt: skip
UNREADABLE = ErrorKind.INVALID_JSON.value  # a line that is no JSON object


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else -1


def _float(value: Any) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return math.nan


def _openai_body(row: dict[str, Any]) -> dict[str, Any]:
    return _dict(_dict(row.get("response")).get("body"))


def _response(kind: RowKind, row: dict[str, Any]) -> dict[str, Any]:
    """The `response` record of a batch or journal row (a Parquet row is its own)."""
    if kind is RowKind.PARQUET:
        return row
    return _dict(row.get("response"))


def _error(kind: RowKind, row: dict[str, Any]) -> dict[str, Any] | None:
    """{"kind", "message", "status"?} where the row failed; None where it did not."""
    if kind in (RowKind.PIPELINE, RowKind.EVAL):
        return None
    if kind is RowKind.PARQUET:
        if row.get("error_kind") is None:
            return None
        return {"kind": row.get("error_kind"), "message": row.get("error_message")}
    if kind is RowKind.REJECTS:
        reason = row.get("failed", row.get("dropped"))
        return {"kind": _reject_kind(row), "message": _text(reason) or ""}
    if kind in (RowKind.OPENAI, RowKind.ERRORS) and "custom_id" in row:
        error = row.get("error")
        status = _dict(row.get("response")).get("status_code")
        if not isinstance(error, dict) and status in (None, 200):
            return None
        error = _dict(error)
        return {"kind": error.get("code"), "message": error.get("message"), "status": status}
    if kind is RowKind.ERRORS:
        return _dict(row.get("error")) or {"kind": None, "message": ""}
    # A journal line's `error`; a generated row's response record has one only where the
    # engine said so beside a reply.
    error = row.get("error") if kind is RowKind.JOURNAL else _dict(row.get("response")).get("error")
    return error if isinstance(error, dict) else None


def _reject_kind(row: dict[str, Any]) -> str:
    verb = "failed" if "failed" in row else "dropped"
    return f"{verb} at {row.get('step', '?')}"


def facts(
    kind: RowKind,
    row: Any,
    step: str | None = None,
    model: str | None = None,
    id_column: str | None = None,
) -> tuple:
    """The row's facts in `FACTS` order; `step` and `model` are the part's, where it names
    them (a pipeline's step file, a --models part); `id_column`: the column the job took its
    rows' ids from (`batch --id-column`), which is then the row's id, as the job's own."""
    if not isinstance(row, dict):
        return (None, Status.FAILED, False, UNREADABLE, model, step, None, -1, -1, math.nan,
                math.nan, "")  # fmt: skip
    error = _error(kind, row)
    status = Status.OK if error is None else Status.FAILED
    said = str(error.get("message") or "") if error is not None else None
    if kind is RowKind.REJECTS:
        status = Status.FAILED if "failed" in row else Status.DROPPED
        return (_text(row.get("key")), status, False, error["kind"], model, _text(row.get("step")),
                None, -1, -1, math.nan, math.nan, said)  # fmt: skip
    if kind in (RowKind.EVAL, RowKind.PIPELINE):
        if kind is RowKind.EVAL:
            rid = f"{step}/{row.get('doc_id')}" if step else str(row.get("doc_id"))
            text = _eval_reply(row)
        else:
            rid, text = output_row_id(row), json.dumps(row, sort_keys=True, ensure_ascii=False)
        return (rid, Status.OK, False, None, model, step, None, -1, -1, math.nan, math.nan, text)
    if kind is RowKind.OPENAI or (kind is RowKind.ERRORS and "custom_id" in row):
        body = _openai_body(row)
        usage = _dict(body.get("usage"))
        choices = body.get("choices")
        first = _dict(choices[0]) if isinstance(choices, list) and choices else {}
        named = model or _text(row.get("model")) or _text(body.get("model"))
        text = said if said is not None else _text(_dict(first.get("message")).get("content"))
        return (_text(row.get("custom_id")), status, False, _text(_dict(error).get("kind")),
                named, step, _text(first.get("finish_reason")),
                _int(usage.get("prompt_tokens")), _int(usage.get("completion_tokens")),
                math.nan, math.nan, text)  # fmt: skip
    response = _response(kind, row)
    usage = _dict(response.get("usage")) if kind is not RowKind.PARQUET else response
    rid = _text(row.get("id")) if kind is RowKind.JOURNAL else output_row_id(row, id_column)
    # A --models part is its model's; a merged --models output marks each row with its
    # model; otherwise the model that answered.
    named = model or (_text(row.get("model")) if kind is not RowKind.PARQUET else None)
    named = named or _text(response.get("model"))
    if said is None:
        said = _text(response.get("response" if kind is RowKind.PARQUET else "text"))
    return (rid, status, response.get("cached") is True, _text(_dict(error).get("kind")),
            named, step, _text(response.get("finish_reason")),
            _int(usage.get("prompt_tokens")), _int(usage.get("completion_tokens")),
            _float(response.get("latency_s")), _float(response.get("cost_usd")), said)  # fmt: skip


# --- the reply and the conversation ---------------------------------------------------------


def _json_text(value: Any) -> Any:
    """A Parquet column that holds JSON as text, parsed; anything else as it is."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def reply(kind: RowKind, row: dict[str, Any]) -> dict[str, Any]:
    """The reply as the page draws it: text, reasoning, tool calls, structured output,
    logprobs and why it finished."""
    out: dict[str, Any] = dict.fromkeys(
        ("text", "reasoning", "tool_calls", "structured", "logprobs", "finish_reason")
    )
    if kind in (RowKind.OPENAI, RowKind.ERRORS):
        choices = _openai_body(row).get("choices")
        first = _dict(choices[0]) if isinstance(choices, list) and choices else {}
        message = _dict(first.get("message"))
        text = message.get("content", first.get("text"))
        logprobs = _dict(first.get("logprobs")).get("content")
        out.update(
            text=text if isinstance(text, str) else None,
            reasoning=_text(message.get("reasoning_content")) or _text(message.get("reasoning")),
            tool_calls=message.get("tool_calls") or None,
            finish_reason=_text(first.get("finish_reason")),
            logprobs=_logprobs(logprobs),
        )
        return out
    if kind is RowKind.EVAL:
        out["text"] = _eval_reply(row)
        return out
    if kind in (RowKind.PIPELINE, RowKind.REJECTS):
        return out
    response = _response(kind, row)
    text = response.get("text") if kind is not RowKind.PARQUET else response.get("response")
    if not isinstance(text, str):
        text = _values_text(row)
    out.update(
        text=text,
        reasoning=_text(response.get("reasoning")),
        tool_calls=_json_text(response.get("tool_calls")) or None,
        structured=_json_text(response.get("structured")),
        finish_reason=_text(response.get("finish_reason")),
        logprobs=_logprobs(_json_text(response.get("logprobs"))),
    )
    return out


def _logprobs(value: Any) -> list[dict[str, Any]] | None:
    if not isinstance(value, list):
        return None
    return [
        {"token": _dict(t).get("token"), "logprob": _dict(t).get("logprob")}
        for t in value
        if isinstance(t, dict)
    ]


# What an embed, score, classify, reward or likelihood row holds instead of a reply's text.
VALUE_KEYS = ("label", "reward", "rewards", "scores", "results", "classifications",
              "loglikelihood", "perplexity", "embedding", "embeddings")  # fmt: skip


def _values_text(row: dict[str, Any]) -> str | None:
    columns = _dict(row.get("columns")) or row
    for key in VALUE_KEYS:
        if key in columns:
            value = columns[key]
            if key in ("embedding", "embeddings") and isinstance(value, list):
                return f"{key}: {len(value)} values"
            return f"{key}: {json.dumps(value, ensure_ascii=False)[:PREVIEW_CHARS]}"
    return None


def _eval_reply(row: dict[str, Any]) -> str:
    """A generation task's answer; a multiple-choice task's choices by log-likelihood."""
    filtered = row.get("filtered_resps")
    if not isinstance(filtered, list):
        return ""
    if all(isinstance(r, str) for r in filtered):
        return "\n".join(filtered)
    choices = _dict(row.get("doc")).get("choices")
    lines = []
    for i, resp in enumerate(filtered):
        if isinstance(resp, list) and resp:
            name = choices[i] if isinstance(choices, list) and i < len(choices) else f"#{i}"
            lines.append(f"{name}: {resp[0]}")
    return "\n".join(lines)


def messages(kind: RowKind, row: dict[str, Any]) -> list[dict[str, Any]]:
    """The conversation the row asked (the reply drawn apart, from `reply`)."""
    if kind is RowKind.EVAL:
        arguments = _dict(row.get("arguments"))
        first = _dict(next(iter(arguments.values()), None))
        prompt = first.get("arg_0")
        return [{"role": "user", "content": prompt}] if isinstance(prompt, str) else []
    if kind is RowKind.JOURNAL:
        row = _dict(row.get("columns"))
    if kind is RowKind.REJECTS:
        row = _dict(row.get("row"))
    found = _json_text(row.get("messages"))
    if isinstance(found, list):
        turns = [m for m in found if isinstance(m, dict)]
        if turns and turns[-1].get("role") == "assistant" and kind is not RowKind.PARQUET:
            turns = turns[:-1]  # the reply, appended by the writer
        return turns
    if isinstance(row.get("prompt"), str):
        system = [{"role": "system", "content": row["system"]}] if row.get("system") else []
        return [*system, {"role": "user", "content": row["prompt"]}]
    body = _dict(row.get("body"))
    if isinstance(body.get("messages"), list):
        return [m for m in body["messages"] if isinstance(m, dict)]
    return []


def judge(kind: RowKind, row: dict[str, Any]) -> dict[str, Any] | None:
    """A judge's verdict (a pipeline's judge step: `score` and `explanation`, with any
    prefix), or an eval sample's metric."""
    if kind is RowKind.EVAL:
        metrics = row.get("metrics")
        names = [m for m in metrics if m in row] if isinstance(metrics, list) else []
        if not names:
            return None
        said = ", ".join(f"{m}={row[m]}" for m in names)
        return {"score": _float(row[names[0]]), "explanation": said}
    columns = _dict(row.get("row")) if kind is RowKind.REJECTS else row
    for key, value in columns.items():
        if isinstance(key, str) and key.endswith("score") and isinstance(value, (int, float)):
            prefix = key[: -len("score")]
            explanation = columns.get(f"{prefix}explanation")
            return {"score": value, "explanation": _text(explanation)}
    return None


def summary(kind: RowKind, row: Any) -> str:
    """The first characters of the reply, or of the error, for the rows table."""
    if not isinstance(row, dict):
        return ""
    error = _error(kind, row)
    if error is not None:
        text = str(error.get("message") or error.get("kind") or "")
    else:
        text = reply(kind, row)["text"] or ""
        if not text and kind is RowKind.PIPELINE:
            text = json.dumps(row, ensure_ascii=False)
    return text[:PREVIEW_CHARS]


def detail(kind: RowKind, row: Any) -> dict[str, Any]:
    """The row as /api/row gives it (without `n`, `id`, `status` and `raw`)."""
    if not isinstance(row, dict):
        return {"messages": [], "reply": reply(kind, {}), "judge": None,
                "error": {"kind": UNREADABLE, "message": "the line is no JSON object"},
                "response": None}  # fmt: skip
    error = _error(kind, row)
    if error is not None:
        line = row.get("line")
        error = {
            "kind": error.get("kind"),
            "message": error.get("message"),
            "line": line if isinstance(line, int) else None,
        }
    if kind is RowKind.PARQUET:
        response: Any = {k: v for k, v in row.items() if k not in ("messages",)}
    elif kind is RowKind.OPENAI or kind is RowKind.ERRORS:
        response = row.get("response")
    elif kind in (RowKind.PIPELINE, RowKind.EVAL):
        response = row
    elif kind is RowKind.REJECTS:
        response = row.get("row")
    else:
        response = row.get("response")
    return {
        "messages": messages(kind, row),
        "reply": reply(kind, row),
        "judge": judge(kind, row),
        "error": error,
        "response": response,
    }
