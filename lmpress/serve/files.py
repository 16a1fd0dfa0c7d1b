"""OpenAI's Files routes in `lmpress serve`, for the Batch API: upload a batch input, read a
batch's output and error files, list and delete. Files live in the state directory
(`serve.state`).

An upload is checked as a file, not line by line: as at OpenAI, a batch input's lines are read
when a batch runs it, and a malformed line fails alone into the batch's error file.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import Query
from fastapi import Request as HttpRequest
from fastapi.responses import FileResponse, JSONResponse
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException
from starlette.types import Message, Receive

from lmpress.serve.state import StateStore, StoredFile
from lmpress.wire.openai.errors import ApiError

# OpenAI's own limit on a batch input file.
MAX_FILE_BYTES = 200 * 1024 * 1024
PURPOSES = ("batch",)
# Room for the form's own headers and boundaries beside the file, in a Content-Length.
FORM_OVERHEAD = 64 * 1024
# A file no larger than this that is all whitespace is refused as empty.
EMPTY_CHECK_BYTES = 64 * 1024


class FileRoutes:
    def __init__(self, store: StateStore):
        self.store = store

    async def upload(self, request: HttpRequest) -> JSONResponse:
        """Keep a multipart upload. python-multipart parses it as it streams in, spooling the
        file to disk past 1 MiB, and the copy into the state directory runs off the event
        loop: an upload of OpenAI's 200 MiB holds neither memory nor the other requests. The
        body ends where it passes the limit, Content-Length or not, so no more is spooled."""
        if not request.headers.get("content-type", "").startswith("multipart/form-data"):
            raise ApiError(
                400, "upload a file as multipart/form-data (fields 'file' and 'purpose')"
            )
        capped = CappedBody(request.receive, MAX_FILE_BYTES + FORM_OVERHEAD)
        if int(request.headers.get("content-length") or 0) > capped.limit:
            raise _too_large()
        try:
            form = await HttpRequest(request.scope, capped).form(max_files=1, max_fields=8)
        except HTTPException as exc:  # a form python-multipart cannot read
            if capped.over:  # cut short by the cap, the form is incomplete
                raise _too_large() from None
            raise ApiError(400, f"the multipart form: {exc.detail}", param="file") from None
        try:
            if capped.over:
                raise _too_large()
            purpose = form.get("purpose")
            if purpose not in PURPOSES:
                raise ApiError(
                    400,
                    f"purpose {purpose!r}: this server keeps files for its Batch API only "
                    f"(purpose 'batch')",
                    param="purpose",
                )
            upload = form.get("file")
            if not isinstance(upload, UploadFile):
                raise ApiError(400, "no 'file' part in the multipart form", param="file")
            size = upload.size or 0
            if size > MAX_FILE_BYTES:
                raise _too_large()
            if not (await upload.read(EMPTY_CHECK_BYTES)).strip() and size <= EMPTY_CHECK_BYTES:
                raise ApiError(400, f"file {upload.filename!r} is empty", param="file")
            await upload.seek(0)
            name = upload.filename or "upload.jsonl"
            file = await asyncio.to_thread(self.store.add_file, upload.file, name, purpose)
        finally:
            await form.close()  # the spooled file goes
        return JSONResponse(file.model_dump())

    async def list(
        self, purpose: str | None = None, limit: Annotated[int, Query(ge=1, le=10000)] = 10000
    ) -> dict[str, Any]:
        files = [f for f in self.store.files() if purpose is None or f.purpose == purpose]
        data = [f.model_dump() for f in files[:limit]]
        return {"object": "list", "data": data, "has_more": len(files) > limit}

    async def retrieve(self, file_id: str) -> dict[str, Any]:
        return self._find(file_id).file.model_dump()

    async def content(self, file_id: str) -> FileResponse:
        stored = self._find(file_id)
        return FileResponse(stored.path, media_type="application/octet-stream")

    async def delete(self, file_id: str) -> dict[str, Any]:
        if not self.store.delete_file(file_id):
            raise _no_file(file_id)
        return {"id": file_id, "object": "file", "deleted": True}

    def _find(self, file_id: str) -> StoredFile:
        stored = self.store.file(file_id)
        if stored is None:
            raise _no_file(file_id)
        return stored


class CappedBody:
    """A request's `receive` that ends the body once more than `limit` bytes have come (and
    says so in `over`), so that a parser reading it stops there, with whatever it spooled
    cleaned up the way it cleans up a form that ends early."""

    def __init__(self, receive: Receive, limit: int):
        self.receive = receive
        self.limit = limit
        self.size = 0
        self.over = False

    async def __call__(self) -> Message:
        if self.over:
            return {"type": "http.request", "body": b"", "more_body": False}
        message = await self.receive()
        if message["type"] == "http.request":
            self.size += len(message.get("body", b""))
            if self.size > self.limit:
                self.over = True
                return {"type": "http.request", "body": b"", "more_body": False}
        return message


def _no_file(file_id: str) -> ApiError:
    return ApiError(404, f"No such File object: {file_id}", param="id", code="not_found")


async def read_limited(request: HttpRequest, limit: int) -> bytes:
    """A request's body, or a 413 once it passes `limit` bytes."""
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(413, f"the request body is larger than this route's {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large() -> ApiError:
    # The connection closes with the answer: else the server would read, to throw away,
    # whatever the client still sends.
    return ApiError(
        413,
        f"a batch input file is at most {MAX_FILE_BYTES} bytes",
        param="file",
        headers={"connection": "close"},
    )
