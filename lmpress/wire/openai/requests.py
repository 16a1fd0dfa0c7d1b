"""OpenAI request bodies, the way in: checked by strict pydantic models (an unknown argument or
a wrong type is refused, naming the argument), then turned into GenerationParams overrides that
remember which argument each came from.

`lmpress serve` reads a body from HTTP, `lmpress batch` from an OpenAI Batch line's `body`;
both go through these functions, so one accepts exactly what the other does. `where` is how
the front names a body's argument in a message: "" for serve, "body." for a batch line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from lmpress.configs.schema import RANGE_CHECKS
from lmpress.vocabulary.errors import ConfigError
from lmpress.vocabulary.guided import GuidedDecoding
from lmpress.vocabulary.tools import ToolError, check_tool_choice, check_tools
from lmpress.wire.openai.errors import ApiError

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(_Strict):
    include_usage: bool | None = None
    include_obfuscation: bool | None = None  # nothing to obfuscate here; accepted


class _Body(_Strict):
    """What both endpoints accept. The extensions at the end use vLLM's names; the official
    client sends them with `extra_body`."""

    model: str | None = None  # serve requires it (`require_model`); a batch line may leave it
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
    metadata: dict[str, Any] | None = None  # accepted; it changes nothing here
    store: bool | None = None  # accepted; it changes nothing here
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int | None = None
    stop_token_ids: list[int] | None = None
    skip_special_tokens: bool | None = None
    ignore_eos: bool | None = None  # vLLM's: the reply runs past the model's end tokens
    bad_words: list[str] | None = None  # vLLM's: words the reply never writes
    # vLLM's beam search: `best_of` beams (a completion's; else `n`), the best `n` returned.
    use_beam_search: bool | None = None
    length_penalty: float | None = None
    early_stopping: bool | str | None = None
    # A reasoning model's thinking budget in tokens: lmpress's name, and vLLM's.
    max_reasoning_tokens: int | None = None
    thinking_token_budget: int | None = None
    # vLLM's: the prompt's own tokens' logprobs, with this many alternatives at each.
    prompt_logprobs: int | None = None

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
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    # Function tools, checked by `lmpress.vocabulary.tools`; an engine that cannot take them refuses them.
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    reasoning_effort: str | None = None  # none, minimal, low, medium, high
    # vLLM's per-request template variables; of them lmpress takes `enable_thinking` (Qwen3's
    # and SmolLM3's switch), which is what reasoning_effort none sets on those templates.
    chat_template_kwargs: dict[str, Any] | None = None
    # Refused when given a value: lmpress cannot honour them.
    functions: Any = None
    function_call: Any = None
    audio: Any = None
    modalities: Any = None
    prediction: Any = None
    web_search_options: Any = None
    verbosity: Any = None


class CompletionBody(_Body):
    prompt: Any
    logprobs: int | None = None
    echo: bool | None = None
    best_of: int | None = None
    suffix: str | None = None


UNSUPPORTED_CHAT_ARGS = (
    "functions", "function_call", "audio", "prediction", "web_search_options", "verbosity",
)  # fmt: skip

Body = TypeVar("Body", bound=_Strict)


# How deep a request body's arrays and objects may nest. Generous for what a request holds (a
# JSON schema 30 levels deep nests about 64), and far below where Python's own recursion, in
# the parser or in code that walks a schema, would fail.
MAX_JSON_DEPTH = 64


def parse_body(model: type[Body], raw: bytes) -> Body:
    """A request body's bytes as `model`, or a 400 naming what is wrong."""
    too_deep = ApiError(
        400, f"the request body nests arrays and objects more than {MAX_JSON_DEPTH} deep"
    )
    try:
        data = json.loads(raw)
    except RecursionError:  # nested so deep that the parser gave up
        raise too_deep from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"the request body is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ApiError(400, "the request body must be a JSON object")
    if nesting(data) > MAX_JSON_DEPTH:
        raise too_deep
    return validate_body(model, data)


def nesting(data: Any) -> int:
    """How deep decoded JSON's arrays and objects nest (1 for a flat object), walked without
    recursion."""
    deepest, stack = 0, [(data, 1)]
    while stack:
        value, depth = stack.pop()
        children = value.values() if isinstance(value, dict) else value
        deepest = max(deepest, depth)
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return deepest


def validate_body(model: type[Body], data: dict[str, Any], where: str = "") -> Body:
    """A decoded body as `model`, or a 400 naming the argument."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc, where) from exc


def require_model(body: _Body) -> str:
    if body.model is None:
        raise ApiError(400, "Missing required parameter: 'model'", param="model")
    return body.model


def validation_error(exc: ValidationError, where: str = "") -> ApiError:
    """A 400 naming the first argument pydantic refused in a body."""
    first = exc.errors()[0]
    loc = [str(part) for part in first["loc"]]
    # A union reports one error per member, with the member's type (`str`, `list[str]`) in `loc`.
    parts = [p for p in loc if p not in ("str", "int", "float", "bool") and "[" not in p]
    member = len(parts) < len(loc)
    name = ".".join(parts)
    shown = f"{where}{name}"
    if first["type"] == "extra_forbidden":
        return ApiError(400, f"Unrecognized request argument supplied: {shown}", param=name)
    if first["type"] == "missing":
        return ApiError(400, f"Missing required parameter: '{shown}'", param=name)
    if member:
        return ApiError(400, f"Invalid type for '{shown}': {first['input']!r}", param=name)
    return ApiError(400, f"Invalid value for '{shown}': {first['msg']}", param=name)


@dataclass
class Sampling:
    """A body's generation settings as GenerationParams overrides, and for each overridden
    field the argument it came from, so that errors name what the client sent."""

    where: str = ""
    overrides: dict[str, Any] = field(default_factory=dict)
    source: dict[str, str] = field(default_factory=dict)
    tools: list[dict[str, Any]] | None = None  # the function tools the body offers

    def set(self, name: str, value: Any, argument: str) -> None:
        check = RANGE_CHECKS.get(f"generation.{name}")
        if check is not None and not check[0](value):
            message = f"'{self.where}{argument}': {value!r} {check[1]}"
            raise ApiError(400, message, param=argument)
        self.overrides[name] = value
        self.source[name] = argument

    def refuse(self, argument: str, why: str, code: str | None = None) -> ApiError:
        return ApiError(400, f"'{self.where}{argument}' {why}", param=argument, code=code)


def _common_sampling(body: _Body, max_tokens: int | None, where: str) -> Sampling:
    sampling = Sampling(where)
    if body.stream_options is not None and not body.stream:
        raise sampling.refuse("stream_options", "is only allowed when 'stream' is true")
    if max_tokens is not None:
        given = getattr(body, "max_completion_tokens", None) is not None
        sampling.set(
            "max_new_tokens", max_tokens, "max_completion_tokens" if given else "max_tokens"
        )
    same = ("temperature", "top_p", "n", "seed", "presence_penalty", "frequency_penalty",
            "logit_bias", "top_k", "min_p", "repetition_penalty", "min_tokens", "stop_token_ids",
            "skip_special_tokens", "ignore_eos", "bad_words")  # fmt: skip
    for name in same:
        value = getattr(body, name)
        if value is not None:
            sampling.set(name, value, name)
    if body.stop is not None:
        stops = [body.stop] if isinstance(body.stop, str) else list(body.stop)
        if any(not s for s in stops):
            raise ApiError(
                400, f"'{where}stop': an empty stop string would stop at once", param="stop"
            )
        if stops:
            sampling.set("stop_strings", stops, "stop")
    _reasoning_budget(body, sampling)
    _beam_search(body, sampling)
    return sampling


def _beam_search(body: _Body, sampling: Sampling) -> None:
    """vLLM's `use_beam_search`: `best_of` beams where a completion gives it, else `n`; the
    best `n` of them come back."""
    for name in ("length_penalty", "early_stopping"):
        value = getattr(body, name)
        if value is not None:
            sampling.set(name, value, name)
    if not body.use_beam_search:
        return
    best_of = getattr(body, "best_of", None)
    n = body.n or 1
    if best_of is not None and best_of < n:
        raise sampling.refuse("best_of", f"must be at least 'n' ({n})")
    sampling.set("num_beams", best_of or n, "best_of" if best_of else "n")


def _reasoning_budget(body: _Body, sampling: Sampling) -> None:
    """`max_reasoning_tokens`, or vLLM's `thinking_token_budget` for the same thing."""
    given = [
        (name, getattr(body, name))
        for name in ("max_reasoning_tokens", "thinking_token_budget")
        if getattr(body, name) is not None
    ]
    if len(given) == 2 and given[0][1] != given[1][1]:
        raise sampling.refuse("thinking_token_budget", "differs from 'max_reasoning_tokens'")
    if given:
        sampling.set("max_reasoning_tokens", given[0][1], given[0][0])


def chat_sampling(body: ChatCompletionBody, where: str = "") -> Sampling:
    """A chat body's generation settings, or a 400 naming the argument lmpress cannot honour."""
    for name in UNSUPPORTED_CHAT_ARGS:
        value = getattr(body, name)
        if value not in (None, [], {}, "none"):
            raise ApiError(
                400, f"{where}{name} is not supported by lmpress", param=name, code="unsupported"
            )
    if body.modalities not in (None, ["text"]):
        raise ApiError(400, "only the 'text' modality is supported", param="modalities")
    max_tokens = next(
        (v for v in (body.max_completion_tokens, body.max_tokens) if v is not None), None
    )
    sampling = _common_sampling(body, max_tokens, where)
    if body.logprobs:
        sampling.set("logprobs", True, "logprobs")
    if body.top_logprobs:
        if not body.logprobs:
            raise sampling.refuse("top_logprobs", "needs 'logprobs' set to true")
        sampling.set("top_logprobs", body.top_logprobs, "top_logprobs")
    if body.reasoning_effort is not None:
        sampling.set("reasoning_effort", body.reasoning_effort, "reasoning_effort")
    _enable_thinking(body, sampling)
    guided = guided_decoding(body.response_format, where)
    if guided is not None:
        sampling.set("guided_decoding", guided, "response_format")
    _tools(body, sampling)
    _prompt_logprobs(body, sampling)
    return sampling


def _enable_thinking(body: ChatCompletionBody, sampling: Sampling) -> None:
    """`chat_template_kwargs: {enable_thinking: false}` as reasoning_effort none; true is the
    templates' default. Other variables belong to the model, not to one request."""
    kwargs = body.chat_template_kwargs or {}
    other = sorted(set(kwargs) - {"enable_thinking"})
    if other:
        raise sampling.refuse(
            f"chat_template_kwargs.{other[0]}",
            "is not taken per request (only enable_thinking is); set it in the recipe's "
            "model.chat_template_kwargs",
        )
    enabled = kwargs.get("enable_thinking")
    if enabled is None:
        return
    if not isinstance(enabled, bool):
        raise sampling.refuse("chat_template_kwargs.enable_thinking", "must be true or false")
    if not enabled and body.reasoning_effort not in (None, "none"):
        raise sampling.refuse(
            "chat_template_kwargs.enable_thinking", "false contradicts 'reasoning_effort'"
        )
    if not enabled:
        sampling.set("reasoning_effort", "none", "chat_template_kwargs.enable_thinking")


def _tools(body: ChatCompletionBody, sampling: Sampling) -> None:
    """The body's tools, tool_choice and parallel_tool_calls, checked as OpenAI checks them."""
    where = sampling.where
    try:
        sampling.tools = check_tools(body.tools, f"{where}tools")
    except ToolError as exc:
        raise ApiError(400, str(exc), param="tools") from None
    try:
        if body.tool_choice not in (None, "none") and not sampling.tools:
            raise ToolError(f"'{where}tool_choice' is only allowed when 'tools' are specified")
        choice = check_tool_choice(body.tool_choice, sampling.tools, f"{where}tool_choice")
    except ToolError as exc:
        raise ApiError(400, str(exc), param="tool_choice") from None
    if choice is not None:
        sampling.set("tool_choice", choice, "tool_choice")
    if body.parallel_tool_calls is not None:
        sampling.set("parallel_tool_calls", body.parallel_tool_calls, "parallel_tool_calls")


def completion_sampling(body: CompletionBody, where: str = "") -> Sampling:
    """A completions body's generation settings (`logprobs` is the number of alternatives)."""
    sampling = Sampling(where)
    if body.suffix:
        raise ApiError(400, f"{where}suffix is not supported by lmpress", param="suffix")
    if body.best_of is not None and body.best_of != (body.n or 1) and not body.use_beam_search:
        raise sampling.refuse("best_of", "other than 'n' is taken with 'use_beam_search' only")
    sampling = _common_sampling(body, body.max_tokens, where)
    if body.logprobs is not None:
        if not 0 <= body.logprobs <= 5:
            raise ApiError(400, f"'{where}logprobs': must be in [0, 5]", param="logprobs")
        sampling.set("logprobs", True, "logprobs")
        if body.logprobs:
            sampling.set("top_logprobs", body.logprobs, "logprobs")
    _prompt_logprobs(body, sampling)
    if body.echo and body.logprobs is not None and body.prompt_logprobs is None:
        # The echoed prompt's tokens come with their logprobs, as vLLM and OpenAI's legacy
        # completions give them: the prompt's logprobs with the same alternatives.
        sampling.set("prompt_logprobs", body.logprobs, "echo")
    return sampling


def _prompt_logprobs(body: ChatCompletionBody | CompletionBody, sampling: Sampling) -> None:
    """vLLM's `prompt_logprobs`: not streamed (vLLM refuses it too), 0 to 20 alternatives."""
    wanted = body.prompt_logprobs
    echoed = isinstance(body, CompletionBody) and body.echo and body.logprobs is not None
    if body.stream and (wanted is not None or echoed):
        argument = "prompt_logprobs" if wanted is not None else "echo"
        raise sampling.refuse(argument, "with logprobs is not available when 'stream' is true")
    if wanted is None:
        return
    if not 0 <= wanted <= MAX_PROMPT_LOGPROBS:
        raise sampling.refuse("prompt_logprobs", f"must be in [0, {MAX_PROMPT_LOGPROBS}]")
    sampling.set("prompt_logprobs", wanted, "prompt_logprobs")


# The most alternatives a prompt token's logprobs list (OpenAI's top_logprobs cap).
MAX_PROMPT_LOGPROBS = 20

# A completions prompt: text, or token ids read as given.
Prompt = str | list[int]


def completion_prompts(body: CompletionBody, where: str = "") -> list[Prompt]:
    """The body's prompts: a text, token ids, or a list of either. An empty one is refused, as
    vLLM refuses it: a model given no token has nothing to continue from."""
    prompt = body.prompt
    shown = f"{where}prompt"
    if isinstance(prompt, str) or _token_ids(prompt):
        prompt = [prompt]
    if not isinstance(prompt, list) or not prompt:
        raise ApiError(
            400,
            f"'{shown}' must be a string, a list of token ids, or a non-empty list of either",
            param="prompt",
        )
    for i, item in enumerate(prompt):
        if not isinstance(item, str) and not _token_ids(item):
            raise ApiError(
                400,
                f"'{shown}' item {i}: neither a text nor a list of token ids (integers, 0 or more)",
                param="prompt",
            )
        if not item:
            raise ApiError(400, f"'{shown}' is empty: send some text to continue", param="prompt")
    return list(prompt)


def _token_ids(value: Any) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value)
    )


def guided_decoding(response_format: dict[str, Any] | None, where: str = "") -> Any:
    """OpenAI's response_format as the one guided-decoding type, GuidedDecoding (or None)."""
    if response_format is None:
        return None
    kind = response_format.get("type")
    shown = f"{where}response_format"
    if kind == "text":
        return None
    if kind == "json_object":
        return GuidedDecoding(json_object=True)
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise ApiError(
                400, f"'{shown}.json_schema.schema' must be an object", param="response_format"
            )
        try:
            return GuidedDecoding(json=schema, strict=bool(spec.get("strict")))
        except ConfigError as exc:
            raise ApiError(400, f"'{shown}': {exc}", param="response_format") from exc
    raise ApiError(
        400,
        f"'{shown}': unknown type {json.dumps(kind)} (text, json_object or json_schema)",
        param="response_format",
    )
