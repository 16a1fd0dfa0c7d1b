"""The providers' batch APIs on the loopback server, as their API references describe them:
OpenAI's Files and Batches endpoints (`openai_batches`), Anthropic's Message Batches endpoints
(`anthropic_batches`) and Gemini's batch mode (`gemini_batches`), over one store of files and
batches (`batch_store`) in compressed time (`batch_life`). `LLMServer`'s handler hands every
request under /v1/files, /v1/batches, /v1/messages/batches, /v1beta and /upload/v1beta to
`BatchAPI.handle`.

A row's outcome is decided when its batch is created, by the rules of a live request: a body the
live endpoint refuses fails with that 400, a conversation holding a `Faults.permanent` marker
fails with its status, and any other gets the reply the live endpoint gives (`replies`) under an
id of its own. Live faults (transient failures, latency, rate limits) do not reach batches.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from tests.servers import anthropic_batches, gemini_batches, openai_batches, refusals
from tests.servers.batch_life import BatchFaults
from tests.servers.batch_store import Answer, BatchStore, Refused, Request, json_answer

__all__ = ["Answer", "BatchAPI", "BatchFaults", "Request"]

# (method, path template, route); `Stats.batch_calls` counts calls by (method, template).
_ROUTES: list[tuple[str, str, Callable[..., Answer]]] = [
    ("POST", "/v1/files", openai_batches.upload_file),
    ("GET", "/v1/files/{id}", openai_batches.get_file),
    ("GET", "/v1/files/{id}/content", openai_batches.file_content),
    ("DELETE", "/v1/files/{id}", openai_batches.delete_file),
    ("POST", "/v1/batches", openai_batches.create_batch),
    ("GET", "/v1/batches", openai_batches.list_batches),
    ("GET", "/v1/batches/{id}", openai_batches.get_batch),
    ("POST", "/v1/batches/{id}/cancel", openai_batches.cancel_batch),
    ("POST", "/v1/messages/batches", anthropic_batches.create),
    ("GET", "/v1/messages/batches", anthropic_batches.list_batches),
    ("GET", "/v1/messages/batches/{id}", anthropic_batches.retrieve),
    ("POST", "/v1/messages/batches/{id}/cancel", anthropic_batches.cancel),
    ("GET", "/v1/messages/batches/{id}/results", anthropic_batches.results),
    ("DELETE", "/v1/messages/batches/{id}", anthropic_batches.delete),
    ("POST", "/upload/v1beta/files", gemini_batches.upload),
    ("GET", "/v1beta/files/{id}:download", gemini_batches.download),
    ("GET", "/v1beta/files/{id}", gemini_batches.get_file),
    ("POST", "/v1beta/models/{id}:batchGenerateContent", gemini_batches.create),
    ("GET", "/v1beta/batches", gemini_batches.list_batches),
    ("GET", "/v1beta/batches/{id}", gemini_batches.get_batch),
    ("POST", "/v1beta/batches/{id}:cancel", gemini_batches.cancel),
]


class BatchAPI(BatchStore):
    """One server's files and batches, and the routes that serve them. A route runs under the
    server's lock, so state and stats stay consistent across the handler's threads."""

    def handle(self, request: Request) -> Answer | None:
        """The answer to a batch-API request, or None when no route has its method and path."""
        anthropic = request.path.startswith("/v1/messages/")
        gemini = "v1beta/" in request.path
        for method, template, route in _ROUTES:
            match = re.fullmatch(template.replace("{id}", "([^/:]+)"), request.path)
            if match and method == request.method:
                with self.server.lock:
                    self.server.stats.batch_calls[(method, template)] += 1
                    try:
                        return route(self, request, *match.groups())
                    except Refused as e:
                        body = (gemini_batches.error_body(e.status, e.message) if gemini else
                                refusals.error_body(e.status, e.message, anthropic, e.param))  # fmt: skip
                        return json_answer(e.status, body)
        return None
