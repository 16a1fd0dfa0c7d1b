"""OPENAI, REMOTE, REMOTE_VLLM and the hosted OpenAI-compatible services, through the `openai` SDK.

One engine class speaks the chat-completions protocol; each service is its row in presets.py
(base URL, key variable, the generation parameters it accepts and how a few of them are spelled,
`Dialect`) bound onto it, and the two services that need code of their own (BEDROCK's regional
URL, SGLANG's endpoint paths) subclass it. `wire.openai.client.request_body` turns a Request into
the JSON body, the row's `ReasoningFields` add its reasoning bounds (reasoning.py), and
`parse_chat_completion` turns the JSON reply into samples and usage, each sample's thinking apart
from its answer; streamed, `StreamedChoice` does the same for each choice as it arrives.

`complete` (what `batch` uses) posts the body through the SDK's generic `post` and reads the JSON
reply straight into a Result, skipping the SDK's parameter and response models: the SDK still
builds, authenticates and sends the request and raises its usual errors, but the per-row CPU a
million-row job pays stays small.
`stream` (what `chat` and `serve` use) streams through the SDK with usage included.
`embed` posts an /embeddings body the same way (`_embed_body`, which an OpenAI Batch line of an
embed run carries too) and `parse_embeddings` reads the reply, live or from a batch's output.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import AsyncIterator
from typing import Any, ClassVar

import lmpress.vocabulary.tools as tools
from lmpress.configs.schema import RunConfig
from lmpress.engines.remote.base import RemoteEngine, client_options
from lmpress.engines.remote.reasoning import (
    ReasoningFields,
    message_reasoning,
    reasoning_tokens,
    split_thoughts,
)
from lmpress.vocabulary.embeddings import Embedding, EmbedRequest, ScoreRequest
from lmpress.vocabulary.errors import ConfigError, ErrorKind, RequestError
from lmpress.vocabulary.types import (
    FINISH_REASONS,
    Delta,
    FinishReason,
    GenerationParams,
    Request,
    Sample,
    TokenLogprob,
    ToolCall,
    Usage,
)
from lmpress.wire.images import inline_image_url
from lmpress.wire.openai import pooling as wire
from lmpress.wire.openai.client import OPENAI_PARAMS, Dialect, request_body
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
        if params.guided_decoding is not None:
            self.dialect.check_guided(params.guided_decoding, self.name)
        self.reasoning.check(params, self.name)

    def _make_client(self) -> Any:
        return self._openai.AsyncOpenAI(
            api_key=self.api_key or "EMPTY",  # never None: the SDK would read OPENAI_API_KEY
            base_url=self.api_url,
            **client_options(self._openai, self.remote.num_workers, self._timeout),
        )

    def _with_user(self, body: dict[str, Any]) -> dict[str, Any]:
        """OpenAI's `user` field from remote_params.user_id, which Oumi sends to OpenAI."""
        if self.user_field and self.remote.user_id:
            body["user"] = self.remote.user_id
        return body

    def _body(self, request: Request, model: str, stream: bool = False) -> dict[str, Any]:
        body = request_body(request, model, self.dialect, stream=stream, image_url=inline_image_url)
        return self.reasoning.apply(body, request.params)

    async def _before_send(self, client: Any) -> None:
        """A hook run before each attempt (GOOGLE_VERTEX refreshes its token here)."""

    async def _model(self, client: Any) -> str:
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
        body = self._with_user(self._body(request, await self._model(client)))
        # The SDK's generic `post` (its documented way to send a body as is): the SDK still
        # builds, authenticates and sends the request and raises its errors, but skips
        # re-validating a body request_body already shaped and building response models,
        # about 0.7 ms of CPU a request, which a million-row job feels.
        path = "/completions" if request.prompt is not None else "/chat/completions"
        content = await client.post(path, body=body, cast_to=bytes, options=_BEARER_ONLY)
        try:
            data = json.loads(content)
        except ValueError as exc:
            raise MalformedResponse(f"the reply body is not JSON ({exc})") from exc
        reply = parse_chat_completion(data, self.model_name, self.reasoning.thought_tags)
        return keep_requested_stops(reply, request.params.stop_strings)

    def _embed_body(self, request: EmbedRequest, model: str) -> dict[str, Any]:
        """The /embeddings body for a request, live or as an OpenAI Batch line. It asks for
        base64, as the SDK's own `embeddings.create` does: a quarter of the bytes of JSON
        floats, and the float32 values exactly (`parse_embeddings` reads either)."""
        body: dict[str, Any] = {"model": model, "input": request.inputs,
                                "encoding_format": "base64"}  # fmt: skip
        if request.dimensions is not None:
            body["dimensions"] = request.dimensions
        return self._with_user(body)

    async def _send_embed(self, client: Any, request: EmbedRequest) -> EmbedReply:
        await self._before_send(client)
        body = self._embed_body(request, await self._model(client))
        # The SDK's generic `post`, as `_send` does, so that a live reply and a batch's
        # output line are read by the same parser.
        content = await client.post("/embeddings", body=body, cast_to=bytes, options=_BEARER_ONLY)
        try:
            data = json.loads(content)
        except ValueError as exc:
            raise MalformedResponse(f"the reply body is not JSON ({exc})") from exc
        reply = parse_embeddings(data, self.model_name)
        if len(reply.embeddings) != len(request.inputs):
            raise MalformedResponse(
                f"the reply has {len(reply.embeddings)} vectors for {len(request.inputs)} inputs"
            )
        return reply

    async def _send_score(self, client: Any, request: ScoreRequest) -> ScoreReply:
        """vLLM's /score (beside its OpenAI routes): text_1 against each of text_2, through
        the SDK's generic `post`, which authenticates, sends and raises as for any route."""
        await self._before_send(client)
        body = {"model": await self._model(client), "text_1": request.query,
                "text_2": request.documents}  # fmt: skip
        content = await client.post("/score", body=body, cast_to=bytes, options=_BEARER_ONLY)
        try:
            data = json.loads(content)
            items = sorted(data["data"], key=lambda item: item["index"])
            scores = [float(item["score"]) for item in items]
            usage = Usage(int((data.get("usage") or {}).get("prompt_tokens") or 0), 0)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise MalformedResponse(f"the reply is not a score list ({exc})") from exc
        if len(scores) != len(request.documents):
            raise MalformedResponse(
                f"the reply has {len(scores)} scores for {len(request.documents)} documents"
            )
        return ScoreReply(scores, usage, data.get("model") or "")

    async def _send_stream(self, client: Any, request: Request) -> AsyncIterator[Delta | Reply]:
        await self._before_send(client)
        body = self._with_user(self._body(request, await self._model(client), stream=True))
        kwargs, extra = _split(body)
        api = client.completions if request.prompt is not None else client.chat.completions
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
                        usage = _usage(chunk.usage.model_dump())
                    for choice in chunk.choices or ():
                        index = choice.index or 0
                        if index not in choices:
                            choices[index] = StreamedChoice(self.reasoning)
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
        n = max([request.params.n, *(i + 1 for i in choices)])
        samples = [
            choices[i].sample(request.params.logprobs) if i in choices else Sample("", "stop")
            for i in range(n)
        ]
        if len(samples) == 1:
            samples[0].completion_tokens = usage.completion_tokens
            samples[0].reasoning_tokens = usage.reasoning_tokens
        yield keep_requested_stops(Reply(samples, usage, model), request.params.stop_strings)


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


# --- reading replies ---------------------------------------------------------------------


def finish_reason(value: str) -> FinishReason:
    """A provider's finish reason as lmpress's: OpenAI's own pass, any other ("eos", the old
    "function_call") is a stop."""
    return value if value in FINISH_REASONS else "stop"  # type: ignore[return-value]


def with_calls(sample: Sample, calls: list[ToolCall] | None) -> Sample:
    """The sample with the tool calls its reply made. A reply that calls is finished for
    that reason, whatever the provider said (OpenAI says "stop" for a forced call)."""
    if calls:
        sample.tool_calls = calls
        if sample.finish_reason == "stop":
            sample.finish_reason = "tool_calls"
    return sample


def parse_tool_calls(items: Any) -> list[ToolCall] | None:
    """A reply message's tool_calls as ToolCalls."""
    if items is None:
        return None
    try:
        return tools.parse_tool_calls(items, "message.tool_calls")
    except tools.ToolError as exc:
        raise MalformedResponse(f"the reply's {exc}") from None


class ToolCallDeltas:
    """One choice's streamed tool calls, assembled as the `openai` client does: a delta with
    an index opens or continues that call; names and arguments arrive in pieces."""

    def __init__(self) -> None:
        self.calls: dict[int, dict[str, Any]] = {}

    def add(self, delta: Any) -> None:
        call = self.calls.setdefault(delta.index or 0, {"id": "", "name": "", "arguments": ""})
        call["id"] = delta.id or call["id"]
        function = delta.function
        if function is not None:
            call["name"] += function.name or ""
            call["arguments"] += function.arguments or ""

    def assembled(self) -> list[ToolCall]:
        out = []
        for index in sorted(self.calls):
            call = self.calls[index]
            if not call["id"] or not call["name"]:
                raise MalformedResponse(f"streamed tool call {index} has no id or name")
            out.append(ToolCall(call["id"], call["name"], call["arguments"] or "{}"))
        return out


class StreamedChoice:
    """One streamed choice as it arrives: its thinking (`reasoning_content` or `reasoning`
    deltas, or Gemini's <thought> tags in the content) apart from its answer, its tool calls,
    logprobs and finish reason."""

    def __init__(self, reasoning: ReasoningFields):
        self.texts: list[str] = []
        self.thoughts: list[str] | None = None  # None until the choice thinks
        self.calls: ToolCallDeltas | None = None
        self.logprobs: list[TokenLogprob] = []
        self.finish: FinishReason = "stop"
        self.stop_reason: Any = None  # vLLM's and SGLang's: the stop string or token matched
        self.splitter = reasoning.splitter()

    def add(self, choice: Any, request: Request, index: int) -> list[Delta]:
        """The deltas one chunk's choice brings: thinking first, then answer."""
        thought = ""
        if request.prompt is None:
            delta = choice.delta
            text = (delta.content if delta is not None else None) or ""
            thought = (message_reasoning(delta) if delta is not None else None) or ""
            for part in (delta.tool_calls if delta is not None else None) or ():
                self.calls = self.calls or ToolCallDeltas()
                self.calls.add(part)
            if choice.logprobs is not None:
                self.logprobs.extend(_token_logprobs(choice.logprobs.model_dump()))
        else:
            text = choice.text or ""
        if self.splitter is not None and text:
            more, text = self.splitter.feed(text)
            thought += more
        if choice.finish_reason:
            self.finish = finish_reason(choice.finish_reason)
            self.stop_reason = getattr(choice, "stop_reason", None)
        return self._deltas(request, index, thought, text)

    def flush(self, request: Request, index: int) -> list[Delta]:
        """What a splitter held back, once the stream has ended."""
        if self.splitter is None:
            return []
        return self._deltas(request, index, *self.splitter.flush())

    def _deltas(self, request: Request, index: int, thought: str, text: str) -> list[Delta]:
        out = []
        if thought:
            self.thoughts = (self.thoughts or []) + [thought]
            out.append(Delta(request.id, thought, index, reasoning=True))
        if text:
            self.texts.append(text)
            out.append(Delta(request.id, text, index))
        return out

    def sample(self, logprobs: bool) -> Sample:
        sample = Sample("".join(self.texts), self.finish, self.logprobs if logprobs else None)
        if self.thoughts is not None:
            sample.reasoning = "".join(self.thoughts)
        sample.stop_sequence = _stop_sequence(self.finish, self.stop_reason)
        return with_calls(sample, self.calls.assembled() if self.calls else None)


def parse_chat_completion(data: Any, model: str = "", thought_tags: bool = False) -> Reply:
    """A chat-completions (or completions) JSON reply as samples, usage and the model name;
    each message's thinking (`message_reasoning`, or with `thought_tags` Gemini's <thought>
    head of the content) apart from its answer."""
    if not isinstance(data, dict):
        raise MalformedResponse(f"expected a JSON object, got {type(data).__name__}")
    if "error" in data and "choices" not in data:
        error = data["error"]
        message = error.get("message") if isinstance(error, dict) else error
        raise MalformedResponse(f"the server answered 200 with an error: {message}")
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices:
        raise MalformedResponse("the reply has no choices")
    samples: list[tuple[int, Sample]] = []
    for choice in choices:
        if not isinstance(choice, dict):
            raise MalformedResponse("a choice is not an object")
        sample = _choice_sample(choice, thought_tags)
        index = choice.get("index")
        samples.append((index if isinstance(index, int) else len(samples), sample))
    samples.sort(key=lambda pair: pair[0])
    usage = data.get("usage")
    result = _usage(usage if isinstance(usage, dict) else {})
    if len(samples) == 1:
        samples[0][1].completion_tokens = result.completion_tokens
        samples[0][1].reasoning_tokens = result.reasoning_tokens
    return Reply([s for _, s in samples], result, data.get("model") or model)


def _choice_sample(choice: dict[str, Any], thought_tags: bool) -> Sample:
    message = choice.get("message")
    calls = None
    reasoning = None
    if isinstance(message, dict):
        text = message.get("content")
        lp = choice.get("logprobs")
        logprobs = _token_logprobs(lp) if isinstance(lp, dict) else None
        calls = parse_tool_calls(message.get("tool_calls"))
        reasoning = message_reasoning(message)
    else:
        text = choice.get("text")
        logprobs = None
    if text is not None and not isinstance(text, str):
        raise MalformedResponse("a choice's content is not text")
    if thought_tags and text:
        thoughts, text = split_thoughts(text)
        if thoughts is not None:
            reasoning = thoughts if reasoning is None else reasoning + thoughts
    sample = Sample(text or "", finish_reason(choice.get("finish_reason") or "stop"), logprobs)
    sample.reasoning = reasoning
    sample.stop_sequence = _stop_sequence(sample.finish_reason, choice.get("stop_reason"))
    return with_calls(sample, calls)


def _stop_sequence(finish: str, stop_reason: Any) -> str | None:
    """vLLM's and SGLang's `stop_reason` (beside finish_reason: the stop string matched, or a
    stop token's id) where it names a string that ended the choice."""
    return stop_reason if finish == "stop" and isinstance(stop_reason, str) else None


def keep_requested_stops(reply: Reply, stops: list[str]) -> Reply:
    """The reply with each sample's stop_sequence kept only where it is one of the request's
    stop strings (a server may name a stop of its own, from the model's generation config)."""
    for sample in reply.samples:
        if sample.stop_sequence not in stops:
            sample.stop_sequence = None
    return reply


def _usage(usage: dict[str, Any]) -> Usage:
    """A chat-completions usage; the prompt's cached share in `prompt_tokens_details`
    (OpenAI's, and Gemini's where it gives it)."""
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return Usage(
        int(usage.get("prompt_tokens") or 0),
        int(usage.get("completion_tokens") or 0),
        reasoning_tokens(usage),
        cached_tokens=int(cached or 0),
    )


def parse_embeddings(data: Any, model: str = "") -> EmbedReply:
    """An embeddings list (OpenAI's /embeddings response body), its vectors in input order,
    floats or base64 alike."""
    try:
        items = sorted(data["data"], key=lambda item: item["index"])
        embeddings = [Embedding(wire.decoded(item["embedding"])) for item in items]
        usage = Usage(int((data.get("usage") or {}).get("prompt_tokens") or 0), 0)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise MalformedResponse(f"the reply is not an embeddings list ({exc})") from exc
    return EmbedReply(embeddings, usage, data.get("model") or model)


def _token_logprobs(logprobs: dict[str, Any]) -> list[TokenLogprob]:
    return [
        TokenLogprob(
            t.get("token", ""),
            float(t.get("logprob", 0.0)),
            [
                (top.get("token", ""), float(top.get("logprob", 0.0)))
                for top in t.get("top_logprobs") or ()
            ],
        )  # fmt: skip
        for t in logprobs.get("content") or ()
    ]


def _split(body: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The SDK's keyword arguments, and the rest for `extra_body`."""
    kwargs = {k: v for k, v in body.items() if k in _SDK_ARGS}
    extra = {k: v for k, v in body.items() if k not in _SDK_ARGS}
    return kwargs, extra
