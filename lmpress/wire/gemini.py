"""Gemini's own generateContent wire, for its batch mode: a Request as a GenerateContentRequest
(the REST JSON a batch's input file holds, one per line) and a GenerateContentResponse as the
Reply the live GEMINI engine would have read from Google's OpenAI-compatible endpoint.

The live engine speaks chat completions and Google's compatibility layer translates; a batch
goes to the Batch API, which takes only Gemini's own requests, so the translation is ours, and
it follows the live one field by field:

- system (and developer) messages become `systemInstruction`; assistant turns are the "model"
  role; a tool's result is a `functionResponse` part named after the call it answers, its text
  as `{"result": ...}`, as Google's function-calling guide writes it; an earlier turn's thinking
  is never sent back (`engines/remote/reasoning.py` says why);
- images go inline (`inlineData`, base64), a local file read as the live engine reads it;
  http(s) and gs:// URLs go as `fileData` for Google to fetch;
- the generation fields GOOGLE_PARAMS lists go in `generationConfig`; a JSON schema as
  `responseJsonSchema`, tools' parameters as `parametersJsonSchema` (both take JSON Schema as
  written); `max_reasoning_tokens` as `thinkingConfig.thinkingBudget` with the thoughts asked
  for, and `reasoning_effort` as the budget Google's compatibility layer maps it to;
- a reply's thought parts are the sample's reasoning, its function calls tool calls, and its
  usage counts thinking inside the completion tokens, as lmpress's Usage does.

Nothing here imports an SDK: these are the JSON shapes themselves.
"""

from __future__ import annotations

import hashlib
import json
import mimetypes
from typing import Any

from lmpress.vocabulary.errors import ErrorKind, RequestError
from lmpress.vocabulary.types import FinishReason, Message, Request, Sample, ToolCall, Usage
from lmpress.wire.images import REMOTE_SCHEMES, base64_image
from lmpress.wire.replies import MalformedResponse, Reply

# The thinking budget Google's OpenAI compatibility layer gives each reasoning_effort.
EFFORT_BUDGETS = {"none": 0, "minimal": 1024, "low": 1024, "medium": 8192, "high": 24576}
# Gemini's finish reasons as lmpress's; any other (OTHER, LANGUAGE, MALFORMED_FUNCTION_CALL...)
# is a stop, as `wire.openai.replies.finish_reason` reads an unknown one.
FINISH: dict[str, FinishReason] = {
    "STOP": "stop", "MAX_TOKENS": "length", "SAFETY": "content_filter",
    "RECITATION": "content_filter", "BLOCKLIST": "content_filter",
    "PROHIBITED_CONTENT": "content_filter", "SPII": "content_filter",
    "IMAGE_SAFETY": "content_filter",
}  # fmt: skip
# google.rpc.Code, a per-row error's `code`, as the HTTP status the REST API answers with.
RPC_STATUS = {1: 499, 2: 500, 3: 400, 4: 504, 5: 404, 6: 409, 7: 403, 8: 429, 9: 400, 10: 409,
              11: 400, 12: 501, 13: 500, 14: 503, 15: 500, 16: 401}  # fmt: skip


def generate_content_request(request: Request) -> dict[str, Any]:
    """The GenerateContentRequest JSON for a chat request (the model is the batch's)."""
    if request.prompt is not None:
        raise RequestError(
            "GEMINI batch: a raw prompt (a /v1/completions line) has no generateContent form; "
            'give it as a chat turn ({"messages": ...} or {"prompt": ...} rows)',
            ErrorKind.INVALID_REQUEST,
        )
    body: dict[str, Any] = {}
    system = [m for m in request.messages if m.role in ("system", "developer")]
    if system:
        body["systemInstruction"] = {"parts": [{"text": m.text()} for m in system]}
    names = {call.id: call.name for m in request.messages for call in m.tool_calls or ()}
    body["contents"] = [_content(m, names) for m in request.messages if m not in system]
    config = _generation_config(request)
    if config:
        body["generationConfig"] = config
    if request.tools:
        declarations = []
        for tool in request.tools:
            function = tool["function"]
            declaration = {"name": function["name"]}
            if function.get("description"):
                declaration["description"] = function["description"]
            if function.get("parameters") is not None:
                declaration["parametersJsonSchema"] = function["parameters"]
            declarations.append(declaration)
        body["tools"] = [{"functionDeclarations": declarations}]
        choice = _tool_config(request)
        if choice is not None:
            body["toolConfig"] = {"functionCallingConfig": choice}
    return body


def _content(message: Message, names: dict[str, str]) -> dict[str, Any]:
    if message.role == "tool":
        name = names.get(message.tool_call_id or "")
        if name is None:
            raise RequestError(
                f"GEMINI batch: a tool message answers call {message.tool_call_id!r}, which no "
                "earlier assistant turn made; Gemini names a function's result by its call",
                ErrorKind.INVALID_REQUEST,
            )
        response = {"name": name, "response": {"result": message.text()}}
        if message.tool_call_id:
            response["id"] = message.tool_call_id
        return {"role": "user", "parts": [{"functionResponse": response}]}
    parts: list[dict[str, Any]] = []
    if isinstance(message.content, str):
        if message.content:
            parts.append({"text": message.content})
    else:
        for part in message.content:
            if part.type == "text":
                parts.append({"text": part.text or ""})
            else:
                parts.append(_image(part.image_url or ""))
    for call in message.tool_calls or ():
        try:
            args = json.loads(call.arguments or "{}")
        except ValueError as exc:
            raise RequestError(
                f"GEMINI batch: tool call {call.id}'s arguments are not JSON ({exc})",
                ErrorKind.INVALID_REQUEST,
            ) from None
        parts.append({"functionCall": {"id": call.id, "name": call.name, "args": args}})
    if not parts:
        parts.append({"text": ""})
    return {"role": "model" if message.role == "assistant" else "user", "parts": parts}


def _image(url: str) -> dict[str, Any]:
    if url.startswith(REMOTE_SCHEMES):
        mime = mimetypes.guess_type(url.split("?")[0])[0] or "image/jpeg"
        return {"fileData": {"mimeType": mime, "fileUri": url}}
    mime, data = base64_image(url)
    return {"inlineData": {"mimeType": mime, "data": data}}


def _generation_config(request: Request) -> dict[str, Any]:
    """The fields the live engine sends (`wire.openai.client.request_body`), in Gemini's
    names: the same defaults left out, temperature and the token limit always sent."""
    p = request.params
    config: dict[str, Any] = {"maxOutputTokens": p.max_new_tokens, "temperature": p.temperature}
    if p.top_p != 1.0:
        config["topP"] = p.top_p
    if p.presence_penalty:
        config["presencePenalty"] = p.presence_penalty
    if p.frequency_penalty:
        config["frequencyPenalty"] = p.frequency_penalty
    if p.stop_strings:
        config["stopSequences"] = list(p.stop_strings)
    if p.seed is not None:
        config["seed"] = p.seed
    if p.n != 1:
        config["candidateCount"] = p.n
    guided = p.guided_decoding
    if guided is not None:
        config["responseMimeType"] = "application/json"
        if not guided.is_any_json_object():
            config["responseJsonSchema"] = dict(guided.json)
    if p.max_reasoning_tokens is not None:
        # As the live engine asks through extra_body: the thoughts too, unless thinking is off.
        thinking: dict[str, Any] = {"thinkingBudget": p.max_reasoning_tokens}
        if p.max_reasoning_tokens:
            thinking["includeThoughts"] = True
        config["thinkingConfig"] = thinking
    elif p.reasoning_effort is not None:
        config["thinkingConfig"] = {"thinkingBudget": EFFORT_BUDGETS[p.reasoning_effort]}
    return config


def _tool_config(request: Request) -> dict[str, Any] | None:
    p = request.params
    if not p.parallel_tool_calls:
        raise RequestError(
            "GEMINI batch: generation.parallel_tool_calls false has no generateContent "
            "field; drop it, or drop --provider-batch to run live",
            ErrorKind.INVALID_REQUEST,
        )
    choice = p.tool_choice
    if choice is None:
        return None
    if choice == "auto":
        return {"mode": "AUTO"}
    if choice == "none":
        return {"mode": "NONE"}
    if choice == "required":
        return {"mode": "ANY"}
    name = (choice.get("function") or {}).get("name") if isinstance(choice, dict) else None
    return {"mode": "ANY", "allowedFunctionNames": [name]}


# --- reading replies ---------------------------------------------------------------------------


def parse_generate_content(data: Any, model: str = "") -> Reply:
    """A GenerateContentResponse's candidates as samples, its usage and model."""
    if not isinstance(data, dict):
        raise MalformedResponse(f"expected a JSON object, got {type(data).__name__}")
    candidates = data.get("candidates")
    if not isinstance(candidates, list) or not candidates:
        blocked = (data.get("promptFeedback") or {}).get("blockReason")
        why = f"the prompt was blocked ({blocked})" if blocked else "the reply has no candidates"
        raise MalformedResponse(why)
    samples: list[tuple[int, Sample]] = []
    for candidate in candidates:
        if not isinstance(candidate, dict):
            raise MalformedResponse("a candidate is not an object")
        index = candidate.get("index")
        samples.append((index if isinstance(index, int) else len(samples), _sample(candidate)))
    samples.sort(key=lambda pair: pair[0])
    usage = _usage(data.get("usageMetadata") or {})
    if len(samples) == 1:
        samples[0][1].completion_tokens = usage.completion_tokens
        samples[0][1].reasoning_tokens = usage.reasoning_tokens
    return Reply([s for _, s in samples], usage, data.get("modelVersion") or model)


def _sample(candidate: dict[str, Any]) -> Sample:
    texts, thoughts, calls = [], [], []
    parts = (candidate.get("content") or {}).get("parts") or []
    for part in parts:
        if not isinstance(part, dict):
            raise MalformedResponse("a content part is not an object")
        if "functionCall" in part:
            calls.append(_call(part["functionCall"], len(calls)))
        elif isinstance(part.get("text"), str):
            (thoughts if part.get("thought") else texts).append(part["text"])
    sample = Sample("".join(texts), FINISH.get(candidate.get("finishReason") or "STOP", "stop"))
    if thoughts:
        sample.reasoning = "".join(thoughts)
    if calls:
        sample.tool_calls = calls
        if sample.finish_reason == "stop":
            sample.finish_reason = "tool_calls"
    return sample


def _call(call: Any, index: int) -> ToolCall:
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        raise MalformedResponse("a functionCall has no name")
    arguments = json.dumps(call.get("args") or {}, ensure_ascii=False)
    call_id = call.get("id")
    if not isinstance(call_id, str) or not call_id:
        # Gemini's Developer API leaves the id out; one stable for the same call stands in.
        digest = hashlib.sha256(f"{index}:{call['name']}:{arguments}".encode()).hexdigest()
        call_id = f"call_{digest[:24]}"
    return ToolCall(call_id, call["name"], arguments)


def _usage(usage: dict[str, Any]) -> Usage:
    """A usageMetadata: the prompt's cached share (`cachedContentTokenCount`) is inside it."""
    thoughts = int(usage.get("thoughtsTokenCount") or 0)
    answer = int(usage.get("candidatesTokenCount") or 0)
    cached = int(usage.get("cachedContentTokenCount") or 0)
    prompt = int(usage.get("promptTokenCount") or 0)
    return Usage(prompt, answer + thoughts, thoughts, cached_tokens=cached)


def row_error(error: Any) -> tuple[int, str]:
    """A batch row's google.rpc.Status as (HTTP status, message)."""
    if not isinstance(error, dict):
        return 500, str(error)
    code = error.get("code")
    status = RPC_STATUS.get(code, 500) if isinstance(code, int) else 500
    return status, str(error.get("message") or error.get("status") or f"code {code}")
