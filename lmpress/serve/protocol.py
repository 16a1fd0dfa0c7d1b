"""The OpenAI wire protocol, the way in: request bodies, and the errors they earn.

Bodies are checked by strict pydantic models (an unknown argument or a wrong type is a 400
naming the argument), then turned into GenerationParams overrides that remember which argument
each came from. The way out (response bodies, stream chunks) is in `responses`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from openai.types import ErrorObject
from pydantic import BaseModel, ConfigDict, ValidationError

from lmpress.configs.schema import RANGE_CHECKS
from lmpress.types import Result

# --- errors ----------------------------------------------------------------------------------


class ApiError(Exception):
    """A failure to answer with an OpenAI error object and an HTTP status."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        error = ErrorObject(message=self.message, type=self.type, param=self.param, code=self.code)
        return {
            "error": error.model_dump(mode="json", include={"message", "type", "param", "code"})
        }


def error_from_result(result: Result) -> ApiError:
    """The HTTP error for a request the engine could not complete."""
    assert result.error is not None
    kind, status = result.error.kind, result.error.status
    if status is None:
        status = 400 if kind in ("invalid_request", "context_length_exceeded") else 500
    type_ = "invalid_request_error" if 400 <= status < 500 else "server_error"
    return ApiError(status, result.error.message, type=type_, code=kind)


# --- request bodies --------------------------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(_Strict):
    include_usage: bool | None = None
    include_obfuscation: bool | None = None  # nothing to obfuscate here; accepted


class _Body(_Strict):
    """What both endpoints accept. The extensions at the end use vLLM's names; the official
    client sends them with `extra_body`."""

    model: str
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: int | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    user: str | None = None  # accepted; it changes nothing here
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int | None = None
    stop_token_ids: list[int] | None = None
    skip_special_tokens: bool | None = None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatCompletionBody(_Body):
    messages: list[Any]
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    response_format: dict[str, Any] | None = None
    # Accepted and without effect on what is generated.
    store: bool | None = None
    metadata: dict[str, Any] | None = None
    service_tier: str | None = None
    parallel_tool_calls: bool | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    # Refused when given a value: lmpress cannot honour them.
    tools: Any = None
    tool_choice: Any = None
    functions: Any = None
    function_call: Any = None
    audio: Any = None
    modalities: Any = None
    prediction: Any = None
    web_search_options: Any = None
    reasoning_effort: Any = None
    verbosity: Any = None


class CompletionBody(_Body):
    prompt: Any
    logprobs: int | None = None
    echo: bool | None = None
    best_of: int | None = None
    suffix: str | None = None


UNSUPPORTED_CHAT_ARGS = (
    "tools", "tool_choice", "functions", "function_call", "audio", "prediction",
    "web_search_options", "reasoning_effort", "verbosity",
)  # fmt: skip


def parse_body(model: type[_Strict], raw: bytes) -> Any:
    """A request body as `model`, or a 400 naming what is wrong."""
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"the request body is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ApiError(400, "the request body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise _validation_error(exc) from exc


def _validation_error(exc: ValidationError) -> ApiError:
    first = exc.errors()[0]
    loc = [str(part) for part in first["loc"]]
    # A union reports one error per member, with the member's type (`str`, `list[str]`) in `loc`.
    parts = [p for p in loc if p not in ("str", "int", "float", "bool") and "[" not in p]
    member = len(parts) < len(loc)
    name = ".".join(parts)
    if first["type"] == "extra_forbidden":
        return ApiError(400, f"Unrecognized request argument supplied: {name}", param=name)
    if first["type"] == "missing":
        return ApiError(400, f"Missing required parameter: '{name}'", param=name)
    if member:
        return ApiError(400, f"Invalid type for '{name}': {first['input']!r}", param=name)
    return ApiError(400, f"Invalid value for '{name}': {first['msg']}", param=name)


@dataclass
class Sampling:
    """A body's generation settings as GenerationParams overrides, and for each overridden
    field the argument it came from, so that errors name what the client sent."""

    overrides: dict[str, Any] = field(default_factory=dict)
    source: dict[str, str] = field(default_factory=dict)

    def set(self, name: str, value: Any, argument: str) -> None:
        check = RANGE_CHECKS.get(f"generation.{name}")
        if check is not None and not check[0](value):
            raise ApiError(400, f"'{argument}': {value!r} {check[1]}", param=argument)
        self.overrides[name] = value
        self.source[name] = argument


def _common_sampling(body: _Body, max_tokens: int | None) -> Sampling:
    sampling = Sampling()
    if body.stream_options is not None and not body.stream:
        raise ApiError(
            400, "'stream_options' is only allowed when 'stream' is true", param="stream_options"
        )
    if max_tokens is not None:
        argument = "max_completion_tokens" if "max_completion_tokens" in _given(body) else ""
        sampling.set("max_new_tokens", max_tokens, argument or "max_tokens")
    same = ("temperature", "top_p", "n", "seed", "presence_penalty", "frequency_penalty",
            "logit_bias", "top_k", "min_p", "repetition_penalty", "min_tokens", "stop_token_ids",
            "skip_special_tokens")  # fmt: skip
    for name in same:
        value = getattr(body, name)
        if value is not None:
            sampling.set(name, value, name)
    if body.stop is not None:
        stops = [body.stop] if isinstance(body.stop, str) else list(body.stop)
        if any(not s for s in stops):
            raise ApiError(400, "'stop': an empty stop string would stop at once", param="stop")
        if stops:
            sampling.set("stop_strings", stops, "stop")
    return sampling


def _given(body: BaseModel) -> set[str]:
    return {name for name in body.model_fields_set if getattr(body, name) is not None}


def chat_sampling(body: ChatCompletionBody) -> Sampling:
    for name in UNSUPPORTED_CHAT_ARGS:
        value = getattr(body, name)
        if value not in (None, [], {}, "none"):
            raise ApiError(
                400, f"'{name}' is not supported by lmpress serve", param=name, code="unsupported"
            )
    if body.modalities not in (None, ["text"]):
        raise ApiError(400, "only the 'text' modality is supported", param="modalities")
    sampling = _common_sampling(body, _first(body.max_completion_tokens, body.max_tokens))
    if body.logprobs:
        sampling.set("logprobs", True, "logprobs")
    if body.top_logprobs:
        if not body.logprobs:
            raise ApiError(400, "'top_logprobs' needs 'logprobs' set to true", param="top_logprobs")
        sampling.set("top_logprobs", body.top_logprobs, "top_logprobs")
    guided = _guided_decoding(body.response_format)
    if guided is not None:
        sampling.set("guided_decoding", guided, "response_format")
    return sampling


def completion_sampling(body: CompletionBody) -> Sampling:
    if body.suffix:
        raise ApiError(400, "'suffix' is not supported by lmpress serve", param="suffix")
    if body.best_of is not None and body.best_of != (body.n or 1):
        raise ApiError(400, "'best_of' other than 'n' is not supported", param="best_of")
    if body.echo and body.logprobs is not None:
        raise ApiError(400, "'echo' with 'logprobs' is not supported", param="echo")
    sampling = _common_sampling(body, body.max_tokens)
    if body.logprobs is not None:
        if not 0 <= body.logprobs <= 5:
            raise ApiError(400, "'logprobs': must be in [0, 5]", param="logprobs")
        sampling.set("logprobs", True, "logprobs")
        if body.logprobs:
            sampling.set("top_logprobs", body.logprobs, "logprobs")
    return sampling


def completion_prompts(body: CompletionBody) -> list[str]:
    prompt = body.prompt
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        return list(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(p, (int, list)) for p in prompt):
        raise ApiError(400, "prompts as token ids are not supported; send text", param="prompt")
    raise ApiError(400, "'prompt' must be a string or a non-empty list of strings", param="prompt")


def _guided_decoding(response_format: dict[str, Any] | None) -> dict[str, Any] | None:
    """OpenAI's response_format as GenerationParams.guided_decoding: {"json": schema}, where
    any JSON object is the schema {"type": "object"}."""
    if response_format is None:
        return None
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"json": {"type": "object"}}
    if kind == "json_schema":
        schema = (response_format.get("json_schema") or {}).get("schema")
        if not isinstance(schema, dict):
            raise ApiError(
                400,
                "'response_format.json_schema.schema' must be an object",
                param="response_format",
            )
        return {"json": schema}
    raise ApiError(
        400,
        f"'response_format': unknown type {json.dumps(kind)} (text, json_object or json_schema)",
        param="response_format",
    )


def _first(*values: Any) -> Any:
    return next((v for v in values if v is not None), None)
