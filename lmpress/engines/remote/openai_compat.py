"""OPENAI, REMOTE, REMOTE_VLLM and the hosted OpenAI-compatible services, through the `openai` SDK.

One engine class speaks the chat-completions protocol; each service is a small subclass that
sets its base URL, its key variable, the generation parameters it accepts and how a few of them
are spelled (`Dialect`). `request_body` turns a Request into the JSON body and
`parse_chat_completion` turns the JSON reply into samples and usage: the whole translation.

`complete` (what `batch` uses) posts the body through the SDK's generic `post` and reads the JSON
reply straight into a Result, skipping the SDK's parameter and response models: the SDK still
builds, authenticates and sends the request and raises its usual errors, but the per-row CPU a
million-row job pays stays small.
`stream` (what `chat` and `serve` use) streams through the SDK with usage included.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import mimetypes
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import unquote, urlparse

from lmpress.configs.schema import RunConfig
from lmpress.engines.remote.base import MalformedResponse, RemoteEngine, Reply, client_options
from lmpress.errors import ConfigError, RequestError
from lmpress.types import Delta, GenerationParams, Message, Request, Sample, TokenLogprob, Usage

# What every OpenAI-compatible chat endpoint takes.
OPENAI_PARAMS = frozenset({
    "max_new_tokens", "temperature", "top_p", "presence_penalty", "frequency_penalty",
    "stop_strings", "seed", "n", "logprobs", "top_logprobs", "logit_bias", "guided_decoding",
})  # fmt: skip
# Sampling fields many open-model servers add, sent under the same names as extra body fields.
OPEN_MODEL_PARAMS = frozenset({"top_k", "min_p", "repetition_penalty"})
VLLM_PARAMS = OPEN_MODEL_PARAMS | {"min_tokens", "stop_token_ids", "skip_special_tokens"}
# Send only the bearer key: the SDK would add OPENAI_ADMIN_KEY from the environment otherwise.
_BEARER_ONLY: dict[str, Any] = {"security": {"bearer_auth": True}}
# SDK keyword arguments of chat.completions.create; anything else goes in `extra_body`.
_SDK_ARGS = frozenset({
    "messages", "model", "prompt", "max_tokens", "max_completion_tokens", "temperature", "top_p",
    "presence_penalty", "frequency_penalty", "stop", "seed", "n", "logprobs", "top_logprobs",
    "logit_bias", "response_format", "stream", "stream_options",
})  # fmt: skip


@dataclass(frozen=True)
class Dialect:
    """How one service spells what lmpress asks for."""

    max_tokens_field: str = "max_tokens"
    # Generation fields sent under their own names beyond OpenAI's set (vLLM's top_k...).
    extra_fields: frozenset[str] = frozenset()
    # guided_decoding forms accepted: "json" -> response_format; vLLM also regex/choice/grammar.
    guided_forms: frozenset[str] = frozenset({"json"})
    guided_field: str = "response_format"  # or "structured_outputs" (vLLM)


class OpenAICompatEngine(RemoteEngine):
    """Any OpenAI-compatible server at remote_params.api_url (vLLM, llama.cpp, lmpress serve...)."""

    name = "REMOTE"
    supported_params = OPENAI_PARAMS
    dialect: ClassVar[Dialect] = Dialect()
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
        if params.guided_decoding:
            guided_value(params.guided_decoding, self.dialect, self.name)

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
                    "not_found",
                    exc.status_code,
                ) from exc
            ids = [m.id for m in page.data]
            if not ids:
                raise RequestError(
                    f"{self.api_url} serves no models; set --model.model_name", "not_found"
                )
            self._served_model = ids[0]
        return self._served_model

    async def _send(self, client: Any, request: Request) -> Reply:
        await self._before_send(client)
        body = self._with_user(request_body(request, await self._model(client), self.dialect))
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
        return parse_chat_completion(data, self.model_name)

    async def _send_stream(self, client: Any, request: Request) -> AsyncIterator[Delta | Reply]:
        await self._before_send(client)
        body = request_body(request, await self._model(client), self.dialect, stream=True)
        body = self._with_user(body)
        kwargs, extra = _split(body)
        api = client.completions if request.prompt is not None else client.chat.completions
        stream = await api.create(**kwargs, extra_body=extra or None)
        texts: dict[int, list[str]] = {}
        finish: dict[int, str] = {}
        logprobs: dict[int, list[TokenLogprob]] = {}
        usage = Usage()
        model = ""
        async with stream:
            async for chunk in stream:
                pieces: list[tuple[int, str]] = []
                try:
                    model = chunk.model or model
                    if getattr(chunk, "usage", None):
                        usage = Usage(
                            chunk.usage.prompt_tokens or 0, chunk.usage.completion_tokens or 0
                        )
                    for choice in chunk.choices or ():
                        index = choice.index or 0
                        if request.prompt is None:
                            delta = choice.delta
                            text = (delta.content if delta is not None else None) or ""
                        else:
                            text = choice.text or ""
                        if text:
                            pieces.append((index, text))
                        if choice.logprobs is not None and request.prompt is None:
                            logprobs.setdefault(index, []).extend(
                                _token_logprobs(choice.logprobs.model_dump())
                            )
                        if choice.finish_reason:
                            finish[index] = choice.finish_reason
                except (AttributeError, TypeError, KeyError, ValueError) as exc:
                    raise MalformedResponse(
                        f"a stream chunk is not a completion chunk ({exc})"
                    ) from exc
                for index, text in pieces:
                    texts.setdefault(index, []).append(text)
                    yield Delta(request.id, text, index)
        n = max([request.params.n, *(i + 1 for i in texts), *(i + 1 for i in finish)])
        samples = [
            Sample(
                "".join(texts.get(i, [])),
                finish.get(i, "stop"),
                logprobs.get(i) if request.params.logprobs else None,
            )
            for i in range(n)
        ]
        if len(samples) == 1:
            samples[0].completion_tokens = usage.completion_tokens
        yield Reply(samples, usage, model)


class OpenAIEngine(OpenAICompatEngine):
    """OpenAI's chat completions API."""

    name = "OPENAI"
    default_api_url = "https://api.openai.com/v1"
    default_key_env = "OPENAI_API_KEY"
    key_required = True
    model_required = True
    dialect = Dialect(max_tokens_field="max_completion_tokens")
    user_field = True


class RemoteVLLMEngine(OpenAICompatEngine):
    """A vLLM server: REMOTE plus vLLM's own sampling fields and structured outputs."""

    name = "REMOTE_VLLM"
    supported_params = OPENAI_PARAMS | VLLM_PARAMS
    dialect = Dialect(
        extra_fields=VLLM_PARAMS,
        guided_forms=frozenset({"json", "regex", "choice", "grammar"}),
        guided_field="structured_outputs",
    )


GOOGLE_PARAMS = frozenset({
    "max_new_tokens", "temperature", "top_p", "n", "stop_strings", "seed", "presence_penalty",
    "frequency_penalty", "guided_decoding",
})  # fmt: skip
# Hosts of open models take their extra sampling fields, and no logit_bias (token ids differ).
_OPEN_MODEL_HOST_PARAMS = (OPENAI_PARAMS - {"logit_bias"}) | OPEN_MODEL_PARAMS


class _Preset(OpenAICompatEngine):
    """A hosted service: REMOTE with its own base URL, key variable and parameters."""

    key_required = True
    model_required = True


class GeminiEngine(_Preset):
    """Google Gemini through its OpenAI-compatible endpoint."""

    name = "GEMINI"
    default_api_url = "https://generativelanguage.googleapis.com/v1beta/openai/"
    default_key_env = "GEMINI_API_KEY"
    supported_params = GOOGLE_PARAMS


class TogetherEngine(_Preset):
    name = "TOGETHER"
    default_api_url = "https://api.together.xyz/v1"
    default_key_env = "TOGETHER_API_KEY"
    supported_params = _OPEN_MODEL_HOST_PARAMS
    dialect = Dialect(extra_fields=OPEN_MODEL_PARAMS)


class ParasailEngine(_Preset):
    name = "PARASAIL"
    default_api_url = "https://api.parasail.io/v1"
    default_key_env = "PARASAIL_API_KEY"
    supported_params = _OPEN_MODEL_HOST_PARAMS
    dialect = Dialect(extra_fields=OPEN_MODEL_PARAMS)


class DeepSeekEngine(_Preset):
    name = "DEEPSEEK"
    default_api_url = "https://api.deepseek.com/v1"
    default_key_env = "DEEPSEEK_API_KEY"
    supported_params = frozenset({
        "max_new_tokens", "temperature", "top_p", "presence_penalty", "frequency_penalty",
        "stop_strings", "logprobs", "top_logprobs",
    })  # fmt: skip


class OpenRouterEngine(_Preset):
    name = "OPENROUTER"
    default_api_url = "https://openrouter.ai/api/v1"
    default_key_env = "OPENROUTER_API_KEY"
    supported_params = OPENAI_PARAMS | OPEN_MODEL_PARAMS
    dialect = Dialect(extra_fields=OPEN_MODEL_PARAMS)


class FireworksEngine(_Preset):
    name = "FIREWORKS"
    default_api_url = "https://api.fireworks.ai/inference/v1"
    default_key_env = "FIREWORKS_API_KEY"
    supported_params = _OPEN_MODEL_HOST_PARAMS
    dialect = Dialect(extra_fields=OPEN_MODEL_PARAMS)


class SambaNovaEngine(_Preset):
    name = "SAMBANOVA"
    default_api_url = "https://api.sambanova.ai/v1"
    default_key_env = "SAMBANOVA_API_KEY"
    supported_params = frozenset({
        "max_new_tokens", "temperature", "top_p", "top_k", "stop_strings",
    })  # fmt: skip
    dialect = Dialect(extra_fields=frozenset({"top_k"}))


class CerebrasEngine(_Preset):
    name = "CEREBRAS"
    default_api_url = "https://api.cerebras.ai/v1"
    default_key_env = "CEREBRAS_API_KEY"
    supported_params = frozenset({
        "max_new_tokens", "temperature", "top_p", "stop_strings", "seed", "logprobs",
        "top_logprobs", "guided_decoding",
    })  # fmt: skip


class HuggingFaceRouterEngine(_Preset):
    """Hugging Face Inference Providers, through the router's OpenAI-compatible API."""

    name = "HUGGING_FACE_ROUTER"
    default_api_url = "https://router.huggingface.co/v1"
    default_key_env = "HF_TOKEN"
    supported_params = OPENAI_PARAMS - {"logit_bias"}


class BedrockEngine(_Preset):
    """Amazon Bedrock's OpenAI-compatible Chat Completions on bedrock-runtime, with a Bedrock
    API key. Oumi goes through boto3's Converse API instead, which reaches more models (this
    endpoint serves the open-weight ones); the region comes from AWS_REGION, as in Oumi."""

    name = "BEDROCK"
    default_key_env = "AWS_BEARER_TOKEN_BEDROCK"
    supported_params = frozenset({
        "max_new_tokens", "temperature", "top_p", "stop_strings",
    })  # fmt: skip

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

    name = "SGLANG"
    supported_params = OPENAI_PARAMS | VLLM_PARAMS
    dialect = Dialect(extra_fields=VLLM_PARAMS)  # guided_decoding.json as response_format
    endpoint_paths = ("/v1/chat/completions", "/v1/completions", "/generate", "/v1")

    @classmethod
    def base_url(cls, url: str) -> str:
        base = super().base_url(url)
        return f"{base}/v1" if base else base


# --- the translation ---------------------------------------------------------------------


def request_body(
    request: Request, model: str, dialect: Dialect, *, stream: bool = False
) -> dict[str, Any]:
    """The JSON body of a chat-completions (or, for a raw prompt, completions) request.

    Fields left at lmpress's defaults are not sent, so the server's own defaults apply, except
    temperature, which is always sent: lmpress's default (0, greedy) is not the services'.
    """
    p = request.params
    body: dict[str, Any] = {"model": model}
    if request.prompt is not None:
        body["prompt"] = request.prompt
    else:
        body["messages"] = [_message(m) for m in request.messages]
    body["max_tokens" if request.prompt is not None else dialect.max_tokens_field] = (
        p.max_new_tokens
    )
    body["temperature"] = p.temperature
    if p.top_p != 1.0:
        body["top_p"] = p.top_p
    if p.presence_penalty:
        body["presence_penalty"] = p.presence_penalty
    if p.frequency_penalty:
        body["frequency_penalty"] = p.frequency_penalty
    if p.stop_strings:
        body["stop"] = list(p.stop_strings)
    if p.seed is not None:
        body["seed"] = p.seed
    if p.n != 1:
        body["n"] = p.n
    if p.logprobs:
        if request.prompt is not None:
            body["logprobs"] = p.top_logprobs or 1
        else:
            body["logprobs"] = True
            if p.top_logprobs:
                body["top_logprobs"] = p.top_logprobs
    if p.logit_bias:
        body["logit_bias"] = dict(p.logit_bias)
    defaults = GenerationParams()
    for name in sorted(dialect.extra_fields):
        value = getattr(p, name)
        if value != getattr(defaults, name):
            body[name] = list(value) if isinstance(value, list) else value
    if p.guided_decoding:
        body[dialect.guided_field] = guided_value(p.guided_decoding, dialect, "this engine")
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}  # a usage chunk at the end
    return body


def guided_value(guided: dict[str, Any], dialect: Dialect, engine: str) -> dict[str, Any]:
    """guided_decoding ({"json": schema} | {"regex": ...} | {"choice": [...]} | {"grammar": ...})
    as the service's field: OpenAI's response_format, or vLLM's structured_outputs."""
    forms = sorted(set(guided) & {"json", "regex", "choice", "grammar"})
    unknown = sorted(set(guided) - {"json", "regex", "choice", "grammar"})
    if unknown or len(forms) != 1:
        raise RequestError(
            "generation.guided_decoding takes exactly one of json, regex, choice, grammar "
            f"(got {', '.join(sorted(guided)) or 'nothing'})",
            "invalid_request",
        )
    form = forms[0]
    if form not in dialect.guided_forms:
        allowed = ", ".join(sorted(dialect.guided_forms))
        raise RequestError(
            f"engine {engine} supports guided_decoding.{allowed} only, not {form}",
            "unsupported_param",
        )
    value = guided[form]
    if dialect.guided_field == "structured_outputs":
        if form == "json" and isinstance(value, str):
            value = json.loads(value)
        return {form: value}
    if isinstance(value, str):
        value = json.loads(value)
    if value is True or value == {} or value == {"type": "object"}:
        return {"type": "json_object"}
    if not isinstance(value, dict):
        raise RequestError(
            "guided_decoding.json must be a JSON schema (an object)", "invalid_request"
        )
    return {"type": "json_schema", "json_schema": {"name": "response", "schema": value}}


def _message(message: Message) -> dict[str, Any]:
    out = message.to_openai()
    if isinstance(out["content"], list):
        for part in out["content"]:
            if part["type"] == "image_url":
                part["image_url"]["url"] = inline_image_url(part["image_url"]["url"])
    return out


def inline_image_url(url: str) -> str:
    """A file:// (or bare path) image as a data: URL: a remote server cannot read local files."""
    if url.startswith(("http://", "https://", "data:", "gs://")):
        return url
    path = Path(unquote(urlparse(url).path) if url.startswith("file:") else url)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise RequestError(f"cannot read image {path}: {exc.strerror}", "invalid_request") from exc
    mime = mimetypes.guess_type(path.name)[0] or "image/png"
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


def parse_chat_completion(data: Any, model: str = "") -> Reply:
    """A chat-completions (or completions) JSON reply as samples, usage and the model name."""
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
        message = choice.get("message")
        if isinstance(message, dict):
            text = message.get("content")
            lp = choice.get("logprobs")
            logprobs = _token_logprobs(lp) if isinstance(lp, dict) else None
        else:
            text = choice.get("text")
            logprobs = None
        if text is not None and not isinstance(text, str):
            raise MalformedResponse("a choice's content is not text")
        index = choice.get("index")
        samples.append(
            (
                index if isinstance(index, int) else len(samples),
                Sample(text or "", choice.get("finish_reason") or "stop", logprobs),
            )
        )
    samples.sort(key=lambda pair: pair[0])
    usage = data.get("usage")
    usage = usage if isinstance(usage, dict) else {}
    result = Usage(int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0))
    if len(samples) == 1:
        samples[0][1].completion_tokens = result.completion_tokens
    return Reply([s for _, s in samples], result, data.get("model") or model)


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
