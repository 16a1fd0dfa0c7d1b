"""What the loopback server's batch endpoints share: the files and batches they hold, how a row's
outcome is decided, and the request, answer and refusal every route deals in. The routes
themselves are in `openai_batches`, `anthropic_batches` and `gemini_batches`; `batch_api`
dispatches to them."""

from __future__ import annotations

import hashlib
import json
import secrets
import string
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from tests.servers import embeddings, refusals
from tests.servers.batch_life import CANCELLABLE, BatchFaults, Row, Run
from tests.servers.replies import Reply

if TYPE_CHECKING:
    from tests.servers.llm_server import LLMServer

DAY_S = 24 * 3600


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    content_type: str
    raw: bytes
    base_url: str  # how the client reached this server, for Anthropic's results_url
    headers: dict[str, str] = field(default_factory=dict)  # lower-cased names


@dataclass
class Answer:
    status: int
    body: bytes
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)


class Refused(Exception):
    """An error reply: raised anywhere in a route, answered in the route's wire's words."""

    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param


@dataclass
class File:
    id: str
    data: bytes
    filename: str
    purpose: str
    created: float


class BatchStore:
    """The files and batches of one server. Routes run under the server's lock (`batch_api`),
    so the store, and the stats it keeps, need none of their own."""

    def __init__(self, server: LLMServer):
        self.server = server
        self.files: dict[str, File] = {}
        self.runs: dict[str, Run] = {}  # in creation order
        self._created = 0  # batches created, every wire: a batch's ordinal
        self._uploads = 0
        self.uploads: dict[str, dict[str, Any]] = {}  # Gemini's resumable upload sessions

    @property
    def faults(self) -> BatchFaults:
        return self.server.faults.batch

    def upload_attempt(self) -> None:
        """Count an upload; refuse it while `upload_failures` lasts."""
        self._uploads += 1
        self.server.stats.upload_attempts += 1
        if self._uploads <= self.faults.upload_failures:
            status = self.faults.upload_failure_status
            raise Refused(status, f"the upload failed (injected {status}); try again")

    def store_file(self, data: bytes, filename: str, purpose: str) -> File:
        file = File(f"file-{token(22)}", data, filename, purpose, time.time())
        self.files[file.id] = file
        return file

    def file(self, file_id: str) -> File:
        if file_id not in self.files:
            raise Refused(404, f"No such File object: {file_id}", "id")
        return self.files[file_id]

    def row(self, custom_id: str, body: dict[str, Any], url: str, anthropic: bool) -> Row:
        """What one request of a batch comes to, by the rules of a live request to `url`."""
        faults = self.server.faults
        problem = refusals.request_problem(
            body, url, anthropic, faults.extensions, faults.reasoning
        )
        if anthropic and body.get("stream"):
            problem = "stream: not supported in a Message Batch"
        status = 400 if problem else refusals.permanent_status(
            refusals.conversation(body), faults.permanent)  # fmt: skip
        if status is None and url.endswith("/embeddings"):
            out, status = embeddings.reply(body, faults.model), 200
        elif status is None:
            reply = Reply.of(
                body, anthropic, faults.model, faults.reasoning, self.server.prompt_cache
            )
            out = reply.anthropic() if anthropic else reply.openai(url)
            out["id"] = f"msg_01{token(24)}" if anthropic else f"chatcmpl-{token(29)}"
            status = 200
        else:
            message = problem or f"this conversation is refused (injected {status})"
            out = refusals.error_body(status, message, anthropic)
        return Row(custom_id, status, out, f"batch_req_{secrets.token_hex(16)}",
                   f"req_{secrets.token_hex(12)}")  # fmt: skip

    def new_run(
        self, anthropic: bool, rows: list[Row], request: dict[str, Any], gemini: bool = False
    ) -> Run:
        self._created += 1
        n, f = self._created, self.faults
        prefix = "msgbatch_01" if anthropic else "batches/" if gemini else "batch_"
        run = Run(f"{prefix}{token(24)}", n, anthropic, time.time(), f.step_s, rows, request,
                  stuck=n in f.stuck_finalizing, expire=n in f.expire, gemini=gemini)  # fmt: skip
        self.runs[run.id] = run
        self.server.stats.batches_created += 1
        return run

    def accept(self, run: Run) -> None:
        """Count the rows of a batch that will run; then lose the reply, if told to."""
        if not run.errors:
            self.server.stats.batch_submissions.update(row.custom_id for row in run.rows)
        if run.ordinal in self.faults.lost_creates:
            raise Refused(500, "internal error (injected): the batch was created all the same")

    def run(self, batch_id: str, anthropic: bool) -> Run:
        run = self.runs.get(batch_id)
        if run is None or run.anthropic != anthropic or run.gemini:
            raise Refused(404, f"No batch found with id '{batch_id}'.")
        return run

    def cancel(self, run: Run) -> Run:
        """Start cancelling a batch still under way; cancelling it again changes nothing."""
        now = time.time()
        status = run.status(now)
        if status in CANCELLABLE:
            run.cancel_at = now
        elif status != "cancelling":
            raise Refused(400, f"Cannot cancel a batch with status '{status}'.")
        return run


def page(runs: list[Run], query: dict[str, str], after: str, before: str | None, most: int):
    """A page of `runs` (newest first) after or before a cursor id, and whether more follow."""
    try:
        limit = int(query.get("limit", 20))
    except ValueError:
        raise Refused(400, f"limit: {query['limit']!r} is not an integer", "limit") from None
    if not 1 <= limit <= most:
        raise Refused(400, f"limit: must be between 1 and {most}", "limit")
    ids = [run.id for run in runs]
    if before and query.get(before) in ids:
        runs = runs[: ids.index(query[before])]
        return runs[-limit:], len(runs) > limit
    if query.get(after) in ids:
        runs = runs[ids.index(query[after]) + 1 :]
    return runs[:limit], len(runs) > limit


_T = TypeVar("_T", bound=tuple)


def shuffled(run: Run, items: Iterable[_T]) -> list[_T]:
    """(row, ...) items in an order of the batch's own: the providers do not keep the input's."""
    return sorted(items, key=lambda item: hashlib.sha256(f"{run.id}:{item[0].custom_id}".encode())
                  .hexdigest())  # fmt: skip


def json_object(raw: bytes) -> dict[str, Any]:
    body = line_object(raw.decode("utf-8", errors="replace"))
    if body is None:
        raise Refused(400, "the body is not a JSON object")
    return body


def line_object(line: str) -> dict[str, Any] | None:
    try:
        item = json.loads(line)
    except ValueError:
        return None
    return item if isinstance(item, dict) else None


def json_answer(status: int, payload: Any) -> Answer:
    return Answer(status, json.dumps(payload).encode("utf-8"))


def jsonl(lines: Iterable[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(line).encode("utf-8") + b"\n" for line in lines)


_ALPHABET = string.ascii_letters + string.digits


def token(n: int) -> str:
    """A random id part, as the providers' ids have."""
    return "".join(secrets.choice(_ALPHABET) for _ in range(n))
