"""ANTHROPIC: the Messages API through the `anthropic` SDK.

The Messages API differs from chat completions in ways `request_body` handles: the system prompt
is a top-level `system` field, not a message; roles must alternate, so consecutive messages of
one role are merged; `max_tokens` is required; stop strings are `stop_sequences`; images are
content blocks with a base64 or URL source. Tools are tool definitions with an `input_schema`;
an assistant turn's tool calls are `tool_use` blocks and a tool turn's reply a `tool_result`
block in a user turn. `parse_message` maps the reply back: text blocks joined, `tool_use`
blocks as tool calls, `stop_reason` to lmpress's finish reasons, usage (cached input counted as
input, and also apart as `cached_tokens` and `cache_creation_tokens`).

Prompt caching (`remote_params.prompt_cache`, prompt_cache.py): with `auto`, a prefix that
repeats and is long enough to cache gets `cache_control` on its last block (`mark_prefix`): the
last tool, the last system block; the request that writes it goes first, and the others
carrying it wait for it. Message Batches lines are built by `_body` too, so they carry the
same marks.

Thinking (`thinking_config`): `max_reasoning_tokens` N is extended thinking with
`budget_tokens` N, which the API takes from 1024 up to below `max_tokens` (a row outside that
is refused, naming the rule); 0 turns thinking off. `reasoning_effort` low, medium or high is
adaptive thinking (`thinking: {type: adaptive}`) at that `output_config.effort`, the API's own
levels under the same names; `none` turns thinking off; `minimal` has no Anthropic level and is
refused. With thinking on the API takes no temperature or top_k (lmpress sends neither: the
Messages API samples at temperature 1, `inherent_params`) and no forced tool_choice (`any` or a
named tool), which is refused. The reply's `thinking` blocks are the sample's reasoning; they and
any `redacted_thinking` blocks are kept whole, signature and all, in `reasoning_details`, and an
assistant turn that carries them in a later request sends them back first in its content, as the
API requires with tool use. Thinking from elsewhere (a DeepSeek turn's `reasoning_content`) has no
signature and is dropped.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

from lmpress.configs.schema import RunConfig
from lmpress.engines.remote.base import RemoteEngine, client_options
from lmpress.engines.remote.prompt_cache import Marks, PrefixMarks, anthropic_min_tokens
from lmpress.vocabulary.errors import ErrorKind, RequestError
from lmpress.vocabulary.guided import GuidedDecoding, GuidedForm
from lmpress.vocabulary.tools import TOOL_CHOICES, chosen_name
from lmpress.vocabulary.types import (
    Delta,
    FinishReason,
    GenerationParams,
    Message,
    Request,
    Sample,
    ToolCall,
    Usage,
)
from lmpress.wire.images import base64_image
from lmpress.wire.replies import MalformedResponse, Reply

# The Messages API's structured output takes a JSON schema; any JSON object is the schema
# {"type": "object"}.
GUIDED_FORMS: frozenset[GuidedForm] = frozenset({"json", "json_object"})

FINISH_REASONS: dict[str, FinishReason] = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "tool_use": "tool_calls",
    "pause_turn": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "refusal": "content_filter",
}


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

    def _body(self, request: Request) -> dict[str, Any]:
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
        parts: list[str] = []
        calls: dict[int, list[str]] = {}  # block index -> [id, name, JSON input pieces...]
        thinking: dict[int, dict[str, Any]] = {}  # block index -> the thinking block so far
        stop_reason = stop_sequence = None
        usage = Usage()
        model = ""
        async with stream:
            async for event in stream:
                text, thought = "", ""
                try:
                    kind = event.type
                    delta = getattr(event, "delta", None)
                    if kind == "message_start":
                        model = event.message.model or ""
                        usage = _usage(event.message.usage.model_dump(), usage)
                    elif kind == "content_block_start":
                        block = event.content_block
                        if block.type == "tool_use":
                            calls[event.index] = [block.id, block.name]
                        elif block.type in _THINKING_FIELDS:
                            thinking[event.index] = block.model_dump()
                    elif kind == "content_block_delta" and delta.type == "text_delta":
                        text = delta.text
                    elif kind == "content_block_delta" and delta.type == "input_json_delta":
                        calls[event.index].append(delta.partial_json)
                    elif kind == "content_block_delta" and delta.type == "thinking_delta":
                        thought = delta.thinking
                        thinking[event.index]["thinking"] += thought
                    elif kind == "content_block_delta" and delta.type == "signature_delta":
                        thinking[event.index]["signature"] = delta.signature
                    elif kind == "message_delta":
                        stop_reason = delta.stop_reason or stop_reason
                        stop_sequence = getattr(delta, "stop_sequence", None) or stop_sequence
                        if event.usage is not None:
                            usage = _usage(event.usage.model_dump(), usage)
                except (AttributeError, TypeError, KeyError, ValueError) as exc:
                    raise MalformedResponse(
                        f"a stream event is not a Messages event ({exc})"
                    ) from exc
                if thought:
                    yield Delta(request.id, thought, reasoning=True)
                if text:
                    parts.append(text)
                    yield Delta(request.id, text)
        finish = FINISH_REASONS.get(stop_reason or "end_turn", "stop")
        sample = Sample("".join(parts), finish, None, usage.completion_tokens)
        sample.stop_sequence = _stop_sequence(stop_reason, stop_sequence)
        sample.tool_calls = [
            ToolCall(id, name, "".join(pieces) or "{}")
            for id, name, *pieces in (calls[i] for i in sorted(calls))
        ] or None
        sample = with_thinking(sample, [thinking[i] for i in sorted(thinking)], usage)
        yield Reply([sample], usage, model)


# --- the translation ---------------------------------------------------------------------


def request_body(request: Request, model: str) -> dict[str, Any]:
    """The keyword arguments of `messages.create` for a Request."""
    if request.prompt is not None:
        raise RequestError(
            "engine ANTHROPIC takes chat messages only, not a raw text prompt",
            ErrorKind.INVALID_REQUEST,
        )
    p = request.params
    system, messages = convert_messages(request.messages)
    body: dict[str, Any] = {"model": model, "max_tokens": p.max_new_tokens, "messages": messages}
    if system:
        body["system"] = system
    if p.stop_strings:
        body["stop_sequences"] = list(p.stop_strings)
    if p.guided_decoding is not None:
        body["output_config"] = {"format": output_format(p.guided_decoding)}
    thinking = thinking_config(p)
    if thinking is not None:
        body["thinking"] = thinking
        if p.reasoning_effort not in (None, "none"):
            body.setdefault("output_config", {})["effort"] = p.reasoning_effort
    if request.tools:
        body["tools"] = [tool_definition(tool["function"]) for tool in request.tools]
        choice = tool_choice(p.tool_choice, p.parallel_tool_calls)
        if choice is not None:
            body["tool_choice"] = choice
    return body


# Extended thinking's smallest budget_tokens, which the API refuses below.
MIN_THINKING_BUDGET = 1024
EFFORTS = ("low", "medium", "high")  # output_config.effort levels named as lmpress names them


def thinking_config(p: GenerationParams) -> dict[str, Any] | None:
    """The Messages API's `thinking` for the row's reasoning bounds, or None to leave the
    model's default; a bound the API would refuse is refused here, in one line."""
    effort, budget = p.reasoning_effort, p.max_reasoning_tokens
    if effort is None and budget is None:
        return None

    def refuse(message: str) -> RequestError:
        return RequestError(f"engine ANTHROPIC {message}", ErrorKind.INVALID_REQUEST)

    if effort not in (None, "none", *EFFORTS):
        raise refuse(
            f"has no effort level '{effort}' (generation.reasoning_effort); use none, "
            f"{', '.join(EFFORTS)}"
        )
    if budget == 0 or effort == "none":
        if budget and effort == "none":
            raise refuse("thinks not at all with generation.reasoning_effort none, which leaves "
                         "generation.max_reasoning_tokens nothing to bound; keep one")  # fmt: skip
        return {"type": "disabled"}
    if budget is not None and not MIN_THINKING_BUDGET <= budget < p.max_new_tokens:
        raise refuse(
            f"takes a thinking budget (generation.max_reasoning_tokens, here {budget}) of at "
            f"least {MIN_THINKING_BUDGET} and less than max_new_tokens ({p.max_new_tokens})"
        )
    if chosen_name(p.tool_choice) is not None or p.tool_choice == "required":
        raise refuse(
            "takes tool_choice auto or none with thinking on, not a forced tool (required or "
            "a named function)"
        )
    if budget is not None:
        return {"type": "enabled", "budget_tokens": budget}
    return {"type": "adaptive"}


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


def tool_definition(function: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI function as a Messages API tool: its parameters are the `input_schema`."""
    tool = {
        "name": function["name"],
        "input_schema": function.get("parameters") or {"type": "object", "properties": {}},
    }
    if function.get("description"):
        tool["description"] = function["description"]
    return tool


def tool_choice(choice: Any, parallel: bool) -> dict[str, Any] | None:
    """OpenAI's tool_choice as the Messages API's: auto, any (OpenAI's required), a named tool,
    or none; parallel_tool_calls false is its disable_parallel_tool_use."""
    name = chosen_name(choice)
    if name is not None:
        out: dict[str, Any] = {"type": "tool", "name": name}
    elif choice in TOOL_CHOICES:
        out = {"type": "any" if choice == "required" else choice}
    elif parallel:
        return None  # the API's default: auto, calls in parallel allowed
    else:
        out = {"type": "auto"}
    if not parallel and out["type"] != "none":
        out["disable_parallel_tool_use"] = True
    return out


def convert_messages(messages: list[Message]) -> tuple[str, list[dict[str, Any]]]:
    """The system text, and the conversation with roles alternating as the API requires:
    system and developer messages go to `system`, tool results become user turns, and
    consecutive messages of one role are merged into one."""
    system: list[str] = []
    turns: list[dict[str, Any]] = []
    for message in messages:
        if message.role in ("system", "developer"):
            system.append(message.text())
            continue
        role = "assistant" if message.role == "assistant" else "user"
        content = _content(message)
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"] = _merge(turns[-1]["content"], content)
        else:
            turns.append({"role": role, "content": content})
    return "\n\n".join(s for s in system if s), turns


def _content(message: Message) -> str | list[dict[str, Any]]:
    thinking = thinking_blocks(message.reasoning_details) if message.role == "assistant" else []
    if thinking:
        content = _content(Message("assistant", message.content, message.tool_calls))
        text = [{"type": "text", "text": content}] if isinstance(content, str) else content
        return thinking + [block for block in text if block.get("text") != ""]
    if message.role == "tool" and message.tool_call_id is not None:
        result = _content(Message("user", message.content))
        return [{"type": "tool_result", "tool_use_id": message.tool_call_id, "content": result}]
    if message.tool_calls:
        text = message.text()
        blocks = [{"type": "text", "text": text}] if text else []
        return blocks + [_tool_use(call) for call in message.tool_calls]
    if isinstance(message.content, str):
        return message.content
    blocks = []
    for part in message.content:
        if part.type == "text":
            blocks.append({"type": "text", "text": part.text or ""})
        else:
            blocks.append(image_block(part.image_url or ""))
    return blocks


# The fields of each thinking block the API takes back (ThinkingBlockParam,
# RedactedThinkingBlockParam): a reply's block may carry more, which a request may not.
_THINKING_FIELDS = {"thinking": ("type", "thinking", "signature"),
                    "redacted_thinking": ("type", "data")}  # fmt: skip


def thinking_blocks(details: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """An earlier turn's thinking blocks as the API takes them back: whole and in order."""
    out = []
    for block in details or ():
        fields = _THINKING_FIELDS.get(block.get("type")) if isinstance(block, dict) else None
        if fields is not None:
            out.append({key: block[key] for key in fields if key in block})
    return out


def _tool_use(call: ToolCall) -> dict[str, Any]:
    try:
        arguments = json.loads(call.arguments or "{}")
    except ValueError:
        arguments = None
    if not isinstance(arguments, dict):
        raise RequestError(
            f"tool call {call.id}: its arguments are not a JSON object, which the Messages API "
            f"needs as the tool_use input",
            ErrorKind.INVALID_REQUEST,
        )
    return {"type": "tool_use", "id": call.id, "name": call.name, "input": arguments}


def _merge(
    first: str | list[dict[str, Any]], second: str | list[dict[str, Any]]
) -> str | list[dict[str, Any]]:
    if isinstance(first, str) and isinstance(second, str):
        return f"{first}\n\n{second}"

    def blocks(content: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{"type": "text", "text": content}] if isinstance(content, str) else content

    return blocks(first) + blocks(second)


def image_block(url: str) -> dict[str, Any]:
    """An image content block: a URL source for http(s), base64 for data: URLs and files."""
    if url.startswith(("http://", "https://")):
        return {"type": "image", "source": {"type": "url", "url": url}}
    media_type, data = base64_image(url)
    return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}


def output_format(guided: GuidedDecoding) -> dict[str, Any]:
    """A json (or json_object) constraint as the Messages API's structured output format."""
    guided.refuse_unless("ANTHROPIC", GUIDED_FORMS)
    schema = {"type": "object"} if guided.form == "json_object" else dict(guided.json)
    return {"type": "json_schema", "schema": schema}


def parse_message(data: Any, model: str = "") -> Reply:
    """A Messages API JSON reply as one sample, usage and the model name: text blocks are the
    answer, thinking blocks the reasoning (kept whole in `reasoning_details`)."""
    if not isinstance(data, dict) or not isinstance(data.get("content"), list):
        raise MalformedResponse("the reply is not a Messages API message (no content list)")
    texts, calls, thinking = [], [], []
    for block in data["content"]:
        if not isinstance(block, dict):
            raise MalformedResponse("a content block is not an object")
        if block.get("type") == "text":
            if not isinstance(block.get("text"), str):
                raise MalformedResponse("a text block has no text")
            texts.append(block["text"])
        elif block.get("type") == "tool_use":
            if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
                raise MalformedResponse("a tool_use block has no id or name")
            arguments = json.dumps(block.get("input") or {}, ensure_ascii=False)
            calls.append(ToolCall(block["id"], block["name"], arguments))
        elif block.get("type") in _THINKING_FIELDS:
            thinking.append(block)
    stop_reason = data.get("stop_reason") or "end_turn"
    usage = _usage(data.get("usage") if isinstance(data.get("usage"), dict) else {}, Usage())
    sample = Sample("".join(texts), FINISH_REASONS.get(stop_reason, "stop"))
    sample.completion_tokens = usage.completion_tokens
    sample.tool_calls = calls or None
    sample.stop_sequence = _stop_sequence(stop_reason, data.get("stop_sequence"))
    return Reply([with_thinking(sample, thinking, usage)], usage, data.get("model") or model)


def _stop_sequence(stop_reason: str | None, stop_sequence: Any) -> str | None:
    """The stop string the reply says ended it, kept only where it did end it."""
    if stop_reason == "stop_sequence" and isinstance(stop_sequence, str):
        return stop_sequence
    return None


def with_thinking(sample: Sample, blocks: list[dict[str, Any]], usage: Usage) -> Sample:
    """The sample with its thinking blocks: their text as its reasoning ("" when all were
    redacted), the blocks themselves as its reasoning_details."""
    details = thinking_blocks(blocks)
    if details:
        sample.reasoning = "\n\n".join(b["thinking"] for b in details if "thinking" in b)
        sample.reasoning_details = details
    sample.reasoning_tokens = usage.reasoning_tokens
    return sample


def _usage(data: dict[str, Any], previous: Usage) -> Usage:
    """Input counts cached reads and writes too (and each apart); later stream events update
    what they carry."""
    keys = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
    given = [data.get(k) for k in keys]
    if any(v is not None for v in given):
        prompt = sum(int(v) for v in given if v)
        written, read = (int(v or 0) for v in given[1:])
    else:
        prompt = previous.prompt_tokens
        written, read = previous.cache_creation_tokens, previous.cached_tokens
    output = data.get("output_tokens")
    details = data.get("output_tokens_details")
    thinking = details.get("thinking_tokens") if isinstance(details, dict) else None
    return Usage(
        prompt,
        int(output) if output is not None else previous.completion_tokens,
        int(thinking) if thinking is not None else previous.reasoning_tokens,
        cached_tokens=read,
        cache_creation_tokens=written,
    )
