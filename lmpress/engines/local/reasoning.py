"""A reasoning model's thinking on NATIVE and LLAMACPP, where lmpress drives every token.

`ModelReasoning` is what an engine learns once, when it loads: the model's format (from
`model.reasoning_parser` or the chat template's marks, common/reasoning.py), the token ids of
its marks as this tokenizer writes them, and which switches its template reads
(`enable_thinking`, `reasoning_effort`). Per request it gives the template variables that
`generation.reasoning_effort` asks for, and a `RequestReasoning`: whether the prompt opened
the block, and the budget each sample keeps (`ReasoningBudget`). The worker (worker.py) splits
each result's text and each streamed delta with it, so both engines answer alike; each
engine's sampling asks the budget which token to force and whether its grammar waits. The dry
run counts each prompt with the same template variables (`SwitchedPrompts`).

"Reasoning" names the concept in lmpress's code, as in the keys a user types
(`max_reasoning_tokens`, `reasoning_parser`, `reasoning_effort`); "thinking" stays where the
wire or the model says it (`<think>` marks, Anthropic's thinking blocks, `enable_thinking`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from lmpress.vocabulary.errors import ConfigError, ErrorKind, RequestError
from lmpress.vocabulary.reasoning import (
    HARMONY,
    ReasoningBudget,
    ReasoningFormat,
    StreamSplitter,
    check_parser,
    closed_in,
    format_for,
    opened_in,
    split,
)
from lmpress.vocabulary.types import GenerationParams, Message, Request, Sample

# The prompt's last tokens, decoded, show whether its template opened or closed the block.
PROMPT_TAIL = 32


class ModelReasoning:
    """How one loaded model thinks. `encode` turns a mark into this tokenizer's ids, `decode`
    ids back into text with special tokens kept."""

    def __init__(
        self,
        chat_template: Any,
        parser: str | None,
        encode: Callable[[str], list[int]],
        decode: Callable[[list[int]], str],
        model_name: str,
    ):
        self.template = template_text(chat_template)
        self.model_name = model_name
        self.parser = check_parser(parser)
        self.fmt: ReasoningFormat | None = format_for(self.template, self.parser)
        self._decode = decode
        fmt = self.fmt
        if fmt is not None:
            self.start_ids = encode(fmt.start)
            self.end_ids = encode(fmt.end)
            self.close_ids = encode(fmt.close)
            after = fmt.close.partition(fmt.end)[2]
            self.after_end_ids = encode(after) if after else []

    def template_kwargs(self, request: Request) -> dict[str, Any]:
        """The chat template variables a request's `reasoning_effort` sets (see
        `template_switches`)."""
        return template_switches(self.template, request, self.model_name)

    def check_recipe(self, params: GenerationParams) -> None:
        """The recipe's own reasoning_effort and max_reasoning_tokens, checked as a row's are
        before any row is read: a setting no row could take fails the load in one line."""
        probe = Request("recipe", [Message("user", "")], params)
        try:
            self.template_kwargs(probe)
            self.for_request([], params, guided=False)
        except RequestError as exc:
            raise ConfigError(str(exc)) from exc

    def for_request(
        self, prompt_ids: list[int], params: GenerationParams, guided: bool
    ) -> RequestReasoning | None:
        """A request's thinking, from its prompt's ids; None where the reply cannot think
        (a model that does not, or a prompt that closed the block). `guided`: its reply
        follows a grammar, which starts once the thinking is over."""
        fmt, limit = self.fmt, params.max_reasoning_tokens
        if fmt is None:
            if limit is not None:
                why = (
                    "model.reasoning_parser is none"
                    if self.parser == "none"
                    else "its chat template has no thinking marks; set model.reasoning_parser "
                    "if it does"
                )
                raise RequestError(
                    f"generation.max_reasoning_tokens: model '{self.model_name}' does not "
                    f"think ({why})",
                    kind=ErrorKind.UNSUPPORTED_PARAM,
                )
            return None
        tail = self._decode([t for t in prompt_ids[-PROMPT_TAIL:] if t >= 0])
        if closed_in(tail, fmt):
            return None
        return RequestReasoning(self, fmt, opened_in(tail, fmt), limit, guided)


@dataclass(frozen=True)
class RequestReasoning:
    """One request's thinking: whether its prompt opened the block, the budget, and whether
    a grammar waits for the answer."""

    model: ModelReasoning
    fmt: ReasoningFormat
    opened: bool
    limit: int | None
    guided: bool

    @property
    def keeps_special_tokens(self) -> bool:
        """Harmony's channels are special tokens: its replies are decoded with them, so that
        the channels can be read (`split` leaves them out of both parts)."""
        return self.fmt is HARMONY

    def budget(self) -> ReasoningBudget:
        """A sample's budget, counting its thinking tokens from the first one."""
        model = self.model
        return ReasoningBudget(
            self.opened,
            self.limit,
            model.close_ids,
            model.end_ids,
            model.start_ids,
            force_open=self.guided,
            after_end_ids=model.after_end_ids if self.guided else None,
        )

    def splitter(self) -> StreamSplitter:
        return StreamSplitter(self.fmt, self.opened)

    def split(self, sample: Sample) -> Sample:
        """The sample with its thinking apart from its answer."""
        reasoning, answer = split(sample.text, self.fmt, self.opened)
        return replace(sample, text=answer, reasoning=reasoning)


def template_text(chat_template: Any) -> str:
    """A chat template as text ("" for none; a tokenizer's named templates, all of them)."""
    if isinstance(chat_template, dict):
        return "\n".join(str(t) for t in chat_template.values())
    return str(chat_template or "")


def template_switches(template: str, request: Request, model_name: str) -> dict[str, Any]:
    """The chat template variables a request's `reasoning_effort` sets: `none` turns thinking
    off where the template reads `enable_thinking`, the others go as `reasoning_effort` to a
    template that reads it (gpt-oss's); any other is refused in one line."""
    effort = request.params.reasoning_effort
    if effort is None:
        return {}
    where = f"generation.reasoning_effort '{effort}'"
    if request.prompt is not None:
        raise RequestError(
            f"{where} applies to a chat's template; this row is a raw prompt",
            kind=ErrorKind.UNSUPPORTED_PARAM,
        )
    if effort == "none" and _reads(template, "enable_thinking"):
        return {"enable_thinking": False}
    if effort != "none" and _reads(template, "reasoning_effort"):
        return {"reasoning_effort": effort}
    switch = "enable_thinking" if effort == "none" else "reasoning_effort"
    raise RequestError(
        f"{where}: the chat template of model '{model_name}' reads no {switch}; bound its "
        f"thinking with generation.max_reasoning_tokens instead",
        kind=ErrorKind.UNSUPPORTED_PARAM,
    )


class SwitchedPrompts:
    """A local engine's prompts (HfPrompts, GgufPrompts) counted as the engine renders them
    for the dry run: with each request's reasoning_effort switches."""

    def __init__(self, prompts: Any, chat_template: Any, model_name: str):
        self.prompts = prompts
        self.template = template_text(chat_template)
        self.model_name = model_name

    def count(self, request: Request) -> int:
        switches = template_switches(self.template, request, self.model_name)
        return len(self.prompts.inputs(request, self.prompts.plan(request), switches)[0])


def _reads(template: str, variable: str) -> bool:
    return re.search(rf"\b{variable}\b", template) is not None
