"""OPENAI, REMOTE, REMOTE_VLLM and the hosted OpenAI-compatible services, through the `openai` SDK.

One engine class speaks the chat-completions protocol; each service is its row in presets.py
(base URL, key variable, the generation parameters it accepts and how a few of them are spelled,
`Dialect`) bound onto it, and the two services that need code of their own (BEDROCK's regional
URL, SGLANG's endpoint paths) subclass it. The protocol is wire/openai's: `client.request_body`
turns a Request into the JSON body, the row's `ReasoningFields` add its reasoning bounds
(reasoning.py), and `replies.parse_chat_completion` turns the JSON reply into samples and
usage; streamed, `replies.StreamedChoice` does the same for each choice as it arrives.

`complete` (what `batch` uses) posts the body through the SDK's generic `post` and reads the JSON
reply straight into a Result, skipping the SDK's parameter and response models: the SDK still
builds, authenticates and sends the request and raises its usual errors, but the per-row CPU a
million-row job pays stays small.
`stream` (what `chat` and `serve` use) streams through the SDK with usage included.
`embed` posts an /embeddings body the same way (`client.embed_body`, which an OpenAI Batch line
of an embed run carries too) and `replies.parse_embeddings` reads the reply, live or from a
batch's output.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import AsyncIterator
from typing import Any, ClassVar

from lmpress.configs.schema import RunConfig
from lmpress.engines.remote.base import RemoteEngine, client_options
from lmpress.engines.remote.reasoning import ReasoningFields
from lmpress.vocabulary.embeddings import EmbedRequest, ScoreRequest
from lmpress.vocabulary.errors import ConfigError, ErrorKind, RequestError
from lmpress.vocabulary.types import Delta, GenerationParams, Request, Usage
from lmpress.wire.images import inline_image_url
from lmpress.wire.openai.client import (
    OPENAI_PARAMS,
    Dialect,
    completion_prompt,
    embed_body,
    kept_beams,
    request_body,
    score_body,
)
from lmpress.wire.openai.prompt_logprobs import read_scored
from lmpress.wire.openai.replies import (
    StreamedChoice,
    chat_usage,
    keep_requested_stops,
    parse_chat_completion,
    parse_embeddings,
    parse_scores,
    streamed_reply,
)
from lmpress.wire.replies import EmbedReply, MalformedResponse, Reply, ScoreReply

# Send only the bearer key: the SDK would add OPENAI_ADMIN_KEY from the environment otherwise.
_BEARER_ONLY: dict[str, Any] = {"security": {"bearer_auth": True}}
# SDK keyword arguments of chat.completions.create; anything else goes in `extra_body`.
_SDK_ARGS = frozenset({
    "messages", "model", "prompt", "max_tokens", "max_completion_tokens", "temperature", "top_p",
    "presence_penalty", "frequency_penalty", "stop", "seed", "n", "logprobs", "top_logprobs",
    "logit_bias", "response_format", "stream", "stream_options", "tools", "tool_choice",
    "parallel_tool_calls",
})  # fmt: skip


class OpenAICompatEngine(RemoteEngine):
    """Any OpenAI-compatible server at remote_params.api_url (vLLM, llama.cpp, lmpress serve...).
    Each hosted service is this class with its row of presets.py bound."""

    name = "REMOTE"
    supported_params = OPENAI_PARAMS
    dialect: ClassVar[Dialect] = Dialect()
    reasoning: ClassVar[ReasoningFields] = ReasoningFields()  # its reasoning fields (presets.py)
    key_required = False  # a local server usually has no key; a named variable must exist
    model_required = False  # asked of the server (GET /models) when not given
    endpoint_paths = ("/chat/completions", "/completions")
    user_field: ClassVar[bool] = False  # send remote_params.user_id as OpenAI's `user`

    def __init__(self, config: RunConfig):
        super().__init__(config)
        import openai

        self._openai = openai
        self._served_model: str | None = config.model.model_name or None
        self._timeout = config.remote_params.connection_timeout

    @property
    def model_name(self) -> str:
        return self._served_model or self.config.model.model_name

    def check_request_params(self, params: GenerationParams) -> None:
        if kept_beams(params, self.dialect) and params.n > params.num_beams:
            raise RequestError(
                f"generation.n {params.n} is more than generation.num_beams "
                f"{params.num_beams}: n returns beams",
                ErrorKind.UNSUPPORTED_PARAM,
            )
        if params.guided_decoding is not None:
            self.dialect.check_guided(params.guided_decoding, self.name)
        self.reasoning.check(params, self.name)

    def _make_client(self) -> Any:
        return self._openai.AsyncOpenAI(
            api_key=self.api_key or "EMPTY",  # never None: the SDK would read OPENAI_API_KEY
            base_url=self.api_url,
            **client_options(self._openai, self.remote.num_workers, self._timeout),
        )

    def with_user(self, body: dict[str, Any]) -> dict[str, Any]:
        """OpenAI's `user` field from remote_params.user_id, which Oumi sends to OpenAI."""
        if self.user_field and self.remote.user_id:
            body["user"] = self.remote.user_id
        return body

    def request_body(self, request: Request, model: str, stream: bool = False) -> dict[str, Any]:
        body = request_body(request, model, self.dialect, stream=stream, image_url=inline_image_url)
        return self.reasoning.apply(body, request.params)

    async def _before_send(self, client: Any) -> None:
        """A hook run before each attempt (GOOGLE_VERTEX refreshes its token here)."""

    async def model_for(self, client: Any) -> str:
        if self._served_model is None:
            try:
                page = await client.models.list()
            except Exception as exc:
                if getattr(exc, "status_code", None) not in (404, 405, 501):
                    raise  # a transient failure: retried like the request itself
                raise RequestError(
                    f"{self.api_url} does not list its models (GET /models answered "
                    f"{exc.status_code}); set --model.model_name",
                    ErrorKind.NOT_FOUND,
                    exc.status_code,
                ) from exc
            ids = [m.id for m in page.data]
            if not ids:
                raise RequestError(
                    f"{self.api_url} serves no models; set --model.model_name", ErrorKind.NOT_FOUND
                )
            self._served_model = ids[0]
        return self._served_model

    async def _send(self, client: Any, request: Request) -> Reply:
        await self._before_send(client)
        body = self.with_user(self.request_body(request, await self.model_for(client)))
        # The SDK's generic `post` (its documented way to send a body as is): the SDK still
        # builds, authenticates and sends the request and raises its errors, but skips
        # re-validating a body request_body already shaped and building response models,
        # about 0.7 ms of CPU a request, which a million-row job feels.
        raw = completion_prompt(request) is not None
        data = await _post(client, "/completions" if raw else "/chat/completions", body)
        reply = parse_chat_completion(data, self.model_name, self.reasoning.thought_tags)
        reply = read_scored(data, request, reply)
        if (kept := kept_beams(request.params, self.dialect)) is not None:
            reply.samples = reply.samples[:kept]
        return keep_requested_stops(reply, request.params.stop_strings)

    def embed_request_body(self, request: EmbedRequest, model: str) -> dict[str, Any]:
        """The /embeddings body for a request (`embed_body`), live or as an OpenAI Batch line."""
        return self.with_user(embed_body(request, model))

    async def _send_embed(self, client: Any, request: EmbedRequest) -> EmbedReply:
        await self._before_send(client)
        body = self.embed_request_body(request, await self.model_for(client))
        # The SDK's generic `post`, as `_send` does, so that a live reply and a batch's
        # output line are read by the same parser.
        reply = parse_embeddings(await _post(client, "/embeddings", body), self.model_name)
        if len(reply.embeddings) != len(request.inputs):
            raise MalformedResponse(
                f"the reply has {len(reply.embeddings)} vectors for {len(request.inputs)} inputs"
            )
        return reply

    async def _send_score(self, client: Any, request: ScoreRequest) -> ScoreReply:
        """vLLM's /score (beside its OpenAI routes): text_1 against each of text_2, through
        the SDK's generic `post`, which authenticates, sends and raises as for any route."""
        await self._before_send(client)
        body = score_body(request, await self.model_for(client))
        reply = parse_scores(await _post(client, "/score", body, "the reply is not a score list"))
        if len(reply.scores) != len(request.documents):
            raise MalformedResponse(
                f"the reply has {len(reply.scores)} scores for {len(request.documents)} documents"
            )
        return reply

    async def _send_stream(self, client: Any, request: Request) -> AsyncIterator[Delta | Reply]:
        kept = kept_beams(request.params, self.dialect)
        if kept is not None and completion_prompt(request) is not None:
            # vLLM's /completions answers a beam search whole, never as a stream (its chat
            # streams the beams when they end): ask without streaming, and pass the reply on.
            reply = await self._send(client, request)
            for index, sample in enumerate(reply.samples):
                if sample.text:
                    yield Delta(request.id, sample.text, index)
            yield reply
            return
        await self._before_send(client)
        body = self.with_user(self.request_body(request, await self.model_for(client), stream=True))
        kwargs, extra = _split(body)
        raw = completion_prompt(request) is not None
        api = client.completions if raw else client.chat.completions
        stream = await api.create(**kwargs, extra_body=extra or None)
        choices: dict[int, StreamedChoice] = {}
        usage = Usage()
        model = ""
        async with stream:
            async for chunk in stream:
                pieces: list[Delta] = []
                try:
                    model = chunk.model or model
                    if getattr(chunk, "usage", None):
                        usage = chat_usage(chunk.usage.model_dump())
                    for choice in chunk.choices or ():
                        index = choice.index or 0
                        if kept is not None and index >= kept:
                            continue  # a beam past the best n asked for
                        if index not in choices:
                            choices[index] = StreamedChoice(self.reasoning.thought_tags)
                        pieces += choices[index].add(choice, request, index)
                except (AttributeError, TypeError, KeyError, ValueError) as exc:
                    raise MalformedResponse(
                        f"a stream chunk is not a completion chunk ({exc})"
                    ) from exc
                for piece in pieces:
                    yield piece
        for index, choice in choices.items():
            for piece in choice.flush(request, index):
                yield piece
        reply = streamed_reply(choices, request.params, usage, model)
        yield keep_requested_stops(reply, request.params.stop_strings)


class BedrockEngine(OpenAICompatEngine):
    """Amazon Bedrock's OpenAI-compatible Chat Completions on bedrock-runtime, with a Bedrock
    API key. Oumi goes through boto3's Converse API instead, which reaches more models (this
    endpoint serves the open-weight ones); the region comes from AWS_REGION, as in Oumi."""

    def __init__(self, config: RunConfig):
        if not config.remote_params.api_url:
            region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
            if not region:
                raise ConfigError(
                    "engine BEDROCK needs a region: export AWS_REGION=us-east-1 (or give "
                    "--remote_params.api_url)"
                )
            url = f"https://bedrock-runtime.{region}.amazonaws.com/openai/v1"
            remote = dataclasses.replace(config.remote_params, api_url=url)
            config = dataclasses.replace(config, remote_params=remote)
        super().__init__(config)


class SGLangEngine(OpenAICompatEngine):
    """A running SGLang server, through its OpenAI-compatible API (/v1). Oumi's configs name
    SGLang's native endpoint (http://HOST:PORT/generate); that URL means the same server."""

    endpoint_paths = ("/v1/chat/completions", "/v1/completions", "/generate", "/v1")

    @classmethod
    def base_url(cls, url: str) -> str:
        base = super().base_url(url)
        return f"{base}/v1" if base else base


async def _post(
    client: Any, path: str, body: dict[str, Any], not_json: str = "the reply body is not JSON"
) -> Any:
    """A body sent as it is through the SDK's generic `post`, and the JSON it answers."""
    content = await client.post(path, body=body, cast_to=bytes, options=_BEARER_ONLY)
    try:
        return json.loads(content)
    except ValueError as exc:
        raise MalformedResponse(f"{not_json} ({exc})") from exc


def _split(body: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The SDK's keyword arguments, and the rest for `extra_body`."""
    kwargs = {k: v for k, v in body.items() if k in _SDK_ARGS}
    extra = {k: v for k, v in body.items() if k not in _SDK_ARGS}
    return kwargs, extra
