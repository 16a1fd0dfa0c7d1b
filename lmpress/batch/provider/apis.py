"""The batch APIs lmpress drives, through the official SDKs: OpenAI's Files + Batches (and any
OpenAI-compatible server that has them), Anthropic's Message Batches, and Gemini's batch mode
(`gemini`).

Each one turns a request into a request line with the same body the live engine sends (a
chat or completion body, or for an embed run an /embeddings body, which OpenAI's takes; Gemini's
is its own generateContent request, translated field by field), submits a sealed chunk (finding
the batch it already made, when a crash came between the provider's answer and lmpress
recording it), reports a batch's progress, and yields its results as (custom_id, Outcome) pairs
parsed as the live engine reads a reply, so a batch row's output is the output a live run
writes. Which tasks each one takes is its `BatchApi.tasks`, checked before a job starts
(`batch.pooling.check_mode`). What they share is in `base`.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

from lmpress.batch.provider.base import (
    EXPIRED,
    SAFE_ID,
    WINDOW,
    AnyRequest,
    BatchAPI,
    Outcome,
    Progress,
    custom_id,
)
from lmpress.batch.provider.gemini import GeminiBatches
from lmpress.batch.provider.state import BatchState, Chunk
from lmpress.engines.remote.presets import BatchApi
from lmpress.vocabulary.embeddings import EmbedRequest
from lmpress.vocabulary.errors import InputError
from lmpress.wire.openai.client import completion_prompt
from lmpress.wire.openai.pooling import EMBEDDINGS_PATH
from lmpress.wire.replies import Reply

__all__ = ["BATCH_APIS", "EXPIRED", "SAFE_ID", "WINDOW", "BatchAPI", "Outcome", "Progress",
           "batch_api", "batch_api_of", "custom_id"]  # fmt: skip


class OpenAIBatches(BatchAPI):
    async def endpoint(self, request: AnyRequest) -> str:
        if isinstance(request, EmbedRequest):
            return EMBEDDINGS_PATH
        raw = completion_prompt(request) is not None  # text or token ids
        return "/v1/completions" if raw else "/v1/chat/completions"

    async def line(self, cid: str, request: AnyRequest) -> str:
        engine: Any = self.engine
        model = await engine.model_for(self.client)
        if isinstance(request, EmbedRequest):
            body = engine.embed_request_body(request, model)
        else:
            body = engine.with_user(engine.request_body(request, model))
        url = await self.endpoint(request)
        return json.dumps({"custom_id": cid, "method": "POST", "url": url, "body": body},
                          ensure_ascii=False)  # fmt: skip

    async def submit(self, state: BatchState, chunk: Chunk) -> str:
        files, batches = self.client.files, self.client.batches
        if chunk.file_id is not None:
            found = await self._made_from(chunk.file_id, chunk.sealed_at)
            if found:
                return found
        else:
            path = state.requests_path(chunk.name)
            file = await self.call(
                f"uploading {path.name}", files.create, file=path, purpose="batch"
            )
            state.record(chunk, "uploaded", file_id=file.id)
        state.record(chunk, "submitting", at=time.time())
        file_id = chunk.file_id
        assert file_id is not None

        def create() -> Any:
            return batches.create(
                input_file_id=file_id, endpoint=chunk.endpoint, completion_window=self.window,
                metadata={"lmpress_chunk": chunk.name},
            )  # fmt: skip

        return await self.create_once(
            f"creating the batch for {chunk.name}", create,
            lambda: self._made_from(file_id, chunk.sealed_at),
        )  # fmt: skip

    async def _made_from(self, file_id: str, since: float) -> str | None:
        """The batch already created from an uploaded file, if any (the list is newest
        first, so it is read back only to the chunk's sealing)."""
        page = await self.call("listing batches", self.client.batches.list, limit=100)
        async for batch in page:
            if batch.input_file_id == file_id:
                return batch.id
            if batch.created_at < since - 60:
                break
        return None

    async def progress(self, batch_id: str) -> Progress:
        b = await self.call(f"checking {batch_id}", self.client.batches.retrieve, batch_id)
        counts = b.request_counts
        ended = b.status in ("completed", "failed", "expired", "cancelled")
        refused = None
        if b.status == "failed":
            errors = b.errors.data if b.errors and b.errors.data else []
            refused = "; ".join(f"{e.code}: {e.message}" for e in errors[:3]) or "no reason given"
        return Progress(
            b.status, ended, counts.completed if counts else 0, counts.failed if counts else 0,
            counts.total if counts else 0, b.expires_at, refused,
        )  # fmt: skip

    async def results(self, batch_id: str) -> AsyncIterator[tuple[str, Outcome]]:
        from lmpress.wire.openai.replies import parse_chat_completion, parse_embeddings

        b = await self.call(f"checking {batch_id}", self.client.batches.retrieve, batch_id)
        engine: Any = self.engine
        thought_tags = engine.reasoning.thought_tags

        def parse_chat(body: Any, model: str) -> Reply:  # as the live engine reads a reply
            return parse_chat_completion(body, model, thought_tags)

        parse = parse_embeddings if b.endpoint == EMBEDDINGS_PATH else parse_chat
        for file_id in (b.output_file_id, b.error_file_id):
            if not file_id:
                continue
            content = await self.call(f"downloading {file_id}", self.client.files.content, file_id)
            for raw in content.text.splitlines():
                if not raw.strip():
                    continue
                item = json.loads(raw)
                yield item["custom_id"], self._outcome(item, parse)

    def _outcome(self, item: dict[str, Any], parse: Any) -> Outcome:
        error = item.get("error") or {}
        if error.get("code") in ("batch_expired", "batch_cancelled"):
            return Outcome(message=error.get("message", ""), expired=True)
        response = item.get("response") or {}
        status, body = response.get("status_code"), response.get("body")
        if status == 200 and isinstance(body, dict):
            return Outcome(reply=parse(body, self.engine.model_name))
        detail = (body or {}).get("error", {}) if isinstance(body, dict) else {}
        message = detail.get("message") or error.get("message") or f"status {status}"
        return Outcome(status=status or 500, message=message)

    async def cancel(self, batch_id: str) -> None:
        await self.call(f"cancelling {batch_id}", self.client.batches.cancel, batch_id)


class AnthropicBatches(BatchAPI):
    async def endpoint(self, request: AnyRequest) -> str:
        return "/v1/messages"

    async def line(self, cid: str, request: AnyRequest) -> str:
        engine: Any = self.engine
        return json.dumps(
            {"custom_id": cid, "params": engine.request_body(request)}, ensure_ascii=False
        )

    async def submit(self, state: BatchState, chunk: Chunk) -> str:
        batches = self.client.messages.batches
        if chunk.submitting_at is not None:
            found = await self._made_at(state, chunk)
            if found:
                return found
        path = state.requests_path(chunk.name)
        requests = [json.loads(raw) for raw in path.read_bytes().splitlines() if raw.strip()]
        state.record(chunk, "submitting", at=time.time())
        return await self.create_once(
            f"creating the batch for {chunk.name}",
            lambda: batches.create(requests=requests),
            lambda: self._made_at(state, chunk),
        )

    async def _made_at(self, state: BatchState, chunk: Chunk) -> str | None:
        """A batch of the chunk's size created since its submission began and claimed by no
        other chunk: Message Batches carry no metadata to find it by."""
        assert chunk.submitting_at is not None
        claimed = {c.batch_id for c in state.chunks.values() if c.batch_id}
        page = await self.call("listing batches", self.client.messages.batches.list, limit=100)
        async for batch in page:
            counts = batch.request_counts
            total = (
                counts.processing
                + counts.succeeded
                + counts.errored
                + counts.canceled
                + (counts.expired)
            )
            made = batch.created_at.timestamp()
            if batch.id not in claimed and total == chunk.count and made >= chunk.submitting_at - 5:
                return batch.id
            if made < chunk.submitting_at - 60:
                break
        return None

    async def progress(self, batch_id: str) -> Progress:
        batches = self.client.messages.batches
        b = await self.call(f"checking {batch_id}", batches.retrieve, batch_id)
        c = b.request_counts
        total = c.processing + c.succeeded + c.errored + c.canceled + c.expired
        expires = b.expires_at.timestamp() if b.expires_at else None
        return Progress(b.processing_status, b.processing_status == "ended", c.succeeded,
                        c.errored + c.canceled + c.expired, total, expires)  # fmt: skip

    async def results(self, batch_id: str) -> AsyncIterator[tuple[str, Outcome]]:
        from lmpress.wire.anthropic.client import parse_message

        batches = self.client.messages.batches
        stream = await self.call(f"downloading results of {batch_id}", batches.results, batch_id)
        async for item in stream:
            result = item.result
            if result.type == "succeeded":
                reply = parse_message(result.message.model_dump(), self.engine.model_name)
                yield item.custom_id, Outcome(reply=reply)
            elif result.type == "errored":
                error = result.error.error
                status = 400 if error.type == "invalid_request_error" else 500
                yield item.custom_id, Outcome(status=status, message=error.message)
            else:  # canceled or expired
                yield item.custom_id, Outcome(message=result.type, expired=True)

    async def cancel(self, batch_id: str) -> None:
        batches = self.client.messages.batches
        await self.call(f"cancelling {batch_id}", batches.cancel, batch_id)


# Every batch API a provider row may name, driven: a BatchApi without its class here fails the
# test that checks this table is whole, not a user's job.
BATCH_APIS: dict[BatchApi, type[BatchAPI]] = {
    BatchApi.OPENAI: OpenAIBatches,
    BatchApi.ANTHROPIC: AnthropicBatches,
    BatchApi.GEMINI: GeminiBatches,
}


def batch_api(engine: Any, window: str) -> BatchAPI:
    """The batch API of an engine's provider, or a clear refusal."""
    return BATCH_APIS[batch_api_of(type(engine))](engine, window)


def batch_api_of(engine_class: Any) -> BatchApi:
    """Which batch API an engine's provider row names, or a clear refusal where none."""
    provider = getattr(engine_class, "provider", None)
    kind = provider.batch_api if provider is not None else None
    if kind is not None:
        return kind
    if provider is not None and provider.batch_refusal:
        raise InputError(f"--provider-batch on {engine_class.name}: {provider.batch_refusal}")
    raise InputError(
        f"engine {engine_class.name} has no batch API lmpress can drive (OPENAI, ANTHROPIC, GEMINI "
        f"and OpenAI-compatible servers with /v1/batches do); drop --provider-batch to run live"
    )
