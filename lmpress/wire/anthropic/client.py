"""Anthropic's Messages API the way out: a Request as the body of `messages.create` (live or
as a Message Batches line) and a reply, JSON or streamed, as a Reply. `lmpress serve`'s side,
requests in, is `server`.

The Messages API differs from chat completions in ways `request_body` handles: the system prompt
is a top-level `system` field, not a message; roles must alternate, so consecutive messages of
one role are merged; `max_tokens` is required; stop strings are `stop_sequences`; images are
content blocks with a base64 or URL source. Tools are tool definitions with an `input_schema`;
an assistant turn's tool calls are `tool_use` blocks and a tool turn's reply a `tool_result`
block in a user turn. `parse_message` maps the reply back: text blocks joined, `tool_use`
blocks as tool calls, `stop_reason` to lmpress's finish reasons, usage (cached input counted as
input, and also apart as `cached_tokens` and `cache_creation_tokens`).

Thinking (`thinking_config`): `max_reasoning_tokens` N is extended thinking with
`budget_tokens` N, which the API takes from 1024 up to below `max_tokens` (a row outside that
is refused, naming the rule); 0 turns thinking off. `reasoning_effort` low, medium or high is
adaptive thinking (`thinking: {type: adaptive}`) at that `output_config.effort`, the API's own
levels under the same names; `none` turns thinking off; `minimal` has no Anthropic level and is
refused. With thinking on the API takes no forced tool_choice (`any` or a named tool), which is
refused. The reply's `thinking` blocks are the sample's reasoning; they and any
`redacted_thinking` blocks are kept whole, signature and all, in `reasoning_details`, and an
assistant turn that carries them in a later request sends them back first in its content, as the
API requires with tool use. Thinking from elsewhere (a DeepSeek turn's `reasoning_content`) has no
signature and is dropped.

Nothing here imports the `anthropic` package: a stream's events are read by their attributes.
"""

from __future__ import annotations

import json
from typing import Any

from lmpress.vocabulary.errors import ErrorKind, RequestError
from lmpress.vocabulary.guided import GuidedDecoding, GuidedForm
from lmpress.vocabulary.tools import TOOL_CHOICES, chosen_name
from lmpress.vocabulary.types import (
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


class StreamedMessage:
    """A Messages stream's events as they arrive: text deltas the answer, `tool_use` blocks
    tool calls assembled from their JSON pieces, thinking blocks kept whole (signature too),
    the stop reason and usage from `message_start` and `message_delta`. Takes the SDK's event
    objects."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.calls: dict[int, list[str]] = {}  # block index -> [id, name, JSON input pieces...]
        self.thinking: dict[int, dict[str, Any]] = {}  # block index -> the thinking block so far
        self.stop_reason: str | None = None
        self.stop_sequence: str | None = None
        self.usage = Usage()
        self.model = ""

    def add(self, event: Any) -> tuple[str, str]:
        """The (thinking, answer) text one event brings."""
        text, thought = "", ""
        try:
            kind = event.type
            delta = getattr(event, "delta", None)
            if kind == "message_start":
                self.model = event.message.model or ""
                self.usage = _usage(event.message.usage.model_dump(), self.usage)
            elif kind == "content_block_start":
                block = event.content_block
                if block.type == "tool_use":
                    self.calls[event.index] = [block.id, block.name]
                elif block.type in _THINKING_FIELDS:
                    self.thinking[event.index] = block.model_dump()
            elif kind == "content_block_delta" and delta.type == "text_delta":
                text = delta.text
            elif kind == "content_block_delta" and delta.type == "input_json_delta":
                self.calls[event.index].append(delta.partial_json)
            elif kind == "content_block_delta" and delta.type == "thinking_delta":
                thought = delta.thinking
                self.thinking[event.index]["thinking"] += thought
            elif kind == "content_block_delta" and delta.type == "signature_delta":
                self.thinking[event.index]["signature"] = delta.signature
            elif kind == "message_delta":
                self.stop_reason = delta.stop_reason or self.stop_reason
                self.stop_sequence = getattr(delta, "stop_sequence", None) or self.stop_sequence
                if event.usage is not None:
                    self.usage = _usage(event.usage.model_dump(), self.usage)
        except (AttributeError, TypeError, KeyError, ValueError) as exc:
            raise MalformedResponse(f"a stream event is not a Messages event ({exc})") from exc
        if text:
            self.parts.append(text)
        return thought, text

    def reply(self) -> Reply:
        """The Reply the whole stream made, once it has ended."""
        usage = self.usage
        finish = FINISH_REASONS.get(self.stop_reason or "end_turn", "stop")
        sample = Sample("".join(self.parts), finish, None, usage.completion_tokens)
        sample.stop_sequence = _stop_sequence(self.stop_reason, self.stop_sequence)
        sample.tool_calls = [
            ToolCall(id, name, "".join(pieces) or "{}")
            for id, name, *pieces in (self.calls[i] for i in sorted(self.calls))
        ] or None
        sample = with_thinking(sample, [self.thinking[i] for i in sorted(self.thinking)], usage)
        return Reply([sample], usage, self.model)


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
