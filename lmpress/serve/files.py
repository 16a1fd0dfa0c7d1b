"""OpenAI's Files routes in `lmpress serve`, for the Batch API: upload a batch input, read a
batch's output and error files, list and delete. Files live in the state directory
(`serve.state`).

An upload is checked as a file, not line by line: as at OpenAI, a batch input's lines are read
when a batch runs it, and a malformed line fails alone into the batch's error file.
"""

from __future__ import annotations

from email.parser import BytesParser
from email.policy import HTTP
from typing import Any

from fastapi import Request as HttpRequest
from fastapi.responses import FileResponse, JSONResponse

from lmpress.openai_wire.errors import ApiError
from lmpress.serve.state import StateStore, StoredFile

# OpenAI's own limit on a batch input file.
MAX_FILE_BYTES = 200 * 1024 * 1024
PURPOSES = ("batch",)


class FileRoutes:
    def __init__(self, store: StateStore):
        self.store = store

    async def upload(self, request: HttpRequest) -> JSONResponse:
        fields = parse_form(
            request.headers.get("content-type", ""), await read_limited(request, MAX_FILE_BYTES)
        )
        purpose = fields.get("purpose", (None, b""))[1].decode()
        if purpose not in PURPOSES:
            raise ApiError(
                400,
                f"purpose {purpose!r}: this server keeps files for its Batch API only "
                f"(purpose 'batch')",
                param="purpose",
            )
        if "file" not in fields or fields["file"][0] is None:
            raise ApiError(400, "no 'file' part in the multipart form", param="file")
        filename, data = fields["file"]
        if not data.strip():
            raise ApiError(400, f"file {filename!r} is empty", param="file")
        file = self.store.add_file(data, filename or "upload.jsonl", purpose)
        return JSONResponse(file.model_dump())

    async def list(self, purpose: str | None = None, limit: int = 10000) -> dict[str, Any]:
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


def parse_form(content_type: str, body: bytes) -> dict[str, tuple[str | None, bytes]]:
    """A multipart/form-data body's fields by name: (file name or None, bytes). Read with the
    standard library's MIME parser, so the server needs no multipart package."""
    if not content_type.startswith("multipart/form-data"):
        raise ApiError(400, "upload a file as multipart/form-data (fields 'file' and 'purpose')")
    head = f"Content-Type: {content_type}\r\nMIME-Version: 1.0\r\n\r\n".encode()
    message = BytesParser(policy=HTTP).parsebytes(head + body)
    fields: dict[str, tuple[str | None, bytes]] = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if isinstance(name, str):
            payload = part.get_payload(decode=True)
            fields[name] = (part.get_filename(), payload if isinstance(payload, bytes) else b"")
    return fields
