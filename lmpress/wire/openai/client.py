"""OpenAI request bodies, the way out: what a remote engine sends to an OpenAI-compatible
server for a Request. The same argument names `requests` reads, so that lmpress serve, behind
a REMOTE engine, understands everything a REMOTE engine sends.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lmpress.vocabulary.embeddings import EmbedRequest, ScoreRequest
from lmpress.vocabulary.guided import FORMS, GuidedDecoding, GuidedForm
from lmpress.vocabulary.types import GenerationParams, Message, Request

# What every OpenAI-compatible chat endpoint takes.
OPENAI_PARAMS = frozenset({
    "max_new_tokens", "temperature", "top_p", "presence_penalty", "frequency_penalty",
    "stop_strings", "seed", "n", "logprobs", "top_logprobs", "logit_bias", "guided_decoding",
})  # fmt: skip
# A prompt's own logprobs: servers that score prompts (vLLM, SGLang, lmpress serve) take them as
# OpenAI's legacy `echo` with `logprobs` on completions, and as vLLM's `prompt_logprobs` on chat.
SCORING_PARAMS = frozenset({"prompt_logprobs"})
# Sampling fields many open-model servers add, sent under the same names as extra body fields.
OPEN_MODEL_PARAMS = frozenset({"top_k", "min_p", "repetition_penalty"})
VLLM_PARAMS = OPEN_MODEL_PARAMS | {
    "min_tokens", "stop_token_ids", "skip_special_tokens", "ignore_eos", "bad_words",
}  # fmt: skip
# The guided-decoding forms OpenAI's response_format can say.
RESPONSE_FORMAT_FORMS: frozenset[GuidedForm] = frozenset({"json", "json_object"})


@dataclass(frozen=True)
class Dialect:
    """How one service spells what lmpress asks for."""

    max_tokens_field: str = "max_tokens"
    # Generation fields sent under their own names beyond OpenAI's set (vLLM's top_k...).
    extra_fields: frozenset[str] = frozenset()
    # Guided decoding: OpenAI's response_format (json schemas), or vLLM's `structured_outputs`,
    # which takes every form and option vLLM's offline engine does, under the same names.
    structured_outputs: bool = False
    # vLLM's `use_beam_search`: its server searches `n` beams and answers every one, best
    # first (`kept_beams` keeps the request's n of them).
    beam_search: bool = False

    @property
    def guided_forms(self) -> frozenset[GuidedForm]:
        return frozenset(FORMS) if self.structured_outputs else RESPONSE_FORMAT_FORMS

    def check_guided(self, guided: GuidedDecoding, engine: str) -> None:
        """Raise RequestError, naming the engine, for a form or option it cannot send."""
        guided.refuse_unless(engine, self.guided_forms, options=self.structured_outputs)


def request_body(
    request: Request,
    model: str,
    dialect: Dialect,
    *,
    stream: bool = False,
    image_url: Callable[[str], str] = lambda url: url,
) -> dict[str, Any]:
    """The JSON body of a chat-completions (or, for a raw prompt, completions) request.

    Fields left at lmpress's defaults are not sent, so the server's own defaults apply, except
    temperature, which is always sent: lmpress's default (0, greedy) is not the services'.
    Tools go with their tool_choice and parallel_tool_calls; without tools those mean nothing
    and are not sent.
    `image_url` rewrites each image URL (a remote server cannot read local files).
    """
    p = request.params
    body: dict[str, Any] = {"model": model}
    raw = completion_prompt(request)
    if raw is not None:
        body["prompt"] = raw
    else:
        body["messages"] = [_message(m, image_url) for m in request.messages]
    body["max_tokens" if raw is not None else dialect.max_tokens_field] = p.max_new_tokens
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
        if raw is not None:
            body["logprobs"] = p.top_logprobs or 1
        else:
            body["logprobs"] = True
            if p.top_logprobs:
                body["top_logprobs"] = p.top_logprobs
    if p.prompt_logprobs is not None:
        _prompt_logprobs(body, p, raw is not None)
    if p.logit_bias:
        # OpenAI's type takes whole-number biases, and a config's -100 is read as -100.0.
        body["logit_bias"] = {
            k: int(v) if float(v).is_integer() else v for k, v in p.logit_bias.items()
        }
    defaults = GenerationParams()
    for name in sorted(dialect.extra_fields):
        value = getattr(p, name)
        if value != getattr(defaults, name):
            body[name] = list(value) if isinstance(value, list) else value
    if p.num_beams > 1 and dialect.beam_search:
        body.update(use_beam_search=True, n=p.num_beams)
        if p.length_penalty != 1.0:
            body["length_penalty"] = p.length_penalty
    if p.guided_decoding is not None:
        if dialect.structured_outputs:
            body["structured_outputs"] = p.guided_decoding.vllm_fields()
        else:
            body["response_format"] = response_format(p.guided_decoding)
    if request.tools and raw is None:
        body["tools"] = [{"type": "function", "function": t["function"]} for t in request.tools]
        if p.tool_choice is not None:
            body["tool_choice"] = p.tool_choice
        if not p.parallel_tool_calls:
            body["parallel_tool_calls"] = False
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}  # a usage chunk at the end
    return body


def kept_beams(params: GenerationParams, dialect: Dialect) -> int | None:
    """How many of a reply's choices a request keeps where the server answered every beam it
    searched (the first, best, `n`); None: every choice."""
    return params.n if params.num_beams > 1 and dialect.beam_search else None


def completion_prompt(request: Request) -> str | list[int] | None:
    """The request's raw prompt, for /completions (token ids win over text); None for a chat."""
    return request.prompt_ids if request.prompt_ids is not None else request.prompt


def _prompt_logprobs(body: dict[str, Any], p: GenerationParams, completions: bool) -> None:
    """A completions prompt is scored by echoing it with logprobs, which every server that
    scores prompts answers (one `logprobs` count serves the prompt's and the reply's tokens);
    a chat asks vLLM's `prompt_logprobs`."""
    assert p.prompt_logprobs is not None
    if not completions:
        body["prompt_logprobs"] = p.prompt_logprobs
        return
    body["echo"] = True
    body["logprobs"] = max(p.prompt_logprobs, p.top_logprobs if p.logprobs else 0)


def response_format(guided: GuidedDecoding) -> dict[str, Any]:
    """A json or json_object constraint as OpenAI's response_format; `requests` reads it back
    into the same GuidedDecoding."""
    if guided.is_any_json_object():
        return {"type": "json_object"}
    spec: dict[str, Any] = {"name": "response", "schema": dict(guided.json)}
    if guided.strict:
        spec["strict"] = True
    return {"type": "json_schema", "json_schema": spec}


def _message(message: Message, image_url: Callable[[str], str]) -> dict[str, Any]:
    out = message.to_openai()
    if out.get("tool_calls") and out["content"] == "":
        out["content"] = None  # a turn that only called tools, as OpenAI writes it
    if isinstance(out["content"], list):
        for part in out["content"]:
            if part["type"] == "image_url":
                part["image_url"]["url"] = image_url(part["image_url"]["url"])
    return out


def embed_body(request: EmbedRequest, model: str) -> dict[str, Any]:
    """The /embeddings body for a request. It asks for base64, as the SDK's own
    `embeddings.create` does: a quarter of the bytes of JSON floats, and the float32 values
    exactly (`parse_embeddings` reads either)."""
    body: dict[str, Any] = {"model": model, "input": request.inputs,
                            "encoding_format": "base64"}  # fmt: skip
    if request.dimensions is not None:
        body["dimensions"] = request.dimensions
    return body


def score_body(request: ScoreRequest, model: str) -> dict[str, Any]:
    """vLLM's /score body: text_1 against each of text_2."""
    return {"model": model, "text_1": request.query, "text_2": request.documents}
