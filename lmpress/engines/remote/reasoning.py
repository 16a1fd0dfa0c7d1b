"""How each OpenAI-compatible provider takes a reasoning model's bounds, and which way its
thinking comes back (read by `wire.openai.replies`: `reasoning_content` on the message, Gemini's
`<thought>` tags in the content, `thought_tags`, or only its count).

The bounds go out in each provider's own field (`ReasoningFields`, one per row of presets.py):
`reasoning_effort` as OpenAI's field of that name, which OpenAI, vLLM, SGLang, Fireworks and
Gemini's compatibility layer take; `max_reasoning_tokens` as Gemini's thinking budget
(`extra_body.google.thinking_config.thinking_budget`, with `include_thoughts` so the thinking
comes back). Chat completions has no token budget of OpenAI's own, so elsewhere the field is
refused by the engine's `params` (`lmpress engines` lists them).

An earlier turn's thinking in the input (`Message.reasoning`) is never sent back here: no
OpenAI-compatible provider documents taking it, and DeepSeek answers 400 to
`reasoning_content` in an input message. Anthropic's side is in wire/anthropic/client.py.

Nothing here imports an SDK: presets.py reads `ReasoningFields`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from lmpress.vocabulary.errors import ErrorKind, RequestError
from lmpress.vocabulary.types import GenerationParams


@dataclass(frozen=True)
class ReasoningFields:
    """Which reasoning fields an OpenAI-compatible provider takes, and how it writes thoughts."""

    effort: bool = False  # takes OpenAI's `reasoning_effort`
    # Where it takes `max_reasoning_tokens`: "google", Gemini's thinking_config; None: nowhere.
    budget: Literal["google"] | None = None
    thought_tags: bool = False  # thought summaries come back in <thought> tags (Gemini)

    @property
    def params(self) -> frozenset[str]:
        """The GenerationParams fields these make the provider honour."""
        return frozenset(
            name
            for name, taken in (("reasoning_effort", self.effort),
                                ("max_reasoning_tokens", self.budget is not None))
            if taken
        )  # fmt: skip

    def check(self, params: GenerationParams, engine: str) -> None:
        """Refuse a combination the provider answers 400 to, in one line naming the rule."""
        if (
            self.budget == "google"
            and params.reasoning_effort is not None
            and params.max_reasoning_tokens is not None
        ):
            raise RequestError(
                f"engine {engine} takes generation.reasoning_effort or "
                f"generation.max_reasoning_tokens (Gemini's thinking_budget), not both in one "
                f"request; keep one",
                ErrorKind.INVALID_REQUEST,
            )

    def apply(self, body: dict[str, Any], params: GenerationParams) -> dict[str, Any]:
        """The chat body with the reasoning bounds in the provider's fields, and with no earlier
        turn's thinking in its messages."""
        for message in body.get("messages") or ():
            message.pop("reasoning_content", None)
        if self.effort and params.reasoning_effort is not None:
            body["reasoning_effort"] = params.reasoning_effort
        if self.budget == "google" and params.max_reasoning_tokens is not None:
            # Gemini reads its own fields from an `extra_body` object in the JSON body (the
            # openai SDK's `extra_body` argument merges keys into the body, hence two levels
            # in Google's Python examples). Thoughts are asked for too: without them only
            # the count comes back.
            config = {"thinking_budget": params.max_reasoning_tokens}
            if params.max_reasoning_tokens:
                config["include_thoughts"] = True
            body["extra_body"] = {"google": {"thinking_config": config}}
        return body


OPENAI_EFFORT = ReasoningFields(effort=True)
GOOGLE = ReasoningFields(effort=True, budget="google", thought_tags=True)
