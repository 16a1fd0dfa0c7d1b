"""ANTHROPIC: the Messages API through the `anthropic` SDK.

The protocol itself, the body a Request becomes and how a reply (JSON or streamed) reads back,
is `wire.anthropic.client`'s, which the Message Batches API shares; this module holds the
engine: its SDK client, the 529 that means overloaded, and prompt caching.

Prompt caching (`remote_params.prompt_cache`, prompt_cache.py): with `auto`, a prefix that
repeats and is long enough to cache gets `cache_control` on its last block (`mark_prefix`): the
last tool, the last system block; the request that writes it goes first, and the others
carrying it wait for it. Message Batches lines are built by `_body` too, so they carry the
same marks.

With thinking on the API takes no temperature or top_k: lmpress sends neither (the Messages API
samples at temperature 1, `inherent_params`).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

from lmpress.configs.schema import RunConfig
from lmpress.engines.remote.base import RemoteEngine, client_options
from lmpress.engines.remote.prompt_cache import Marks, PrefixMarks, anthropic_min_tokens
from lmpress.vocabulary.errors import ErrorKind
from lmpress.vocabulary.types import Delta, GenerationParams, Request
from lmpress.wire.anthropic.client import (
    GUIDED_FORMS,
    StreamedMessage,
    parse_message,
    request_body,
    thinking_config,
)
from lmpress.wire.replies import MalformedResponse, Reply


class AnthropicEngine(RemoteEngine):
    """Anthropic's Messages API. Its name, URL, key variable and parameters are its row in
    presets.py."""

    # The Messages API takes no sampling parameters (temperature, top_p, top_k are gone from
    # it) and samples at temperature 1 over the whole distribution: lmpress's defaults are
    # simply not sent, asking for what the API does anyway is accepted (Oumi's Claude configs
    # set temperature 1.0), and any other value is refused.
    inherent_params = {"temperature": 1.0, "top_p": 1.0}
    endpoint_paths = ("/v1/messages", "/messages", "/v1")  # the SDK appends /v1/messages

    def __init__(self, config: RunConfig):
        super().__init__(config)
        import anthropic  # ~2 s of imports: paid here, not by the first request

        self._anthropic = anthropic
        self.prefix_marks = (
            PrefixMarks(anthropic_min_tokens(self.model_name))
            if self.remote.prompt_cache == "auto"
            else None
        )

    def check_request_params(self, params: GenerationParams) -> None:
        if params.guided_decoding is not None:
            params.guided_decoding.refuse_unless(self.name, GUIDED_FORMS)
        thinking_config(params)

    def status_kind(self, status: int) -> ErrorKind:
        return ErrorKind.OVERLOADED if status == 529 else super().status_kind(status)

    def _make_client(self) -> Any:
        return self._anthropic.AsyncAnthropic(
            api_key=self.api_key,  # given, so the SDK reads no credential from elsewhere
            base_url=self.api_url,
            **client_options(
                self._anthropic, self.remote.num_workers, self.remote.connection_timeout
            ),
        )

    def request_body(self, request: Request) -> dict[str, Any]:
        """The request's Messages body, live or as a Message Batches line."""
        return self._marked_body(request)[0]

    def _marked_body(self, request: Request) -> tuple[dict[str, Any], str | None]:
        """The body with its prompt-cache marks, and the key of the prefix marked (or None)."""
        body = request_body(request, self.model_name)
        if self.remote.user_id:  # as Oumi sends it: the Messages API's metadata.user_id
            body["metadata"] = {"user_id": self.remote.user_id}
        if self.prefix_marks is None:
            return body, None
        marks = self.prefix_marks.sight(request)
        return mark_prefix(body, marks), marks.key

    async def _send(self, client: Any, request: Request) -> Reply:
        body, key = self._marked_body(request)
        async with self._writing(key):
            raw = await client.messages.with_raw_response.create(**body)
            try:
                data = json.loads(await raw.read())
            except ValueError as exc:
                raise MalformedResponse(f"the reply body is not JSON ({exc})") from exc
        return parse_message(data, self.model_name)

    def _writing(self, key: str | None) -> Any:
        """The gate a request whose marked prefix is being written waits at (prompt_cache.py)."""
        if self.prefix_marks is None:
            return contextlib.nullcontext()
        return self.prefix_marks.writing(key)

    async def _send_stream(self, client: Any, request: Request) -> AsyncIterator[Delta | Reply]:
        body, key = self._marked_body(request)
        async with self._writing(key):
            async for item in self._stream_body(client, request, body):
                yield item

    async def _stream_body(
        self, client: Any, request: Request, body: dict[str, Any]
    ) -> AsyncIterator[Delta | Reply]:
        stream = await client.messages.create(**body, stream=True)
        message = StreamedMessage()
        async with stream:
            async for event in stream:
                thought, text = message.add(event)
                if thought:
                    yield Delta(request.id, thought, reasoning=True)
                if text:
                    yield Delta(request.id, text)
        yield message.reply()


EPHEMERAL = {"type": "ephemeral"}  # the 5-minute cache, priced at 1.25x input to write


def mark_prefix(body: dict[str, Any], marks: Marks) -> dict[str, Any]:
    """The body with `cache_control` on the last tool and the last system block, as `marks`
    says; a system prompt given as text becomes one text block to carry it."""
    if marks.tools and body.get("tools"):
        body["tools"][-1] = {**body["tools"][-1], "cache_control": EPHEMERAL}
    if marks.system and body.get("system"):
        system = body["system"]
        blocks = [{"type": "text", "text": system}] if isinstance(system, str) else list(system)
        blocks[-1] = {**blocks[-1], "cache_control": EPHEMERAL}
        body["system"] = blocks
    return body
