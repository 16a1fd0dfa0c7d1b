"""The OpenAI Batch file format, both ways, as read by the OpenAI Batch API and `vllm run-batch`.

Request line:  {"custom_id", "method": "POST", "url": "/v1/chat/completions", "body": {...}}
Output line:   {"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}
The body's sampling parameters override the recipe for that row.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from lmpress.types import Result

CHAT_URL = "/v1/chat/completions"
COMPLETIONS_URL = "/v1/completions"
URLS = (CHAT_URL, COMPLETIONS_URL)

# body key -> generation field; values pass through unchanged unless converted below.
BODY_PARAMS = {
    "max_tokens": "max_new_tokens",
    "max_completion_tokens": "max_new_tokens",
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "stop": "stop_strings",
    "stop_token_ids": "stop_token_ids",
    "seed": "seed",
    "n": "n",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "repetition_penalty": "repetition_penalty",
    "min_tokens": "min_tokens",
    "logprobs": "logprobs",
    "top_logprobs": "top_logprobs",
    "skip_special_tokens": "skip_special_tokens",
}
# Accepted and without effect on what is generated.
IGNORED_BODY_KEYS = {"model", "user", "stream", "metadata", "store", "messages", "prompt"}


def is_batch_request(raw: dict[str, Any]) -> bool:
    return "custom_id" in raw and ("body" in raw or "url" in raw or "method" in raw)


def body_overrides(body: dict[str, Any], url: str) -> dict[str, Any]:
    """Generation overrides from a request body; unknown keys are refused, not dropped."""
    from lmpress.data.formats import RowError

    overrides: dict[str, Any] = {}
    for key, value in body.items():
        if key in IGNORED_BODY_KEYS:
            continue
        if key not in BODY_PARAMS:
            raise RowError(f"body.{key} is not supported by lmpress")
        if value is None:
            continue
        field = BODY_PARAMS[key]
        if key == "stop" and isinstance(value, str):
            value = [value]
        if key == "logprobs" and url == COMPLETIONS_URL and not isinstance(value, bool):
            # /v1/completions takes logprobs as the number of alternatives to show.
            overrides["logprobs"] = True
            overrides["top_logprobs"] = value
            continue
        overrides[field] = value
    if body.get("stream"):
        raise RowError("body.stream: streaming is not available in a batch file")
    return overrides


def render_output(custom_id: str, url: str, result: Result, model: str) -> dict[str, Any]:
    """A successful output line with an OpenAI chat.completion (or text_completion) body."""
    created = int(time.time())
    usage = {
        "prompt_tokens": result.usage.prompt_tokens,
        "completion_tokens": result.usage.completion_tokens,
        "total_tokens": result.usage.total_tokens,
    }
    if url == COMPLETIONS_URL:
        choices = [
            {
                "index": i,
                "text": sample.text,
                "logprobs": _completion_logprobs(sample),
                "finish_reason": sample.finish_reason,
            }
            for i, sample in enumerate(result.samples)
        ]
        body = {"id": f"cmpl-{_hex()}", "object": "text_completion", "created": created,
                "model": model, "choices": choices, "usage": usage}  # fmt: skip
    else:
        choices = [
            {
                "index": i,
                "message": {"role": "assistant", "content": sample.text},
                "logprobs": _chat_logprobs(sample),
                "finish_reason": sample.finish_reason,
            }
            for i, sample in enumerate(result.samples)
        ]
        body = {"id": f"chatcmpl-{_hex()}", "object": "chat.completion", "created": created,
                "model": model, "choices": choices, "usage": usage}  # fmt: skip
    return {
        "id": f"batch_req_{_hex()}",
        "custom_id": custom_id,
        "response": {"status_code": 200, "request_id": _hex(), "body": body},
        "error": None,
    }


def render_error(custom_id: str | None, kind: str, message: str, status: int | None) -> dict:
    """A failed request as the OpenAI Batch API writes it to its error file."""
    return {
        "id": f"batch_req_{_hex()}",
        "custom_id": custom_id,
        "response": {"status_code": status or 400, "request_id": _hex(), "body": None},
        "error": {"code": kind, "message": message},
    }


def _chat_logprobs(sample) -> dict[str, Any] | None:
    if sample.logprobs is None:
        return None
    return {
        "content": [
            {
                "token": t.token,
                "logprob": t.logprob,
                "bytes": list(t.token.encode("utf-8")),
                "top_logprobs": [
                    {"token": tok, "logprob": lp, "bytes": list(tok.encode("utf-8"))}
                    for tok, lp in t.top
                ],
            }
            for t in sample.logprobs
        ]
    }


def _completion_logprobs(sample) -> dict[str, Any] | None:
    if sample.logprobs is None:
        return None
    return {
        "tokens": [t.token for t in sample.logprobs],
        "token_logprobs": [t.logprob for t in sample.logprobs],
        "top_logprobs": [dict(t.top) for t in sample.logprobs],
    }


def _hex() -> str:
    return uuid.uuid4().hex
