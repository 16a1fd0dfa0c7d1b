"""Gemini's batch mode, through Google's google-genai SDK (`client.aio.batches` and `.files`):
the GEMINI engine's rows at half price.

A chunk's lines are GenerateContentRequests (`wire.gemini`), each as
`{"key": custom_id, "request": ...}` in a JSONL file uploaded to the Files API; the batch is
created from that file (`batches.create(model=, src=file name)`), named
`lmpress <chunk> <file>` so that after a crash between Google's answer and lmpress recording it
the batch is found by that name in `batches.list` rather than made twice (a file's name is
unique, and batches carry no other field to find them by). A batch is pending, then running,
then succeeded, failed, cancelled or expired; Google ends any batch still unfinished 48 hours
after its creation, and an expired batch has no results, so its rows go as `--on-expired` says.
A succeeded batch's results are a JSONL file, downloaded to a temporary file and read a line
at a time: `{"key", "response": GenerateContentResponse}` or `{"key", "error": Status}`.

Gemini takes no completion window: a batch runs until it ends or Google expires it, so
`remote_params.batch_completion_window` is only the switch that turns batch mode on, and takes
24h (the default) or 48h. The SDK is pointed at the engine's host: the GEMINI engine's URL is
Google's OpenAI-compatible base (`…/v1beta/openai/`), whose host and path prefix serve the
batch API at `v1beta` too.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from lmpress.batch.provider.base import AnyRequest, BatchAPI, Outcome, Progress
from lmpress.batch.provider.state import BatchState, Chunk
from lmpress.vocabulary.embeddings import EmbedRequest
from lmpress.vocabulary.errors import InputError, RequestError
from lmpress.wire.gemini import (
    generate_content_request,
    parse_generate_content,
    row_error,
)
from lmpress.wire.replies import MalformedResponse

ENDPOINT = "generateContent"  # the one kind of line a Gemini batch holds
EXPIRY_S = 48 * 3600  # Google expires a batch still pending or running this long after it began
WINDOWS = ("24h", "48h")
ENDED = {"JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED", "JOB_STATE_EXPIRED"}
LIST_MOST = 2000  # batches searched, newest first, for one whose creation was not recorded


class GeminiBatches(BatchAPI):
    def _make_client(self) -> Any:
        if self.window not in WINDOWS:
            raise InputError(
                f"remote_params.batch_completion_window {self.window!r}: Gemini's batch mode "
                f"takes no window (Google ends a batch within 48 hours); set 24h or 48h"
            )
        try:
            from google import genai
            from google.genai import types
        except ImportError as exc:
            raise InputError(
                "GEMINI batch mode needs Google's google-genai SDK: pip install 'lmpress[remote]'"
            ) from exc
        remote = self.engine.remote
        options = types.HttpOptions(
            base_url=genai_base_url(self.engine.api_url),
            api_version="v1beta",
            timeout=int(remote.connection_timeout * 1000),
            # lmpress retries each call itself (`BatchAPI.call`), as it does live requests.
            retry_options=types.HttpRetryOptions(attempts=1),
        )
        client = genai.Client(vertexai=False, api_key=self.engine.api_key, http_options=options)
        return client.aio

    async def call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        return await super().call(what, _sorted_errors(fn), *args, **kwargs)

    async def endpoint(self, request: AnyRequest) -> str:
        return ENDPOINT

    async def line(self, cid: str, request: AnyRequest) -> str:
        if isinstance(request, EmbedRequest):  # refused before the job starts (check_mode)
            raise InputError("Gemini's batch mode in lmpress takes generate runs only")
        try:
            body = generate_content_request(request)
        except RequestError as exc:
            raise InputError(str(exc)) from None
        return json.dumps({"key": cid, "request": body}, ensure_ascii=False)

    async def submit(self, state: BatchState, chunk: Chunk) -> str:
        if chunk.file_id is not None:
            found = await self._made_from(chunk.file_id)
            if found:
                return found
        else:
            path = state.requests_path(chunk.name)
            file = await self.call(
                f"uploading {path.name}", self.client.files.upload, file=path,
                config={"display_name": path.name, "mime_type": "jsonl"},
            )  # fmt: skip
            state.record(chunk, "uploaded", file_id=file.name)
        state.record(chunk, "submitting", at=time.time())
        file_id = chunk.file_id
        assert file_id is not None
        create = _sorted_errors(self.client.batches.create)

        def created() -> Any:
            return create(model=self.engine.model_name, src=file_id,
                          config={"display_name": display_name(chunk.name, file_id)})  # fmt: skip

        return await self.create_once(
            f"creating the batch for {chunk.name}", created,
            lambda: self._made_from(file_id),
        )  # fmt: skip

    async def _batch_id(self, created: Any) -> str:
        return (await created).name  # batches/…

    async def _made_from(self, file_id: str) -> str | None:
        """The batch already created from an uploaded file, found by the name it was given
        (which holds the file's, unique); the newest LIST_MOST batches are searched."""
        wanted = f" {file_id}"

        async def search() -> str | None:
            seen = 0
            async for job in await self.client.batches.list(config={"page_size": 100}):
                if (job.display_name or "").endswith(wanted):
                    return job.name
                seen += 1
                if seen >= LIST_MOST:
                    break
            return None

        return await self.call("listing batches", search)

    async def progress(self, batch_id: str) -> Progress:
        job = await self.call(f"checking {batch_id}", self.client.batches.get, name=batch_id)
        state = _state(job)
        created = job.create_time.timestamp() if job.create_time else None
        refused = None
        if state == "JOB_STATE_FAILED":
            refused = "Gemini ended the batch as failed and gives no reason for it"
        word = state.removeprefix("JOB_STATE_").lower()
        return Progress(word, state in ENDED, 0, 0, 0,
                        created + EXPIRY_S if created else None, refused)  # fmt: skip

    async def results(self, batch_id: str) -> AsyncIterator[tuple[str, Outcome]]:
        job = await self.call(f"checking {batch_id}", self.client.batches.get, name=batch_id)
        dest = job.dest
        model = self.engine.model_name
        if dest is not None and dest.inlined_responses:  # batches made from inline requests
            for item in dest.inlined_responses:
                key = (item.metadata or {}).get("key", "")
                response = (
                    item.response.model_dump(mode="json", by_alias=True, exclude_none=True)
                    if item.response
                    else None
                )
                error = item.error.model_dump(mode="json", exclude_none=True) if item.error else None  # fmt: skip
                yield key, _outcome(response, error, model)
            return
        if dest is None or not dest.file_name:
            return  # expired or cancelled before it ran a row: the job re-runs them all
        with tempfile.TemporaryFile() as spool:
            await self.call(f"downloading {dest.file_name}", self.client.files.download,
                            file=dest.file_name, destination=spool)  # fmt: skip
            spool.seek(0)
            for raw in spool:
                if not raw.strip():
                    continue
                item = json.loads(raw)
                yield (
                    str(item.get("key", "")),
                    _outcome(item.get("response"), item.get("error") or item.get("status"), model),
                )

    async def cancel(self, batch_id: str) -> None:
        await self.call(f"cancelling {batch_id}", self.client.batches.cancel, name=batch_id)

    async def aclose(self) -> None:
        await self.client.aclose()


def genai_base_url(api_url: str) -> str:
    """The google-genai SDK's base URL for an engine URL: Google's OpenAI-compatible base
    (https://generativelanguage.googleapis.com/v1beta/openai) less its version and `openai`
    segments, and likewise for a stand-in's (http://127.0.0.1:PORT/v1)."""
    parts = urlsplit(api_url.rstrip("/"))
    segments = parts.path.split("/")
    if segments and segments[-1] == "openai":
        segments.pop()
    if segments and segments[-1].startswith("v1"):
        segments.pop()
    return urlunsplit(parts._replace(path="/".join(segments) + "/"))


def display_name(chunk: str, file_id: str) -> str:
    return f"lmpress {chunk} {file_id}"


def _state(job: Any) -> str:
    state = job.state
    return str(getattr(state, "value", state) or "JOB_STATE_UNSPECIFIED")


def _outcome(response: Any, error: Any, model: str) -> Outcome:
    if error:
        status, message = row_error(error)
        return Outcome(status=status, message=message)
    try:
        return Outcome(reply=parse_generate_content(response, model))
    except MalformedResponse as exc:
        return Outcome(status=502, message=str(exc))


def _sorted_errors(fn: Any) -> Any:
    """`fn` with the SDK's APIError carrying its HTTP status where `retry.classify` looks for
    one, so a 429 or 5xx is retried and any other status ends the job's run in one line."""

    async def sorted_call(*args: Any, **kwargs: Any) -> Any:
        from google.genai import errors

        try:
            return await fn(*args, **kwargs)
        except errors.APIError as exc:
            raise GeminiStatusError(exc) from exc

    return sorted_call


class GeminiStatusError(Exception):
    """A google-genai APIError as the openai and anthropic SDKs spell an HTTP error."""

    def __init__(self, exc: Any):
        super().__init__(exc.message or str(exc))
        self.status_code = exc.code
        self.response = exc.response
        self.body = {"error": {"message": exc.message or str(exc)}}
