"""OpenAI replies, the way in: what an OpenAI-compatible server answers to the bodies `client`
builds, read into lmpress's Reply, EmbedReply and ScoreReply (wire/replies.py), live or from a
provider batch's output file, so that a row through a batch API comes out as the live engine
writes it.

`parse_chat_completion` reads a chat-completions (or completions) JSON reply into samples and
usage, each sample's thinking apart from its answer; streamed, `StreamedChoice` does the same
for each choice as it arrives, from the `openai` SDK's chunk objects. The thinking comes back
three ways: `reasoning_content` on the message and on each streamed delta (vLLM, SGLang,
DeepSeek; `reasoning` is the name newer vLLM and OpenRouter write, `message_reasoning`);
Gemini's thought summaries at the head of the content inside `<thought>…</thought>`
(`split_thoughts`, with `thought_tags`); or only its count,
`usage.completion_tokens_details.reasoning_tokens` (`reasoning_tokens`), as OpenAI's o-series
and GPT-5 write it. `parse_embeddings` and `parse_scores` read /embeddings and vLLM's /score.
"""

from __future__ import annotations

from typing import Any

import lmpress.vocabulary.tools as tools
from lmpress.vocabulary.embeddings import Embedding
from lmpress.vocabulary.reasoning import ReasoningFormat, StreamSplitter, split
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
from lmpress.wire.openai import pooling
from lmpress.wire.replies import EmbedReply, MalformedResponse, Reply, ScoreReply

# Gemini writes its thought summaries ahead of the answer in these tags; `split` reads them
# as it reads a <think> block.
GEMINI_THOUGHTS = ReasoningFormat("gemini", "<thought>", "</thought>", "</thought>")


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

    def __init__(self, thought_tags: bool = False):
        self.texts: list[str] = []
        self.thoughts: list[str] | None = None  # None until the choice thinks
        self.calls: ToolCallDeltas | None = None
        self.logprobs: list[TokenLogprob] = []
        self.finish: FinishReason = "stop"
        self.stop_reason: Any = None  # vLLM's and SGLang's: the stop string or token matched
        # Gemini's thought summaries come inside the content, in tags, split as they arrive.
        self.splitter = StreamSplitter(GEMINI_THOUGHTS) if thought_tags else None

    def add(self, choice: Any, request: Request, index: int) -> list[Delta]:
        """The deltas one chunk's choice brings: thinking first, then answer."""
        thought = ""
        if request.prompt is None and request.prompt_ids is None:  # a chat
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


def streamed_reply(
    choices: dict[int, StreamedChoice], params: GenerationParams, usage: Usage, model: str
) -> Reply:
    """The Reply a whole stream made, once it has ended: a sample for each choice asked for
    (one that sent nothing is an empty stop), and the usage on the sample where there is one."""
    n = max([params.n, *(i + 1 for i in choices)])
    samples = [
        choices[i].sample(params.logprobs) if i in choices else Sample("", "stop") for i in range(n)
    ]
    if len(samples) == 1:
        samples[0].completion_tokens = usage.completion_tokens
        samples[0].reasoning_tokens = usage.reasoning_tokens
    return Reply(samples, usage, model)


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
    result = chat_usage(usage if isinstance(usage, dict) else {})
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


def chat_usage(usage: dict[str, Any]) -> Usage:
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
        embeddings = [Embedding(pooling.decoded(item["embedding"])) for item in items]
        usage = Usage(int((data.get("usage") or {}).get("prompt_tokens") or 0), 0)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise MalformedResponse(f"the reply is not an embeddings list ({exc})") from exc
    return EmbedReply(embeddings, usage, data.get("model") or model)


def parse_scores(data: Any) -> ScoreReply:
    """vLLM's /score response body, its scores in document order."""
    try:
        items = sorted(data["data"], key=lambda item: item["index"])
        scores = [float(item["score"]) for item in items]
        usage = Usage(int((data.get("usage") or {}).get("prompt_tokens") or 0), 0)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise MalformedResponse(f"the reply is not a score list ({exc})") from exc
    return ScoreReply(scores, usage, data.get("model") or "")


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


def message_reasoning(message: Any) -> str | None:
    """A reply message's (or streamed delta's) thinking: `reasoning_content`, else `reasoning`.
    Takes the JSON dict or the SDK's object."""
    get = message.get if isinstance(message, dict) else lambda k: getattr(message, k, None)
    for key in ("reasoning_content", "reasoning"):
        value = get(key)
        if isinstance(value, str):
            return value
    return None


def split_thoughts(text: str) -> tuple[str | None, str]:
    """(thoughts, answer) of a Gemini content that may open with <thought>…</thought>."""
    return split(text, GEMINI_THOUGHTS)


def reasoning_tokens(usage: dict[str, Any]) -> int:
    """Of a chat-completions usage's completion tokens, those spent thinking."""
    details = usage.get("completion_tokens_details")
    if not isinstance(details, dict):
        return 0
    return int(details.get("reasoning_tokens") or 0)
