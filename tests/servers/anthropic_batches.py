"""Anthropic's Message Batches endpoints on the loopback server (`batch_api` routes to them).

A batch is checked as a whole when it is created (a bad or repeated custom_id, too many requests,
too many bytes: 400 or 413), and each request's params when it runs, as Anthropic does: a body the
live Messages endpoint refuses comes back `errored`. `request_counts` holds every request in
`processing` until the whole batch ends, as the reference says. Results, one line per request,
in an order of their own:

    {"custom_id": …, "result": {"type": "succeeded", "message": <Message>}}
    {"custom_id": …, "result": {"type": "errored", "error": {"type": "error",
                                "error": {"type": …, "message": …}, "request_id": "req_…"}}}
    {"custom_id": …, "result": {"type": "canceled"}}   or   {"type": "expired"}
"""

from __future__ import annotations

import re
import time
from datetime import datetime, timezone
from typing import Any

from tests.servers.batch_life import ENDED, Run
from tests.servers.batch_store import (
    DAY_S,
    Answer,
    BatchStore,
    Refused,
    Request,
    json_answer,
    json_object,
    jsonl,
    page,
    shuffled,
)

MAX_REQUESTS, MAX_BYTES = 100_000, 256 * 2**20
CUSTOM_ID = re.compile(r"[a-zA-Z0-9_-]{1,64}")


def create(store: BatchStore, request: Request) -> Answer:
    store.upload_attempt()
    limit = store.faults.max_file_bytes or MAX_BYTES
    if len(request.raw) > limit:
        raise Refused(413, f"Request exceeds the maximum allowed number of bytes ({limit}).")
    requests = json_object(request.raw).get("requests")
    if not isinstance(requests, list) or not requests:
        raise Refused(400, "requests: a non-empty list is required")
    most = store.faults.max_requests_per_batch or MAX_REQUESTS
    if len(requests) > most:
        raise Refused(400, f"requests: {len(requests)} requests; a batch may have at most {most}")
    seen: set[str] = set()
    for i, item in enumerate(requests):
        custom_id = item.get("custom_id") if isinstance(item, dict) else None
        if not isinstance(custom_id, str) or not CUSTOM_ID.fullmatch(custom_id):
            raise Refused(400, f"requests.{i}.custom_id: must match ^[a-zA-Z0-9_-]{{1,64}}$")
        if custom_id in seen:
            raise Refused(400, f"requests.{i}.custom_id: '{custom_id}' is not unique in this batch")
        if not isinstance(item.get("params"), dict):
            raise Refused(400, f"requests.{i}.params: an object is required")
        seen.add(custom_id)
    rows = [store.row(r["custom_id"], r["params"], "/v1/messages", anthropic=True)
            for r in requests]  # fmt: skip
    run = store.new_run(True, rows, {})
    store.accept(run)
    return json_answer(200, _message_batch(run, request.base_url))


def list_batches(store: BatchStore, request: Request) -> Answer:
    runs = [run for run in reversed(store.runs.values()) if run.anthropic]
    found, more = page(runs, request.query, "after_id", "before_id", 1000)
    return json_answer(200, {"data": [_message_batch(r, request.base_url) for r in found],
                             "has_more": more, "first_id": found[0].id if found else None,
                             "last_id": found[-1].id if found else None})  # fmt: skip


def retrieve(store: BatchStore, request: Request, batch_id: str) -> Answer:
    return json_answer(200, _message_batch(store.run(batch_id, anthropic=True), request.base_url))


def cancel(store: BatchStore, request: Request, batch_id: str) -> Answer:
    run = store.cancel(store.run(batch_id, anthropic=True))
    return json_answer(200, _message_batch(run, request.base_url))


def delete(store: BatchStore, request: Request, batch_id: str) -> Answer:
    run = store.run(batch_id, anthropic=True)
    if run.status(time.time()) not in ENDED:
        raise Refused(400, f"Message Batch {batch_id} is still processing: cancel it and wait "
                      "for it to end before deleting it.")  # fmt: skip
    del store.runs[batch_id]
    return json_answer(200, {"id": batch_id, "type": "message_batch_deleted"})


def results(store: BatchStore, request: Request, batch_id: str) -> Answer:
    run = store.run(batch_id, anthropic=True)
    now = time.time()
    status = run.status(now)
    if status not in ENDED:
        raise Refused(404, f"Message Batch {batch_id} has not ended; it has no results yet.")
    lines = []
    for row, done in shuffled(run, zip(run.rows, run.done(now), strict=True)):
        if not done:
            result: dict[str, Any] = {"type": "canceled" if status == "cancelled" else "expired"}
        elif row.status == 200:
            result = {"type": "succeeded", "message": row.body}
        else:
            result = {"type": "errored", "error": {**row.body, "request_id": row.request_id}}
        lines.append({"custom_id": row.custom_id, "result": result})
    return Answer(200, jsonl(lines), "application/binary")


def _message_batch(run: Run, base_url: str) -> dict[str, Any]:
    now = time.time()
    status = run.status(now)
    ended = status in ENDED
    counts = {"processing": 0 if ended else len(run.rows), "succeeded": 0, "errored": 0,
              "canceled": 0, "expired": 0}  # fmt: skip
    if ended:
        ok, failed = run.counts(now)
        counts.update(succeeded=ok, errored=failed)
        counts["canceled" if status == "cancelled" else "expired"] = len(run.rows) - ok - failed
    processing = "ended" if ended else "canceling" if status == "cancelling" else "in_progress"
    return {
        "id": run.id, "type": "message_batch", "processing_status": processing,
        "request_counts": counts, "ended_at": _rfc3339(run.at(status, now)) if ended else None,
        "created_at": _rfc3339(run.created), "expires_at": _rfc3339(run.created + DAY_S),
        "archived_at": None, "cancel_initiated_at": _rfc3339(run.cancel_at),
        "results_url": f"{base_url}/v1/messages/batches/{run.id}/results" if ended else None,
    }  # fmt: skip


def _rfc3339(t: float | None) -> str | None:
    if t is None:
        return None
    return datetime.fromtimestamp(t, timezone.utc).isoformat().replace("+00:00", "Z")
