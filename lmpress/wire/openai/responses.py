"""OpenAI response bodies, the way out: chat.completion and text_completion bodies and their
stream chunks, built from the `openai` package's own types so that what serve answers and what
batch writes in an OpenAI Batch output line is what the official client parses.

A reasoning model's thinking goes beside the answer, as vLLM writes it: the message's (and a
stream delta's) `reasoning_content`, DeepSeek's name, and `reasoning`, vLLM's current one; the
openai types keep such fields as extras, so a client reads `message.reasoning_content`. The
usage counts the thinking in `completion_tokens_details.reasoning_tokens`. A model that does not
reason gets neither, so its bodies are what they were.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from openai.types import Completion, CompletionChoice, CompletionUsage, Model
from openai.types.chat import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionMessage,
    ChatCompletionMessageFunctionToolCall,
)
from openai.types.chat.chat_completion import Choice as ChatChoice
from openai.types.chat.chat_completion import ChoiceLogprobs
from openai.types.chat.chat_completion_chunk import Choice as ChunkChoice
from openai.types.chat.chat_completion_chunk import (
    ChoiceDelta,
    ChoiceDeltaToolCall,
    ChoiceDeltaToolCallFunction,
)
from openai.types.chat.chat_completion_chunk import ChoiceLogprobs as ChunkLogprobs
from openai.types.chat.chat_completion_token_logprob import (
    ChatCompletionTokenLogprob,
    TopLogprob,
)
from openai.types.completion_usage import CompletionTokensDetails, PromptTokensDetails
from pydantic import BaseModel

from lmpress.vocabulary.types import FinishReason, Result, Sample, TokenLogprob, Usage
from lmpress.wire.openai.prompt_logprobs import Echo, completion_logprobs, vllm_prompt_logprobs

# --- response bodies -------------------------------------------------------------------------

ChatFinish = Literal["stop", "length", "content_filter", "tool_calls"]
TextFinish = Literal["stop", "length", "content_filter"]

# lmpress's finish reasons as a chat completion's. A request cancelled or failed midway is never
# answered with a body, so those two only need a valid value.
OPENAI_FINISH: dict[FinishReason, ChatFinish] = {
    "stop": "stop",
    "length": "length",
    "content_filter": "content_filter",
    "tool_calls": "tool_calls",
    "cancelled": "stop",
    "error": "stop",
}
# A text completion has no tool calls to carry: a reply that made some stopped to make them.
COMPLETION_FINISH: dict[FinishReason, TextFinish] = {
    reason: "stop" if value == "tool_calls" else value for reason, value in OPENAI_FINISH.items()
}


def _finish(sample: Sample) -> ChatFinish:
    return OPENAI_FINISH.get(sample.finish_reason, "stop")  # a plugin's own reason: "stop"


def _text_finish(sample: Sample) -> TextFinish:
    return COMPLETION_FINISH.get(sample.finish_reason, "stop")


def _tool_calls(sample: Sample) -> list[ChatCompletionMessageFunctionToolCall] | None:
    if not sample.tool_calls:
        return None
    return [
        ChatCompletionMessageFunctionToolCall.model_validate(call.to_openai())
        for call in sample.tool_calls
    ]


def usage_model(usage: Usage, reasoning: bool = False) -> CompletionUsage:
    """The usage; with `reasoning` (or reasoning tokens counted), the thinking's share; where
    the provider read some of the prompt from its cache, how much, as OpenAI reports it."""
    details: dict[str, Any] = {}
    if reasoning or usage.reasoning_tokens:
        details["completion_tokens_details"] = CompletionTokensDetails(
            reasoning_tokens=usage.reasoning_tokens
        )
    if usage.cached_tokens:
        details["prompt_tokens_details"] = PromptTokensDetails(cached_tokens=usage.cached_tokens)
    return CompletionUsage(
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        total_tokens=usage.total_tokens,
        **details,
    )


def reasoning_fields(text: str | None) -> dict[str, str]:
    """A message's or delta's thinking, under both names clients read (none without it)."""
    return {} if text is None else {"reasoning_content": text, "reasoning": text}


def _stop_reason(sample: Sample) -> dict[str, str]:
    """vLLM's `stop_reason` extension of a choice, where a stop string ended it."""
    return {"stop_reason": sample.stop_sequence} if sample.stop_sequence is not None else {}


def _dump(model: BaseModel) -> dict[str, Any]:
    return model.model_dump(mode="json", exclude_unset=True, warnings=False)


def _token_logprobs(items: list[TokenLogprob]) -> list[ChatCompletionTokenLogprob]:
    def utf8(text: str) -> list[int]:
        return list(text.encode("utf-8", errors="replace"))

    return [
        ChatCompletionTokenLogprob(
            token=t.token,
            bytes=utf8(t.token),
            logprob=t.logprob,
            top_logprobs=[TopLogprob(token=tok, bytes=utf8(tok), logprob=lp) for tok, lp in t.top],
        )
        for t in items
    ]


def chat_completion(id: str, created: int, model: str, result: Result) -> dict[str, Any]:
    choices = [
        ChatChoice(
            index=i,
            message=ChatCompletionMessage(
                role="assistant",
                content=sample.text if sample.text or not sample.tool_calls else None,
                refusal=None,
                **({"tool_calls": _tool_calls(sample)} if sample.tool_calls else {}),
                **reasoning_fields(sample.reasoning),
            ),
            finish_reason=_finish(sample),
            **_stop_reason(sample),
            logprobs=None
            if sample.logprobs is None
            else ChoiceLogprobs(content=_token_logprobs(sample.logprobs), refusal=None),
        )
        for i, sample in enumerate(result.samples)
    ]
    scored = vllm_prompt_logprobs(result)
    completion = ChatCompletion(
        id=id,
        object="chat.completion",
        created=created,
        model=model,
        choices=choices,
        usage=usage_model(result.usage, result.reasoned),
        system_fingerprint=None,
        **({} if scored is None else {"prompt_logprobs": scored}),  # vLLM's, beside the choices
    )
    return _dump(completion)


def text_completion(
    id: str, created: int, model: str, results: list[Result], echoes: list[Echo]
) -> dict[str, Any]:
    """One Completion for every prompt's Result; choice i*n+j is prompt i's sample j. An echo
    writes its prompt before each reply, and with logprobs its tokens before the reply's; a
    Result with prompt logprobs gives every choice vLLM's `prompt_logprobs` too."""
    choices = []
    for result, echo in zip(results, echoes, strict=True):
        scored = vllm_prompt_logprobs(result)
        extra = {} if scored is None else {"prompt_logprobs": scored}
        for sample in result.samples:
            logprobs = completion_logprobs(sample.logprobs, echo, result)
            choices.append(
                CompletionChoice(
                    index=len(choices),
                    text=echo.text + sample.text,
                    finish_reason=_text_finish(sample),
                    logprobs=logprobs,
                    **extra,
                )
            )
    total = Usage.summed(r.usage for r in results)
    completion = Completion(
        id=id,
        object="text_completion",
        created=created,
        model=model,
        choices=choices,
        usage=usage_model(total),
        system_fingerprint=None,
    )
    return _dump(completion)


def model_list(names: list[str], created: int, owner: str) -> dict[str, Any]:
    return {"object": "list", "data": [model_card(name, created, owner) for name in names]}


def model_card(
    name: str, created: int, owner: str, root: str | None = None, parent: str | None = None
) -> dict[str, Any]:
    """A model's card; with vLLM's `root` (its files) and `parent` (a LoRA adapter's base)
    where given, as vLLM lists LoRA modules."""
    extra = {key: value for key, value in (("root", root), ("parent", parent)) if value}
    return _dump(Model(id=name, object="model", created=created, owned_by=owner, **extra))


# --- stream chunks ---------------------------------------------------------------------------

DONE = b"data: [DONE]\n\n"
_MARK = "@@lmpress-text@@"


def sse(data: dict[str, Any]) -> bytes:
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return b"data: " + text.encode() + b"\n\n"


class _TextTemplate:
    """The JSON of a chunk with its text field (or fields: a reasoning delta's two names) left
    open: dumped once from the openai type, then filled per delta, since a stream sends one
    chunk per delta."""

    def __init__(self, chunk: BaseModel):
        text = chunk.model_dump_json(exclude_unset=True, warnings=False)
        self.parts = [part.encode() for part in text.split(json.dumps(_MARK))]
        self.parts[0] = b"data: " + self.parts[0]
        self.parts[-1] += b"\n\n"

    def fill(self, text: str) -> bytes:
        return json.dumps(text, ensure_ascii=False).encode().join(self.parts)


class ChatChunks:
    """The stream of one chat completion, as SSE `data:` lines."""

    def __init__(self, id: str, created: int, model: str, include_usage: bool):
        self.head: dict[str, Any] = dict(
            id=id, object="chat.completion.chunk", created=created, model=model,
            system_fingerprint=None,
        )  # fmt: skip
        self.include_usage = include_usage
        if include_usage:  # then every chunk carries "usage": null, and the last one the usage
            self.head["usage"] = None
        self._templates: dict[int, _TextTemplate] = {}
        self._reasoning: dict[int, _TextTemplate] = {}

    def _chunk(self, choices: list[ChunkChoice], **extra: Any) -> ChatCompletionChunk:
        return ChatCompletionChunk(**{**self.head, **extra}, choices=choices)

    def start(self, index: int) -> bytes:
        delta = ChoiceDelta(role="assistant", content="")
        choice = ChunkChoice(index=index, delta=delta, logprobs=None, finish_reason=None)
        return sse(_dump(self._chunk([choice])))

    def text(self, index: int, text: str) -> bytes:
        template = self._templates.get(index)
        if template is None:
            choice = ChunkChoice(
                index=index, delta=ChoiceDelta(content=_MARK), logprobs=None, finish_reason=None
            )
            template = self._templates[index] = _TextTemplate(self._chunk([choice]))
        return template.fill(text)

    def reasoning(self, index: int, text: str) -> bytes:
        """A piece of the thinking, as vLLM streams it: before the answer's content."""
        template = self._reasoning.get(index)
        if template is None:
            delta = ChoiceDelta(**reasoning_fields(_MARK))  # type: ignore[arg-type]
            choice = ChunkChoice(index=index, delta=delta, logprobs=None, finish_reason=None)
            template = self._reasoning[index] = _TextTemplate(self._chunk([choice]))
        return template.fill(text)

    def tool_calls(self, index: int, sample: Sample) -> list[bytes]:
        """A sample's tool calls as the deltas OpenAI streams and its client assembles: per
        call, a chunk that opens it (its index, id, type and name), then its arguments."""
        out = []
        for i, call in enumerate(sample.tool_calls or ()):
            opening = ChoiceDeltaToolCall(
                index=i, id=call.id, type="function",
                function=ChoiceDeltaToolCallFunction(name=call.name, arguments=""),
            )  # fmt: skip
            arguments = ChoiceDeltaToolCall(
                index=i, function=ChoiceDeltaToolCallFunction(arguments=call.arguments)
            )
            for delta in (opening, arguments):
                choice = ChunkChoice(
                    index=index, delta=ChoiceDelta(tool_calls=[delta]), logprobs=None,
                    finish_reason=None,
                )  # fmt: skip
                out.append(sse(_dump(self._chunk([choice]))))
        return out

    def finish(self, index: int, sample: Sample) -> bytes:
        logprobs = None
        if sample.logprobs is not None:
            logprobs = ChunkLogprobs(content=_token_logprobs(sample.logprobs), refusal=None)
        choice = ChunkChoice(
            index=index, delta=ChoiceDelta(), logprobs=logprobs, finish_reason=_finish(sample),
            **_stop_reason(sample),
        )  # fmt: skip
        return sse(_dump(self._chunk([choice])))

    def usage(self, usage: Usage, reasoning: bool = False) -> bytes:
        return sse(_dump(self._chunk([], usage=usage_model(usage, reasoning))))


class CompletionChunks:
    """The stream of one text completion, as SSE `data:` lines."""

    def __init__(self, id: str, created: int, model: str, include_usage: bool):
        self.head: dict[str, Any] = dict(
            id=id, object="text_completion", created=created, model=model, system_fingerprint=None
        )
        self.include_usage = include_usage
        if include_usage:
            self.head["usage"] = None
        self._templates: dict[int, _TextTemplate] = {}

    def _chunk(self, choices: list[CompletionChoice], **extra: Any) -> Completion:
        return Completion.model_construct(**{**self.head, **extra}, choices=choices)

    def text(self, index: int, text: str) -> bytes:
        template = self._templates.get(index)
        if template is None:
            choice = CompletionChoice.model_construct(
                index=index, text=_MARK, logprobs=None, finish_reason=None
            )
            template = self._templates[index] = _TextTemplate(self._chunk([choice]))
        return template.fill(text)

    def finish(self, index: int, sample: Sample) -> bytes:
        choice = CompletionChoice(
            index=index,
            text="",
            finish_reason=_text_finish(sample),
            logprobs=completion_logprobs(sample.logprobs),
        )
        return sse(_dump(self._chunk([choice])))

    def usage(self, usage: Usage, reasoning: bool = False) -> bytes:
        return sse(_dump(self._chunk([], usage=usage_model(usage, reasoning))))
