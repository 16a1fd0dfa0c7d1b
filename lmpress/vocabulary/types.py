"""The data that flows between the fronts (batch, chat, serve, infer) and the engines."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from lmpress.vocabulary.errors import ErrorKind
from lmpress.vocabulary.guided import GuidedDecoding

# Who speaks a message: OpenAI's roles, which every front reads and every engine renders.
Role = Literal["system", "developer", "user", "assistant", "tool"]
ROLES: tuple[Role, ...] = get_args(Role)


@dataclass
class ContentPart:
    """One piece of a message's content: text, or an image by URL (http, file or data: URL)."""

    type: Literal["text", "image_url"]
    text: str | None = None
    image_url: str | None = None


@dataclass(frozen=True)
class ToolCall:
    """One call of a function: its arguments as JSON text, as OpenAI's wire carries them."""

    id: str
    name: str
    arguments: str

    def to_openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass
class Message:
    role: Role
    content: str | list[ContentPart]
    tool_calls: list[ToolCall] | None = None  # an assistant turn that called tools
    tool_call_id: str | None = None  # a tool turn: the call it answers
    # An assistant turn's thinking, as a row or request carried it (`reasoning_content`, or
    # `reasoning`): engines send it back the way each provider or template wants, most drop it.
    reasoning: str | None = None
    # A provider's own thinking blocks for this turn (Anthropic's `thinking` with its signature,
    # `redacted_thinking`), kept whole so a later request can send them back unchanged.
    reasoning_details: list[dict[str, Any]] | None = None

    def text(self) -> str:
        """The message's text; image parts are left out."""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text or "" for part in self.content if part.type == "text")

    def has_images(self) -> bool:
        return not isinstance(self.content, str) and any(
            part.type == "image_url" for part in self.content
        )

    def to_openai(self) -> dict[str, Any]:
        """The message as an OpenAI chat message dict."""
        out: dict[str, Any] = {"role": self.role}
        if isinstance(self.content, str):
            out["content"] = self.content
        else:
            parts: list[dict[str, Any]] = []
            for part in self.content:
                if part.type == "text":
                    parts.append({"type": "text", "text": part.text or ""})
                else:
                    parts.append({"type": "image_url", "image_url": {"url": part.image_url}})
            out["content"] = parts
        if self.tool_calls:
            out["tool_calls"] = [call.to_openai() for call in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.reasoning is not None:
            out["reasoning_content"] = self.reasoning
        return out


@dataclass
class GenerationParams:
    """How to generate. Field names follow Oumi's `generation` section.

    Every field has a neutral default; an engine refuses a field set away from its default
    unless the field is in the engine's `supported_params`.
    """

    max_new_tokens: int = 256  # the reply's tokens at most, thinking included
    temperature: float = 0.0  # 0 means greedy
    top_p: float = 1.0  # nucleus sampling: the smallest set of tokens holding this probability
    top_k: int | None = None  # sample among the k likeliest tokens; null: no limit
    min_p: float = 0.0  # drop tokens below min_p times the likeliest token's probability
    repetition_penalty: float = 1.0  # penalises tokens already seen, as transformers does (1: off)
    presence_penalty: float = 0.0  # subtracted once from a seen token's logit, as OpenAI's
    frequency_penalty: float = 0.0  # subtracted per occurrence of a seen token, as OpenAI's
    # the reply ends before the first of these
    stop_strings: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)  # the reply ends at any of these tokens
    min_tokens: int = 0  # no end of reply before this many tokens
    # The model's end-of-sequence tokens do not end the reply: it runs to max_new_tokens (stop
    # strings and stop_token_ids still end it), as vLLM's ignore_eos; benchmarks use it.
    ignore_eos: bool = False
    # Words the reply never writes, as vLLM's bad_words: each word's tokens (as the reply's
    # first word and after a space), the last of them banned where the reply ends with the
    # ones before it.
    bad_words: list[str] = field(default_factory=list)
    seed: int | None = None  # a row's own random generator (seed + i for its i-th sample)
    n: int = 1  # samples per prompt
    logprobs: bool = False  # return each token's log probability
    top_logprobs: int = 0  # and this many likeliest alternatives at each position
    # The prompt's own tokens' log probabilities (vLLM's `prompt_logprobs`): each prompt token
    # after the first, with this many likeliest alternatives at each position (0: the token's
    # own only); null: none. `Result.prompt_logprobs` holds them.
    prompt_logprobs: int | None = None
    # token id -> bias added to its logit, as OpenAI's
    logit_bias: dict[str, float] = field(default_factory=dict)
    guided_decoding: GuidedDecoding | None = None  # a mapping given here is parsed into one
    skip_special_tokens: bool = True  # leave special tokens out of the text
    # Beam search: the num_beams likeliest continuations run on at each step, and `n` returns
    # the best n; as transformers' generate (length_penalty divides a finished beam's score by
    # its length to this power; early_stopping: true, false or "never").
    num_beams: int = 1
    length_penalty: float = 1.0
    early_stopping: bool | str = False
    # Scheduling, not sampling: how many sequences a local engine decodes together.
    batch_size: int = 8
    # Accepted so Oumi recipes load unchanged; lmpress always returns only the new text and
    # always uses the KV cache, which is what these defaults mean.
    exclude_prompt_from_response: bool = True
    use_cache: bool = True
    # Oumi's switch: false decodes greedily whatever the temperature (Oumi's NATIVE default);
    # null (lmpress's default) follows the temperature, 0 being greedy.
    use_sampling: bool | None = None
    # Whether a request that offers tools must call one (lmpress.vocabulary.tools checks the value against
    # the tools); without tools neither field means anything.
    tool_choice: Any = None
    parallel_tool_calls: bool = True
    # How long a reasoning model may think. `reasoning_effort` (none, minimal, low, medium,
    # high) is the providers' own knob; `max_reasoning_tokens` caps the thinking in tokens: a
    # local engine closes the thinking block itself after that many and the model answers.
    # `max_new_tokens` counts the thinking and the answer together, as the providers do.
    reasoning_effort: str | None = None
    max_reasoning_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.use_sampling is False:
            self.temperature = 0.0
        if self.reasoning_effort is not None and self.reasoning_effort not in REASONING_EFFORTS:
            raise ValueError(
                f"reasoning_effort '{self.reasoning_effort}' is not one of "
                f"{', '.join(REASONING_EFFORTS)}"
            )
        if self.early_stopping not in (True, False, "never"):
            raise ValueError(
                f"early_stopping {self.early_stopping!r} is not one of true, false, never"
            )
        if self.max_reasoning_tokens is not None and self.max_reasoning_tokens < 0:
            raise ValueError("max_reasoning_tokens must be 0 or more")
        # The one place guided decoding is parsed; one that sets no constraint (Oumi writes
        # every field, the unused ones null) is none.
        self.guided_decoding = GuidedDecoding.parse(self.guided_decoding)

    def sampling_temperature(self) -> float:
        """The temperature a local engine samples at: 0 (greedy) below MIN_TEMPERATURE."""
        return self.temperature if self.temperature >= MIN_TEMPERATURE else 0.0

    def explicit_fields(self) -> frozenset[str]:
        """The fields a user set (recipe, flag, row, request), whatever their value: a model's
        own defaults may fill only the others. Kept off the dataclass fields, so it is no
        config key."""
        return getattr(self, "_explicit", frozenset())

    def mark_explicit(self, names: Iterable[str]) -> GenerationParams:
        self._explicit = self.explicit_fields() | frozenset(names)
        return self

    def with_defaults(self, defaults: Mapping[str, Any]) -> GenerationParams:
        """These params with `defaults` filling the fields the user did not set."""
        fill = {k: v for k, v in defaults.items() if k not in self.explicit_fields()}
        return (
            dataclasses.replace(self, **fill).mark_explicit(self.explicit_fields())
            if fill
            else self
        )

    def changed_fields(self) -> dict[str, Any]:
        """Fields set away from their defaults (scheduling fields left out)."""
        defaults = GenerationParams()
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name not in NEVER_REFUSED and getattr(self, f.name) != getattr(defaults, f.name)
        }

    def replace(self, **changes: Any) -> GenerationParams:
        """These params with `changes`, which count as set by the user."""
        return dataclasses.replace(self, **changes).mark_explicit(
            {*self.explicit_fields(), *changes}
        )


# `reasoning_effort`'s values, from none (answer without thinking, where the model can) up.
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high")

# Below this temperature the local engines decode greedily, the limit sampling approaches as
# the temperature falls: dividing logits by 1e-40 overflows float32 to inf and the softmax to
# NaN. vLLM clamps at the same 0.01 instead, which is all but greedy too.
MIN_TEMPERATURE = 0.01

# Fields that steer how work is scheduled rather than what is generated: never refused, never
# set per row or in a chat, and left out of a batch job's fingerprint.
SCHEDULING_FIELDS = frozenset({"batch_size", "exclude_prompt_from_response", "use_cache"})
# Every generation field, as a row's `generation`, a chat's /set and a recipe spell it.
GENERATION_FIELDS = tuple(f.name for f in dataclasses.fields(GenerationParams))
# Not refused either: use_sampling acts through the temperature, and the tool fields mean
# nothing without tools, which an engine that cannot take them refuses (Engine.takes_tools).
NEVER_REFUSED = SCHEDULING_FIELDS | {"use_sampling", "tool_choice", "parallel_tool_calls"}


@dataclass
class Request:
    """One conversation to complete. `prompt` set means raw text completion, no chat template."""

    id: str
    messages: list[Message]
    params: GenerationParams = field(default_factory=GenerationParams)
    prompt: str | None = None
    # A raw completion prompt as token ids (OpenAI's and vLLM's `prompt` as a list of ints),
    # read as given: no chat template, no special token added. Set, it wins over `prompt`.
    prompt_ids: list[int] | None = None
    # With `params.prompt_logprobs`: the first prompt position whose logprob the caller reads
    # (a log-likelihood reads only its continuation's). An engine may leave the positions
    # before it None, and so reuse a cached prefix up to it.
    score_from: int = 1
    # The functions the model may call, in OpenAI's form ({"type": "function", "function":
    # {"name", "description", "parameters"}}); `params.tool_choice` says whether it must.
    tools: list[dict[str, Any]] | None = None
    # The LoRA adapter to generate with, one of `model.adapters`' names; None: the base model.
    adapter: str | None = None


@dataclass
class Delta:
    """New text for one sample of a request, as it streams: answer text, or (`reasoning`)
    the model's thinking, which a reasoning model streams before its answer."""

    request_id: str
    text: str
    index: int = 0
    reasoning: bool = False


@dataclass
class TokenLogprob:
    """A token's log probability at its position, and the likeliest alternatives there (`top`,
    most likely first). `id` and `top_ids` are the token ids where the engine knows them (a
    local engine does; a remote API gives text)."""

    token: str
    logprob: float
    top: list[tuple[str, float]] = field(default_factory=list)
    id: int | None = None
    top_ids: list[int] = field(default_factory=list)

    @property
    def is_top(self) -> bool:
        """Whether the token is the likeliest one at its position (lm-eval's `is_greedy`, a
        position at a time): the first of `top` by id where ids are known, else no alternative
        more likely. Needs `top` of one or more."""
        if self.id is not None and self.top_ids:
            return self.id == self.top_ids[0]
        return not self.top or self.logprob >= self.top[0][1]


# Why a sample ended: OpenAI's finish reasons (a remote engine reads any other a provider sends
# as "stop"), and lmpress's own for a request cancelled or failed midway.
FinishReason = Literal["stop", "length", "content_filter", "tool_calls", "cancelled", "error"]
FINISH_REASONS: tuple[FinishReason, ...] = get_args(FinishReason)


@dataclass
class Sample:
    text: str
    finish_reason: FinishReason
    logprobs: list[TokenLogprob] | None = None
    completion_tokens: int = 0
    tool_calls: list[ToolCall] | None = None  # the calls the reply makes (finish "tool_calls")
    # A reasoning model's thinking, kept apart from `text` (the answer); None for a model
    # that does not think. `reasoning_tokens` counts it, inside `completion_tokens`.
    reasoning: str | None = None
    reasoning_tokens: int = 0
    # The provider's own thinking blocks (see Message.reasoning_details).
    reasoning_details: list[dict[str, Any]] | None = None
    # The stop string (one of GenerationParams.stop_strings) that ended it; None where an
    # end-of-sequence or stop token, the length limit or anything else ended it.
    stop_sequence: str | None = None


def round_usd(amount: float) -> float:
    """A cost to six significant digits, for rows and summaries: float noise goes, and a
    fraction of a cent stays (an embedding row costs about a ten-millionth of a dollar)."""
    return float(f"{amount:.6g}")


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # Of completion_tokens, those spent thinking (OpenAI's completion_tokens_details).
    reasoning_tokens: int = 0
    # Of prompt_tokens, those the provider read from its prompt cache (OpenAI's and Gemini's
    # prompt_tokens_details.cached_tokens, Anthropic's cache_read_input_tokens), and those it
    # wrote to it (Anthropic's cache_creation_input_tokens): each priced apart.
    cached_tokens: int = 0
    cache_creation_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @classmethod
    def summed(cls, usages: Iterable[Usage]) -> Usage:
        """The usages added up, field by field (one request's n results, a batch's rows)."""
        total = cls()
        for usage in usages:
            for f in dataclasses.fields(cls):
                setattr(total, f.name, getattr(total, f.name) + getattr(usage, f.name))
        return total


@dataclass
class ErrorInfo:
    kind: ErrorKind  # a string naming a kind is read as that kind; an unknown one is refused
    message: str
    status: int | None = None

    def __post_init__(self) -> None:
        self.kind = ErrorKind(self.kind)


@dataclass
class Result:
    """The final outcome of a request: one sample per `n`, or an error."""

    request_id: str
    samples: list[Sample] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    model: str = ""
    engine: str = ""
    latency_s: float = 0.0
    error: ErrorInfo | None = None
    # For a row that asked for JSON, a regex or a choice: the reply checked against it
    # (`structured.check_structure`): {"valid": true, "parsed": ...}.
    structured: dict[str, Any] | None = None
    cost_usd: float | None = None  # what the tokens cost, where the config knows a price
    cached: bool = False  # answered from the response cache (lmpress/cache/), not generated
    # With `params.prompt_logprobs`: one per prompt token, None at the first (nothing precedes
    # it) and before `Request.score_from` where the engine skipped those.
    prompt_logprobs: list[TokenLogprob | None] | None = None
    # The prompt's token ids, where the engine knows them (local engines): what echo returns.
    prompt_ids: list[int] | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def text(self) -> str:
        return self.samples[0].text if self.samples else ""

    @property
    def reasoning(self) -> str | None:
        return self.samples[0].reasoning if self.samples else None

    @property
    def finish_reason(self) -> FinishReason | None:
        return self.samples[0].finish_reason if self.samples else None

    @property
    def reasoned(self) -> bool:
        """Whether the model thought before answering: a sample has thinking, or the usage
        counts some (a provider may count thinking it does not show)."""
        return bool(self.usage.reasoning_tokens) or any(
            s.reasoning is not None for s in self.samples
        )
