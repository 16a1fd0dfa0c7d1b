"""What the loopback server refuses, and how it words a refusal on either wire: shared by the live
endpoints (`llm_server`) and the batch endpoints (`batch_api`), so a body a live request is refused
for fails the same way inside a batch."""

from __future__ import annotations

import json
from typing import Any

from tests.servers import embeddings, reasoning_replies, request_types, tool_replies

# The error `type` each status carries, as the providers spell it.
_KINDS = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "not_found_error", 413: "request_too_large", 422: "invalid_request_error",
          429: "rate_limit_error", 529: "overloaded_error"}  # fmt: skip


def error_type(status: int) -> str:
    return _KINDS.get(status, "api_error")


def error_body(
    status: int, message: str, anthropic: bool, param: str | None = None
) -> dict[str, Any]:
    """The JSON body of an error reply, as OpenAI or Anthropic sends it."""
    if anthropic:
        return {"type": "error", "error": {"type": error_type(status), "message": message}}
    return {"error": {"message": message, "type": error_type(status), "param": param,
                      "code": None}}  # fmt: skip


def conversation(body: dict[str, Any]) -> str:
    """The text fault markers are looked for in, and faults keyed by: the messages (or prompt,
    or an embeddings body's input, or a score body's texts)."""
    text = body.get("messages", body.get("prompt", body.get("input")))
    if text is None and "text_1" in body:  # a /v1/score body
        text = [body["text_1"], body.get("text_2")]
    return json.dumps(text, sort_keys=True)


def permanent_status(conversation: str, permanent: dict[str, int]) -> int | None:
    """The status a conversation always fails with, when it holds one of the `permanent` markers."""
    for marker, status in permanent.items():
        if marker in conversation:
            return status
    return None


def request_problem(
    body: dict[str, Any], path: str, anthropic: bool, extensions: frozenset[str] = frozenset(),
    reasoning: str | None = None,
) -> str | None:  # fmt: skip
    """What the real API answers 400 to in a chat (or completion, or Messages) body sent to
    `path`, or None: first what the SDK's request type does not allow (`request_types`; the
    fields in `extensions` aside), then what the API refuses in a body of the right shape
    (the reasoning provider it plays, `Faults.reasoning`, included)."""
    if path.rstrip("/").endswith("/score"):  # vLLM's own endpoint: no SDK type to check
        return embeddings.score_problem(body)
    problem = request_types.body_problem(body, request_types.endpoint(path, anthropic), extensions)
    if problem:
        return problem
    if request_types.endpoint(path, anthropic) == "embeddings":
        return embeddings.problem(body)
    if not body.get("model"):
        return "model: field required"
    if anthropic:
        if not isinstance(body.get("max_tokens"), int):
            return "max_tokens: field required"
        messages = body.get("messages") or []
        if not messages or messages[0].get("role") != "user":
            return "messages: the first message must use the user role"
        for a, b in zip(messages, messages[1:], strict=False):
            if a.get("role") == b.get("role"):
                return "messages: roles must alternate between user and assistant"
        if any(m.get("role") not in ("user", "assistant") for m in messages):
            return "messages: role must be user or assistant (system goes in 'system')"
        return reasoning_replies.anthropic_problem(body) or tool_replies.anthropic_problem(body)
    if "messages" in body and not body["messages"]:
        return "messages: must not be empty"
    return reasoning_replies.openai_problem(body, reasoning) or tool_replies.openai_problem(body)
