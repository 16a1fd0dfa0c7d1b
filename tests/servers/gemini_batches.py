"""Gemini's batch mode on the loopback server, as the Gemini API reference and the google-genai
SDK speak it (`batch_api` routes to it; the SDK, pointed at the server, drives it):

    POST /upload/v1beta/files            resumable upload: `X-Goog-Upload-Command: start` with
                                         {"file": {...}} answers an `x-goog-upload-url`; posts
                                         there (`upload`, then `upload, finalize`) send the bytes
    GET  /v1beta/files/{id}:download     a file's bytes (`?alt=media`)
    POST /v1beta/models/{model}:batchGenerateContent   {"batch": {"displayName",
                                         "inputConfig": {"fileName"}}} -> an Operation
    GET  /v1beta/batches/{id}            the Operation: `metadata` is the GenerateContentBatch
                                         (state BATCH_STATE_*, batchStats, output.responsesFile)
    GET  /v1beta/batches                 {"operations": [...], "nextPageToken"}, newest first
    POST /v1beta/batches/{id}:cancel     {}

A batch is pending for a step, running while its rows finish, then succeeded; a batch told to
fail validation (`BatchFaults.invalid`) fails with an Operation error, one told to expire ends
EXPIRED with no results, as Google documents, and one stuck never leaves running. Its results
file has a line per row, in an order of its own: `{"key", "response": GenerateContentResponse}`
or `{"key", "error": {"code", "message", "status"}}` (google.rpc.Status).

Each row is answered by the server's own rules (`batch_store.row`), which read chat bodies: a
GenerateContentRequest is read back into the chat body Google's OpenAI-compatible endpoint
would have been sent for it (`chat_body`), and the chat completion turned into the
GenerateContentResponse Gemini writes (`gemini_response`): so a row gets, by batch, what a live
GEMINI request for the same conversation gets, and a test can compare the two.
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from typing import Any

from tests.servers.batch_life import ENDED, Row, Run
from tests.servers.batch_store import (
    Answer,
    BatchStore,
    Refused,
    Request,
    json_answer,
    json_object,
    jsonl,
    shuffled,
    token,
)

MAX_FILE_BYTES = 2 * 2**30
# The REST statuses Google's errors carry, by HTTP status.
GOOGLE_STATUS = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED",
                 404: "NOT_FOUND", 409: "ALREADY_EXISTS", 413: "INVALID_ARGUMENT",
                 429: "RESOURCE_EXHAUSTED", 500: "INTERNAL", 503: "UNAVAILABLE"}  # fmt: skip
RPC_CODE = {400: 3, 401: 16, 403: 7, 404: 5, 409: 6, 413: 3, 422: 3, 429: 8, 500: 13, 503: 14}
STATES = {"validating": "PENDING", "in_progress": "RUNNING", "finalizing": "RUNNING",
          "cancelling": "RUNNING", "completed": "SUCCEEDED", "failed": "FAILED",
          "expired": "EXPIRED", "cancelled": "CANCELLED"}  # fmt: skip
# How the loopback server writes Gemini's thought summaries on chat completions (`replies`).
THOUGHT_OPEN, THOUGHT_CLOSE = "<thought>", "</thought>"
FINISH = {"stop": "STOP", "length": "MAX_TOKENS", "tool_calls": "STOP",
          "content_filter": "SAFETY"}  # fmt: skip


def error_body(status: int, message: str) -> dict[str, Any]:
    """An error reply as Google's APIs write one."""
    return {"error": {"code": status, "message": message,
                      "status": GOOGLE_STATUS.get(status, "UNKNOWN")}}  # fmt: skip


# --- Files -----------------------------------------------------------------------------------


def upload(store: BatchStore, request: Request) -> Answer:
    """Both steps of a resumable upload, told apart by their X-Goog-Upload-Command."""
    command = request.headers.get("x-goog-upload-command", "")
    if command == "start":
        if request.headers.get("x-goog-upload-protocol") != "resumable":
            raise Refused(400, "only the resumable upload protocol is served here")
        store.upload_attempt()
        meta = json_object(request.raw).get("file") or {}
        size = int(request.headers.get("x-goog-upload-header-content-length") or 0)
        limit = store.faults.max_file_bytes or MAX_FILE_BYTES
        if size > limit:
            raise Refused(400, f"File is too large: {size} bytes; at most {limit}.")
        session = token(20)
        store.uploads[session] = {"meta": meta, "data": b"", "size": size}
        url = (
            f"{request.base_url}/upload/v1beta/files?upload_id={session}&upload_protocol=resumable"
        )
        return Answer(
            200, b"", headers={"x-goog-upload-url": url, "x-goog-upload-status": "active"}
        )
    session = store.uploads.get(request.query.get("upload_id", ""))
    if session is None:
        raise Refused(404, "no such upload session")
    offset = int(request.headers.get("x-goog-upload-offset") or -1)
    if offset != len(session["data"]):
        raise Refused(
            400, f"X-Goog-Upload-Offset {offset}: the session holds {len(session['data'])}"
        )
    session["data"] += request.raw
    if "finalize" not in command:
        return Answer(200, b"", headers={"x-goog-upload-status": "active"})
    del store.uploads[request.query["upload_id"]]
    meta = session["meta"]
    file = store.store_file(session["data"], meta.get("displayName") or "upload", "batch")
    store.server.stats.files_uploaded += 1
    return Answer(200, json.dumps({"file": _file_object(file, request.base_url)}).encode(),
                  headers={"x-goog-upload-status": "final"})  # fmt: skip


def download(store: BatchStore, request: Request, file_id: str) -> Answer:
    file = _file(store, file_id)
    if file.purpose != "batch_output":
        raise Refused(400, f"files/{file_id} was uploaded; only generated files can be downloaded")
    return Answer(200, file.data, "application/octet-stream")


def get_file(store: BatchStore, request: Request, file_id: str) -> Answer:
    return json_answer(200, _file_object(_file(store, file_id), request.base_url))


# --- Batches ---------------------------------------------------------------------------------


def create(store: BatchStore, request: Request, model: str) -> Answer:
    batch = json_object(request.raw).get("batch")
    if not isinstance(batch, dict):
        raise Refused(400, "batch: an object is required")
    source = batch.get("inputConfig") or {}
    name = source.get("fileName")
    if not isinstance(name, str) or not name.startswith("files/"):
        raise Refused(400, "batch.inputConfig.fileName: the name of an uploaded file is required")
    file = _file(store, name.removeprefix("files/"))
    rows, errors = _read_input(store, file.data, model)
    fields = {"model": f"models/{model}", "displayName": batch.get("displayName") or "",
              "inputConfig": {"fileName": name}}  # fmt: skip
    run = store.new_run(False, rows, fields, gemini=True)
    if not errors and run.ordinal in store.faults.invalid:
        errors = [{"code": 3, "message": "Enqueued token limit reached (injected)."}]
    if errors:
        run.rows, run.errors = [], errors
    store.accept(run)
    return json_answer(200, _operation(store, run, request.base_url))


def get_batch(store: BatchStore, request: Request, batch_id: str) -> Answer:
    return json_answer(200, _operation(store, _run(store, batch_id), request.base_url))


def list_batches(store: BatchStore, request: Request) -> Answer:
    runs = [run for run in reversed(store.runs.values()) if run.gemini]
    try:
        size = int(request.query.get("pageSize", 50))
        start = int(request.query.get("pageToken") or 0)
    except ValueError:
        raise Refused(400, "pageSize and pageToken must be integers here") from None
    found = runs[start : start + size]
    body: dict[str, Any] = {"operations": [_operation(store, r, request.base_url) for r in found]}
    if start + size < len(runs):
        body["nextPageToken"] = str(start + size)
    return json_answer(200, body)


def cancel(store: BatchStore, request: Request, batch_id: str) -> Answer:
    store.cancel(_run(store, batch_id))
    return json_answer(200, {})


def _run(store: BatchStore, batch_id: str) -> Run:
    run = store.runs.get(f"batches/{batch_id}")
    if run is None:
        raise Refused(404, f"Batch batches/{batch_id} not found.")
    return run


def _file(store: BatchStore, file_id: str) -> Any:
    file = store.files.get(file_id)
    if file is None:
        raise Refused(404, f"File files/{file_id} not found.")
    return file


def _read_input(store: BatchStore, data: bytes, model: str) -> tuple[list[Row], list[dict]]:
    """The rows of an input file (a line that is not a keyed request fails on its own, as a
    row), and what fails the whole batch."""
    lines = [line for line in data.decode("utf-8", errors="replace").splitlines() if line.strip()]
    if not lines:
        return [], [{"code": 3, "message": "The input file is empty."}]
    rows = []
    for number, line in enumerate(lines, 1):
        try:
            item = json.loads(line)
        except ValueError:
            item = None
        key = item.get("key") if isinstance(item, dict) else None
        body = item.get("request") if isinstance(item, dict) else None
        if not isinstance(key, str) or not isinstance(body, dict):
            message = f'line {number}: a line is {{"key": string, "request": object}}'
            rows.append(Row(str(key or f"line-{number}"), 400, error_body(400, message), "", ""))
            continue
        try:
            chat = chat_body(body, model)
        except (KeyError, TypeError, ValueError) as exc:
            rows.append(Row(key, 400, error_body(400, f"Invalid request: {exc}"), "", ""))
            continue
        rows.append(store.row(key, chat, "/v1/chat/completions", anthropic=False))
    return rows, []


def _operation(store: BatchStore, run: Run, base_url: str) -> dict[str, Any]:
    now = time.time()
    status = run.status(now)
    ended = status in ENDED
    if ended and run.files is None:
        run.files = (_write_results(store, run, status, now), None)
    ok, failed = run.counts(now)
    total = len(run.rows)
    meta: dict[str, Any] = {
        "@type": "type.googleapis.com/google.ai.generativelanguage.v1beta.GenerateContentBatch",
        "name": run.id, **run.request, "createTime": _rfc3339(run.created),
        "updateTime": _rfc3339(now), "state": f"BATCH_STATE_{STATES[status]}",
        "batchStats": {"requestCount": str(total), "successfulRequestCount": str(ok),
                       "failedRequestCount": str(failed),
                       "pendingRequestCount": str(0 if ended else total - ok - failed)},
    }  # fmt: skip
    operation: dict[str, Any] = {"name": run.id, "metadata": meta, "done": ended}
    if ended:
        meta["endTime"] = _rfc3339(run.at(status, now))
    if run.files and run.files[0]:
        meta["output"] = {"responsesFile": f"files/{run.files[0]}"}
        operation["response"] = {
            "@type": "type.googleapis.com/google.ai.generativelanguage.v1beta."
            "GenerateContentBatchOutput", "responsesFile": f"files/{run.files[0]}",
        }  # fmt: skip
    if status == "failed":
        operation["error"] = run.errors[0]
    return operation


def _write_results(store: BatchStore, run: Run, status: str, now: float) -> str | None:
    """An ended batch's results file: none for one that failed or expired (Google keeps no
    results of an expired batch); a cancelled one's holds the rows it ran."""
    if status in ("failed", "expired"):
        return None
    lines = []
    for row, done in shuffled(run, zip(run.rows, run.done(now), strict=True)):
        if not done:
            continue
        if row.status == 200:
            lines.append({"key": row.custom_id, "response": gemini_response(row.body)})
        else:
            error = row.body.get("error") or {}
            lines.append({"key": row.custom_id, "error": {
                "code": RPC_CODE.get(row.status, 2), "message": error.get("message", ""),
                "status": GOOGLE_STATUS.get(row.status, "UNKNOWN")}})  # fmt: skip
    if not lines:
        return None
    return store.store_file(jsonl(lines), f"batch-{run.id[8:]}", "batch_output").id


def _file_object(file: Any, base_url: str) -> dict[str, Any]:
    generated = file.purpose == "batch_output"
    out = {"name": f"files/{file.id}", "displayName": file.filename,
           "mimeType": "application/jsonl" if generated else "jsonl",
           "sizeBytes": str(len(file.data)), "createTime": _rfc3339(file.created),
           "state": "ACTIVE", "uri": f"{base_url}/v1beta/files/{file.id}",
           "source": "GENERATED" if generated else "UPLOADED"}  # fmt: skip
    if generated:
        out["downloadUri"] = f"{base_url}/download/v1beta/files/{file.id}:download?alt=media"
    return out


def _rfc3339(t: float | None) -> str | None:
    if t is None:
        return None
    return datetime.fromtimestamp(t, timezone.utc).isoformat().replace("+00:00", "Z")


# --- Gemini's wire read back into chat completions, and the reply written out as Gemini's ---


def chat_body(request: dict[str, Any], model: str) -> dict[str, Any]:
    """The chat-completions body Google's OpenAI-compatible endpoint takes for what a
    GenerateContentRequest asks; fields it does not know are refused, as Google refuses them."""
    known = {"contents", "systemInstruction", "generationConfig", "tools", "toolConfig", "model",
             "safetySettings"}  # fmt: skip
    unknown = set(request) - known
    if unknown:
        raise ValueError(f"Unknown name {sorted(unknown)[0]!r}: Cannot find field.")
    messages: list[dict[str, Any]] = []
    system = request.get("systemInstruction")
    if system:
        messages.append({"role": "system", "content": "".join(p["text"] for p in system["parts"])})
    for content in request["contents"]:
        messages.extend(_messages(content))
    body: dict[str, Any] = {"model": model, "messages": messages}
    config = request.get("generationConfig") or {}
    names = {"maxOutputTokens": "max_tokens", "temperature": "temperature", "topP": "top_p",
             "presencePenalty": "presence_penalty", "frequencyPenalty": "frequency_penalty",
             "stopSequences": "stop", "seed": "seed", "candidateCount": "n"}  # fmt: skip
    for name, value in config.items():
        if name in names:
            body[names[name]] = value
        elif name == "responseJsonSchema":
            body["response_format"] = {"type": "json_schema",
                                       "json_schema": {"name": "response", "schema": value}}  # fmt: skip
        elif name == "responseMimeType":
            if value != "application/json":
                raise ValueError(f"responseMimeType {value!r} is not served here")
            body.setdefault("response_format", {"type": "json_object"})
        elif name == "thinkingConfig":
            thinking = {"thinking_budget": value["thinkingBudget"]}
            if value.get("includeThoughts"):
                thinking["include_thoughts"] = True
            body["extra_body"] = {"google": {"thinking_config": thinking}}
        else:
            raise ValueError(f"generationConfig.{name} is not served here")
    if request.get("tools"):
        body["tools"] = [
            {"type": "function", "function": {
                "name": d["name"], **({"description": d["description"]} if "description" in d
                                       else {}),
                **({"parameters": d["parametersJsonSchema"]} if "parametersJsonSchema" in d
                   else {})}}
            for tool in request["tools"] for d in tool["functionDeclarations"]
        ]  # fmt: skip
        calling = (request.get("toolConfig") or {}).get("functionCallingConfig")
        if calling:
            mode = calling["mode"]
            if calling.get("allowedFunctionNames"):
                name = calling["allowedFunctionNames"][0]
                body["tool_choice"] = {"type": "function", "function": {"name": name}}
            else:
                body["tool_choice"] = {"AUTO": "auto", "NONE": "none", "ANY": "required"}[mode]
    return body


def _messages(content: dict[str, Any]) -> list[dict[str, Any]]:
    role = {"user": "user", "model": "assistant"}[content["role"]]
    parts = content["parts"]
    responses = [p["functionResponse"] for p in parts if "functionResponse" in p]
    if responses:
        return [{"role": "tool", "tool_call_id": r.get("id") or r["name"],
                 "content": r["response"].get("result", json.dumps(r["response"]))}
                for r in responses]  # fmt: skip
    calls = [p["functionCall"] for p in parts if "functionCall" in p]
    pieces: list[dict[str, Any]] = []
    for part in parts:
        if "text" in part:
            pieces.append({"type": "text", "text": part["text"]})
        elif "inlineData" in part:
            data = part["inlineData"]
            url = f"data:{data['mimeType']};base64,{data['data']}"
            pieces.append({"type": "image_url", "image_url": {"url": url}})
        elif "fileData" in part:
            pieces.append({"type": "image_url", "image_url": {"url": part["fileData"]["fileUri"]}})
    images = any(p["type"] == "image_url" for p in pieces)
    text = "".join(p.get("text", "") for p in pieces)
    message: dict[str, Any] = {"role": role, "content": pieces if images else text}
    if calls:
        message["content"] = text or None
        message["tool_calls"] = [
            {"id": c.get("id") or c["name"], "type": "function",
             "function": {"name": c["name"], "arguments": json.dumps(c.get("args") or {})}}
            for c in calls
        ]  # fmt: skip
    return [message]


def gemini_response(completion: dict[str, Any]) -> dict[str, Any]:
    """A chat completion as the GenerateContentResponse Gemini writes: thought summaries as
    thought parts, tool calls as functionCall parts (with no id: Gemini's Developer API gives
    none), usage as usageMetadata with the thinking counted apart."""
    candidates = []
    for choice in completion["choices"]:
        message = choice["message"]
        text = message.get("content") or ""
        parts: list[dict[str, Any]] = []
        if text.startswith(THOUGHT_OPEN) and THOUGHT_CLOSE in text:
            thought, _, text = text[len(THOUGHT_OPEN) :].partition(THOUGHT_CLOSE)
            parts.append({"text": thought, "thought": True})
        if text:
            parts.append({"text": text})
        for call in message.get("tool_calls") or ():
            function = call["function"]
            parts.append({"functionCall": {"name": function["name"],
                                           "args": json.loads(function["arguments"])}})  # fmt: skip
        candidates.append({"content": {"role": "model", "parts": parts},
                           "finishReason": FINISH[choice["finish_reason"]],
                           "index": choice["index"]})  # fmt: skip
    usage = completion["usage"]
    thoughts = (usage.get("completion_tokens_details") or {}).get("reasoning_tokens", 0)
    metadata = {"promptTokenCount": usage["prompt_tokens"],
                "candidatesTokenCount": usage["completion_tokens"] - thoughts,
                "totalTokenCount": usage["total_tokens"]}  # fmt: skip
    if thoughts:
        metadata["thoughtsTokenCount"] = thoughts
    return {"candidates": candidates, "usageMetadata": metadata,
            "modelVersion": completion["model"], "responseId": token(16)}  # fmt: skip
