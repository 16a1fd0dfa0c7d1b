"""OpenAI's Files and Batches endpoints on the loopback server (`batch_api` routes to them).

An input file is read when its batch is created; the batch reports what it found after a step of
validating, as OpenAI does: `failed`, with `errors.data` naming each line's problem, or on to
in_progress, where `request_counts` grow as rows finish. The output and error files are written
when the batch ends (completed, expired or cancelled), each only if it has a line:

    output file: {"id": "batch_req_…", "custom_id": …, "error": null,
                  "response": {"status_code": 200, "request_id": "req_…", "body": <completion>}}
                 (an /v1/embeddings batch's body is the embeddings list a live request gets)
    error file:  the same with "status_code": 4xx/5xx and "body": {"error": {…}}; or, for a row a
                 cancel or an expiry left undone, "response": null and
                 "error": {"code": "batch_cancelled" | "batch_expired", "message": …}

Validation failure codes: invalid_json_line, invalid_request (a missing or wrong custom_id,
method or body, named in `param`), duplicate_custom_id, url_mismatch, model_mismatch, empty_file,
too_many_tasks, and token_limit_exceeded for the injected failure (`BatchFaults.invalid`).
A row a cancel or an expiry left undone counts in neither `completed` nor `failed`.
"""

from __future__ import annotations

import re
import time
from typing import Any

from tests.servers.batch_life import ENDED, Row, Run
from tests.servers.batch_store import (
    DAY_S,
    Answer,
    BatchStore,
    File,
    Refused,
    Request,
    json_answer,
    json_object,
    jsonl,
    line_object,
    page,
    shuffled,
)

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
MAX_REQUESTS, MAX_FILE_BYTES = 50_000, 200 * 2**20
# The error of a row a cancel or an expiry left undone, by how the batch ended.
UNDONE = {
    "cancelled": ("batch_cancelled", "This request was not executed because the batch was cancelled."),
    "expired": ("batch_expired", "This request could not be executed before the completion window expired."),
}  # fmt: skip


# --- Files -----------------------------------------------------------------------------------


def upload_file(store: BatchStore, request: Request) -> Answer:
    store.upload_attempt()
    parts = _multipart(request.content_type, request.raw)
    if "file" not in parts:
        raise Refused(400, "Missing required parameter: 'file'.", "file")
    purpose = parts.get("purpose", (None, b""))[1].decode()
    if purpose != "batch":
        raise Refused(400, f"purpose: {purpose!r} is not one this server serves; use 'batch'.",
                      "purpose")  # fmt: skip
    filename, data = parts["file"]
    limit = store.faults.max_file_bytes or MAX_FILE_BYTES
    if len(data) > limit:
        raise Refused(400, f"File is too large: {len(data)} bytes, and a batch input file may "
                      f"have at most {limit}.", "file")  # fmt: skip
    file = store.store_file(data, filename or "upload.jsonl", "batch")
    store.server.stats.files_uploaded += 1
    return json_answer(200, _file_object(file))


def get_file(store: BatchStore, request: Request, file_id: str) -> Answer:
    return json_answer(200, _file_object(store.file(file_id)))


def file_content(store: BatchStore, request: Request, file_id: str) -> Answer:
    return Answer(200, store.file(file_id).data, "application/octet-stream")


def delete_file(store: BatchStore, request: Request, file_id: str) -> Answer:
    del store.files[store.file(file_id).id]
    return json_answer(200, {"id": file_id, "object": "file", "deleted": True})


# --- Batches ---------------------------------------------------------------------------------


def create_batch(store: BatchStore, request: Request) -> Answer:
    body = json_object(request.raw)
    if body.get("completion_window") != "24h":
        raise Refused(400, "completion_window: only '24h' is supported.", "completion_window")
    endpoint = body.get("endpoint")
    if endpoint not in ENDPOINTS:
        raise Refused(400, f"endpoint: {endpoint!r} is not one this server batches; use one of "
                      f"{', '.join(ENDPOINTS)}.", "endpoint")  # fmt: skip
    if body.get("metadata") is not None and not _metadata_ok(body["metadata"]):
        raise Refused(400, "metadata: at most 16 keys, strings of at most 64 and 512 characters.",
                      "metadata")  # fmt: skip
    file_id = str(body.get("input_file_id"))
    file = store.files.get(file_id)
    if file is None:
        raise Refused(404, f"No such File object: {file_id}", "input_file_id")
    if file.purpose != "batch":
        raise Refused(400, f"File {file_id} was not uploaded for purpose 'batch'.",
                      "input_file_id")  # fmt: skip
    rows, errors = _read_input(store, file.data, endpoint)
    fields = {"endpoint": endpoint, "input_file_id": file_id, "completion_window": "24h",
              "metadata": body.get("metadata")}  # fmt: skip
    run = store.new_run(False, rows, fields)
    if not errors and run.ordinal in store.faults.invalid:
        errors = [_line_error("token_limit_exceeded", None, "Enqueued token limit reached "
                              "(injected). Try again later.")]  # fmt: skip
    if errors:
        run.rows, run.errors = [], errors
    store.accept(run)
    return json_answer(200, _batch_object(store, run))


def list_batches(store: BatchStore, request: Request) -> Answer:
    runs = [run for run in reversed(store.runs.values()) if not run.anthropic]
    found, more = page(runs, request.query, "after", None, 100)
    return json_answer(200, {"object": "list", "data": [_batch_object(store, r) for r in found],
                             "first_id": found[0].id if found else None,
                             "last_id": found[-1].id if found else None, "has_more": more})  # fmt: skip


def get_batch(store: BatchStore, request: Request, batch_id: str) -> Answer:
    return json_answer(200, _batch_object(store, store.run(batch_id, anthropic=False)))


def cancel_batch(store: BatchStore, request: Request, batch_id: str) -> Answer:
    run = store.cancel(store.run(batch_id, anthropic=False))
    return json_answer(200, _batch_object(store, run))


def _read_input(
    store: BatchStore, data: bytes, endpoint: str
) -> tuple[list[Row], list[dict[str, Any]]]:
    """The rows of an input file, and what fails validation in it."""
    lines = data.decode("utf-8", errors="replace").splitlines()
    limit = store.faults.max_requests_per_batch or MAX_REQUESTS
    if not lines:
        return [], [_line_error("empty_file", None, "The input file is empty.")]
    if len(lines) > limit:
        return [], [_line_error("too_many_tasks", None, f"The input file has {len(lines)} "
                                f"requests; a batch may have at most {limit}.")]  # fmt: skip
    rows: list[Row] = []
    errors: list[dict[str, Any]] = []
    seen: set[str] = set()
    models: set[Any] = set()
    for number, line in enumerate(lines, 1):
        item = line_object(line)
        problem = _input_problem(item, endpoint, seen, models)
        if problem:
            code, message, param = problem
            errors.append(_line_error(code, number, message, param))
            continue
        assert item is not None
        seen.add(item["custom_id"])
        models.add(item["body"].get("model"))
        rows.append(store.row(item["custom_id"], item["body"], endpoint, anthropic=False))
    return rows, errors


def _input_problem(
    item: dict[str, Any] | None, endpoint: str, seen: set[str], models: set[Any]
) -> tuple[str, str, str | None] | None:
    """(code, message, param) for a line of an input file that fails validation, or None."""
    if item is None:
        return "invalid_json_line", "This line is not parseable as valid JSON.", None
    custom_id = item.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return "invalid_request", "custom_id: a non-empty string is required.", "custom_id"
    if custom_id in seen:
        return "duplicate_custom_id", f"The custom_id '{custom_id}' is used more than once.", None
    if item.get("method") != "POST":
        return "invalid_request", "method: only POST is supported.", "method"
    if item.get("url") != endpoint:
        message = f"url: {item.get('url')!r} is not the batch's endpoint, {endpoint}."
        return "url_mismatch", message, "url"
    if not isinstance(item.get("body"), dict):
        return "invalid_request", "body: an object is required.", "body"
    if models and item["body"].get("model") not in models:
        return "model_mismatch", "Every request in a batch must use the same model.", "body.model"
    return None


def _batch_object(store: BatchStore, run: Run) -> dict[str, Any]:
    now = time.time()
    status = run.status(now)
    if status in ENDED and run.files is None:
        run.files = _write_outputs(store, run, status, now)
    ok, failed = run.counts(now)
    output_file_id, error_file_id = run.files or (None, None)

    def at(name: Any) -> int | None:
        t = run.at(name, now)
        return None if t is None else int(t)

    return {
        "id": run.id, "object": "batch", "endpoint": run.request["endpoint"],
        "errors": {"object": "list", "data": run.errors} if run.errors else None,
        "input_file_id": run.request["input_file_id"],
        "completion_window": run.request["completion_window"], "status": status,
        "output_file_id": output_file_id, "error_file_id": error_file_id,
        "created_at": int(run.created), "in_progress_at": at("in_progress"),
        "expires_at": int(run.created) + DAY_S, "finalizing_at": at("finalizing"),
        "completed_at": at("completed"), "failed_at": at("failed"), "expired_at": at("expired"),
        "cancelling_at": at("cancelling"), "cancelled_at": at("cancelled"),
        "request_counts": {"total": 0 if status in ("validating", "failed") else len(run.rows),
                           "completed": ok, "failed": failed},
        "metadata": run.request["metadata"],
    }  # fmt: skip


def _write_outputs(
    store: BatchStore, run: Run, status: str, now: float
) -> tuple[str | None, str | None]:
    """The ids of an ended batch's output and error files, written as OpenAI writes them."""
    if status == "failed":
        return None, None
    output, errors = [], []
    for row, done in shuffled(run, zip(run.rows, run.done(now), strict=True)):
        line: dict[str, Any] = {"id": row.id, "custom_id": row.custom_id, "response": None,
                                "error": None}  # fmt: skip
        if done:
            line["response"] = {"status_code": row.status, "request_id": row.request_id,
                                "body": row.body}  # fmt: skip
        else:
            code, message = UNDONE[status]
            line["error"] = {"code": code, "message": message}
        (output if done and row.status == 200 else errors).append(line)
    ids = [store.store_file(jsonl(lines), f"batch_{run.id}_{kind}.jsonl", "batch_output").id
           if lines else None for lines, kind in ((output, "output"), (errors, "error"))]  # fmt: skip
    return ids[0], ids[1]


def _file_object(file: File) -> dict[str, Any]:
    return {"id": file.id, "object": "file", "bytes": len(file.data),
            "created_at": int(file.created), "filename": file.filename, "purpose": file.purpose,
            "status": "processed", "status_details": None, "expires_at": None}  # fmt: skip


def _line_error(code: str, line: int | None, message: str, param: str | None = None) -> dict:
    return {"code": code, "line": line, "message": message, "param": param}


def _metadata_ok(metadata: Any) -> bool:
    return isinstance(metadata, dict) and len(metadata) <= 16 and all(
        isinstance(k, str) and len(k) <= 64 and isinstance(v, str) and len(v) <= 512
        for k, v in metadata.items()
    )  # fmt: skip


def _multipart(content_type: str, raw: bytes) -> dict[str, tuple[str | None, bytes]]:
    """The parts of a multipart/form-data body: name -> (filename, bytes)."""
    found = re.search(r'boundary="?([^";]+)"?', content_type)
    if not found:
        raise Refused(400, "the body is not multipart/form-data")
    parts = {}
    for chunk in raw.split(b"--" + found.group(1).encode())[1:-1]:
        head, _, data = chunk.partition(b"\r\n\r\n")
        name = re.search(rb'[; ]name="([^"]*)"', head)
        filename = re.search(rb'filename="([^"]*)"', head)
        if name:
            data = data[:-2] if data.endswith(b"\r\n") else data
            parts[name.group(1).decode()] = (filename.group(1).decode() if filename else None, data)
    return parts
