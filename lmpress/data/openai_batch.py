"""The OpenAI Batch file format, both ways, as read by the OpenAI Batch API and `vllm run-batch`.

Request line:  {"custom_id", "method": "POST", "url": "/v1/chat/completions", "body": {...}}
(or /v1/completions; /v1/embeddings, score and rerank lines are `data.pooling_rows`)
Output line:   {"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}

A line's body is read by `wire.openai.requests` and its output body built by
`wire.openai.responses`, the code `lmpress serve` runs for the same endpoint, so a body means
the same in a batch file as in an HTTP request. Its sampling parameters override the recipe for
that row.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from lmpress.data.messages import RowError
from lmpress.vocabulary.errors import ErrorKind
from lmpress.vocabulary.types import Result
from lmpress.wire.openai import requests
from lmpress.wire.openai.errors import HTTP_STATUS, ApiError

CHAT_URL = requests.CHAT_PATH
COMPLETIONS_URL = requests.COMPLETIONS_PATH
URLS = (CHAT_URL, COMPLETIONS_URL)


def is_batch_request(raw: dict[str, Any]) -> bool:
    """A line meant as an OpenAI Batch request: with its custom_id, or with all of method, url
    and body (one that lacks its custom_id fails as such, not as a row of no known shape)."""
    if "custom_id" in raw:
        return "body" in raw or "url" in raw or "method" in raw
    return {"method", "url", "body"} <= raw.keys()


def body_sampling(body: dict[str, Any], url: str) -> requests.Sampling:
    """Generation overrides (and tools) from a request body, as serve reads the same body;
    what serve refuses is refused, naming the argument."""
    if body.get("stream"):
        raise RowError("body.stream: streaming is not available in a batch file")
    try:
        if url == COMPLETIONS_URL:
            completion = requests.validate_body(requests.CompletionBody, body, "body.")
            return requests.completion_sampling(completion, "body.")
        chat = requests.validate_body(requests.ChatCompletionBody, body, "body.")
        return requests.chat_sampling(chat, "body.")
    except ApiError as exc:
        raise RowError(exc.message) from exc


def body_prompt(body: dict[str, Any]) -> str | list[int]:
    """A completions line's one prompt: a text or token ids (or a list of just one of either),
    read as serve reads a body's prompts."""
    try:
        prompts = requests.completion_prompts(
            requests.CompletionBody.model_construct(prompt=body.get("prompt")), "body."
        )
    except ApiError as exc:
        raise RowError(exc.message) from exc
    if len(prompts) != 1:
        raise RowError(f"body.prompt holds {len(prompts)} prompts; give one prompt per line")
    return prompts[0]


def render_output(
    custom_id: str,
    url: str,
    result: Result,
    model: str,
    echo: str | list[int] | None = None,
    logprobs: bool = False,
) -> dict[str, Any]:
    """A successful output line, its body the chat.completion (or text_completion) serve
    would answer; `echo` is the prompt a completions body asked to have echoed, with its
    tokens' logprobs where the body asked for `logprobs` too."""
    # Imported here: their models come from the openai package, most of a second to import,
    # which a job whose rows are not OpenAI Batch lines never needs.
    from lmpress.wire.openai import responses
    from lmpress.wire.openai.prompt_logprobs import Echo, echo_of

    created = int(time.time())
    if url == COMPLETIONS_URL:
        echoed = Echo() if echo is None else echo_of(echo, result, None, logprobs)
        body = responses.text_completion(f"cmpl-{_hex()}", created, model, [result], [echoed])
    else:
        body = responses.chat_completion(f"chatcmpl-{_hex()}", created, model, result)
    return render_body(custom_id, body)


def render_body(custom_id: str, body: dict[str, Any]) -> dict[str, Any]:
    """A successful output line carrying a response body already built (embeddings, scores)."""
    return {
        "id": f"batch_req_{_hex()}",
        "custom_id": custom_id,
        "response": {"status_code": 200, "request_id": _hex(), "body": body},
        "error": None,
    }


def render_error(custom_id: str | None, kind: str, message: str, status: int | None) -> dict:
    """A failed request as the OpenAI Batch API writes it to its error file, with the status
    serve would answer."""
    if status is None:
        status = HTTP_STATUS[ErrorKind(kind)]
    return {
        "id": f"batch_req_{_hex()}",
        "custom_id": custom_id,
        "response": {"status_code": status, "request_id": _hex(), "body": None},
        "error": {"code": str(kind), "message": message},
    }


def _hex() -> str:
    return uuid.uuid4().hex
