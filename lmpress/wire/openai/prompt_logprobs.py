"""A prompt's own tokens' logprobs on the wire, in the two shapes clients read them: OpenAI's
legacy completions `logprobs` with `echo` (the prompt's tokens, then the reply's, in one list;
lm-eval's `local-completions` scores a continuation this way), and vLLM's `prompt_logprobs`
(a list a prompt token, token id -> {logprob, rank, decoded_token}).

`read_scored` reads either back, for a remote engine whose server scores prompts.

Both start with null: nothing comes before the first token, so nothing predicts it. An entry's
alternatives are the chosen token and the likeliest others, so a reader tells whether the
token was the greedy one by comparing it with the largest. A logprob of -inf (a token the model
rules out) is written -9999.0, as OpenAI and vLLM write it, since JSON has no infinity.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from openai.types.completion_choice import Logprobs as CompletionLogprobs

from lmpress.vocabulary.likelihood import Tokenizer
from lmpress.vocabulary.types import Request, Result, TokenLogprob
from lmpress.wire.openai.client import completion_prompt
from lmpress.wire.replies import MalformedResponse, Reply

# What JSON writes for -inf (and OpenAI's and vLLM's floor on a logprob).
FLOOR = -9999.0

# A completions prompt as the body gave it: text, or token ids.
Prompt = str | list[int]


@dataclass
class Echo:
    """What a completion writes before its reply with `echo`: the prompt's text, and each
    prompt token's own text where the prompt's logprobs were asked for."""

    text: str = ""
    pieces: list[str] | None = None


def echo_of(
    prompt: Prompt, result: Result, tokenizer: Tokenizer | None, logprobs: bool = False
) -> Echo:
    """The echo of one prompt: its text as given (token ids decoded), and with `logprobs` (the
    body asked for them) each token's text, from the tokenizer where there is one, else from
    the prompt's logprobs themselves."""
    ids = result.prompt_ids or (prompt if isinstance(prompt, list) else None)
    pieces = None
    if logprobs and result.prompt_logprobs is not None:
        if tokenizer is not None and ids:
            pieces = tokenizer.pieces(ids)
        else:
            pieces = _pieces_without_tokenizer(prompt, result.prompt_logprobs)
    if isinstance(prompt, str):
        return Echo(prompt, pieces)
    if tokenizer is not None:
        return Echo(tokenizer.decode(prompt), pieces)
    return Echo("".join(pieces or ()), pieces)


def _pieces_without_tokenizer(prompt: Prompt, logprobs: list[TokenLogprob | None]) -> list[str]:
    """Each prompt token's text from its logprob entry; the first, which has none, is what of a
    text prompt comes before the others (empty for token ids)."""
    rest = [lp.token if lp is not None else "" for lp in logprobs[1:]]
    tail = "".join(rest)
    first = prompt[: len(prompt) - len(tail)] if isinstance(prompt, str) else ""
    if isinstance(prompt, str) and not prompt.endswith(tail):
        first = ""
    return [first, *rest]


def floor(logprob: float) -> float:
    return FLOOR if math.isinf(logprob) or logprob < FLOOR else logprob


def completion_logprobs(
    generated: list[TokenLogprob] | None, echo: Echo | None = None, result: Result | None = None
) -> CompletionLogprobs | None:
    """A text completion choice's `logprobs`: with an echo of the prompt's pieces, the prompt's
    tokens first (the first without a logprob), then the generated ones."""
    tokens: list[str] = []
    values: list[float | None] = []
    tops: list[dict[str, float] | None] = []
    prompt = echo.pieces if echo is not None else None
    if prompt is not None and result is not None and result.prompt_logprobs is not None:
        # An echo asked with logprobs: the prompt's tokens lead the list.
        for i, piece in enumerate(prompt):
            entry = result.prompt_logprobs[i] if i < len(result.prompt_logprobs) else None
            tokens.append(piece)
            values.append(None if entry is None else floor(entry.logprob))
            tops.append(None if entry is None else _alternatives(entry, piece))
    if generated is None and not tokens:
        return None
    for entry in generated or ():
        tokens.append(entry.token)
        values.append(floor(entry.logprob))
        tops.append(_alternatives(entry, entry.token))
    offsets, at = [], 0
    for token in tokens:
        offsets.append(at)
        at += len(token)
    # Built without validation: the openai type has no null in its lists, which an echo's
    # first token needs (the SDK reads replies without validating them either).
    return CompletionLogprobs.model_construct(
        tokens=tokens, token_logprobs=values, top_logprobs=tops, text_offset=offsets
    )


def _alternatives(entry: TokenLogprob, token: str) -> dict[str, float]:
    """The chosen token and the likeliest ones at its position, as OpenAI lists them (up to
    one more than asked for, the chosen token first)."""
    out = {token: floor(entry.logprob)}
    for text, logprob in entry.top:
        out.setdefault(text, floor(logprob))
    return out


def vllm_prompt_logprobs(result: Result) -> list[dict[str, dict[str, Any]] | None] | None:
    """vLLM's `prompt_logprobs`: for each prompt token, null for the first (and for any the
    engine did not score), else the token's own id first, then its alternatives', each with
    its logprob, rank (1: the likeliest; null where unknown: a token outside the alternatives)
    and text. None where the engine gave no ids to key them by."""
    logprobs = result.prompt_logprobs
    if logprobs is None:
        return None
    ids = result.prompt_ids or []
    out: list[dict[str, dict[str, Any]] | None] = []
    for i, entry in enumerate(logprobs):
        own = entry.id if entry is not None and entry.id is not None else _at(ids, i)
        if entry is None:
            out.append(None)
            continue
        if own is None or len(entry.top_ids) != len(entry.top):
            return None
        ranks = {token: rank for rank, token in enumerate(entry.top_ids, 1)}
        step = {str(own): _vllm_logprob(entry.logprob, ranks.get(own), entry.token)}
        for (text, logprob), token in zip(entry.top, entry.top_ids, strict=True):
            step.setdefault(str(token), _vllm_logprob(logprob, ranks[token], text))
        out.append(step)
    return out


def _at(ids: list[int], i: int) -> int | None:
    return ids[i] if i < len(ids) else None


def _vllm_logprob(logprob: float, rank: int | None, text: str) -> dict[str, Any]:
    return {"logprob": floor(logprob), "rank": rank, "decoded_token": text}


# --- the way in: what a server that scores prompts answers -----------------------------------


def read_scored(data: dict[str, Any], request: Request, reply: Reply) -> Reply:
    """A completions (or chat) reply's prompt logprobs, read into `reply`: from vLLM's
    `prompt_logprobs` where the server wrote them (they carry token ids), else from the echoed
    prompt's legacy logprobs; an echo's prompt text and tokens come off each sample, which keeps
    its own tokens' logprobs where the request asked for them."""
    p = request.params
    choices = sorted(data.get("choices") or [], key=lambda c: c.get("index") or 0)
    if p.prompt_logprobs is None and not p.logprobs:
        return reply
    given = data.get("prompt_logprobs")  # a chat's, beside its choices
    if given is None and choices:
        given = choices[0].get("prompt_logprobs")
    k = p.prompt_logprobs or 0
    prompt = _read_vllm(given, k) if isinstance(given, list) else None
    echoed = completion_prompt(request) is not None and p.prompt_logprobs is not None
    for choice, sample in zip(choices, reply.samples, strict=False):
        legacy = choice.get("logprobs")
        if not isinstance(legacy, dict) or "token_logprobs" not in legacy:
            continue
        entries = _read_legacy(legacy)
        count = _prompt_length(request, prompt, reply) if echoed else 0
        if echoed and prompt is None:
            prompt = [None, *(_trimmed(e, k) for e in entries[1:count])]
        if echoed:
            sample.text = sample.text[_echo_length(request, sample.text, legacy, count) :]
        if p.logprobs:
            sample.logprobs = [_trimmed(e, p.top_logprobs) for e in entries[count:]]
    if p.prompt_logprobs is not None:
        if prompt is None:
            raise MalformedResponse("the reply has no logprobs for the prompt's tokens")
        reply.prompt_logprobs = prompt
        reply.prompt_ids = request.prompt_ids or _ids(choices)
    return reply


def _read_vllm(given: list[Any], k: int) -> list[TokenLogprob | None]:
    """vLLM's `prompt_logprobs`: each position's first entry is the prompt's token; its
    alternatives are the entries ranked 1 to `k`."""
    out: list[TokenLogprob | None] = []
    try:
        for step in given:
            if step is None:
                out.append(None)
                continue
            items = [(int(key), value) for key, value in step.items()]
            own, first = items[0]
            ranked = sorted(
                (value["rank"], key, value)
                for key, value in items
                if value.get("rank") is not None and value["rank"] <= k
            )
            out.append(
                TokenLogprob(
                    first.get("decoded_token") or "",
                    float(first["logprob"]),
                    [(v.get("decoded_token") or "", float(v["logprob"])) for _, _, v in ranked],
                    own,
                    [key for _, key, _ in ranked],
                )  # fmt: skip
            )
    except (AttributeError, IndexError, KeyError, TypeError, ValueError) as exc:
        raise MalformedResponse(f"the reply's prompt_logprobs are not vLLM's ({exc})") from exc
    return out


def _read_legacy(logprobs: dict[str, Any]) -> list[TokenLogprob | None]:
    """OpenAI's legacy completions logprobs, a token at a time (None where it has no logprob:
    an echoed prompt's first token), each token's alternatives likeliest first."""
    try:
        tokens, values = logprobs["tokens"], logprobs["token_logprobs"]
        tops = logprobs.get("top_logprobs") or [None] * len(tokens)
        return [
            None
            if value is None
            else TokenLogprob(
                token,
                float(value),
                sorted(
                    ((t, float(lp)) for t, lp in (top or {}).items()), key=lambda pair: -pair[1]
                ),
            )  # fmt: skip
            for token, value, top in zip(tokens, values, tops, strict=True)
        ]
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise MalformedResponse(f"the reply's logprobs are not OpenAI's ({exc})") from exc


def _trimmed(entry: TokenLogprob | None, k: int) -> TokenLogprob | None:
    """The entry with its `k` likeliest alternatives (a server may list one more: the token)."""
    if entry is None:
        return None
    return TokenLogprob(entry.token, entry.logprob, entry.top[:k], entry.id, entry.top_ids[:k])


def _prompt_length(request: Request, prompt: list[TokenLogprob | None] | None, reply: Reply) -> int:
    if request.prompt_ids is not None:
        return len(request.prompt_ids)
    if prompt is not None:
        return len(prompt)
    return reply.usage.prompt_tokens


def _echo_length(request: Request, text: str, logprobs: dict[str, Any], count: int) -> int:
    """Where an echoed prompt ends in a choice's text: after the prompt as sent, else at the
    first generated token's offset (or the whole text, where nothing was generated)."""
    if request.prompt_ids is None and request.prompt and text.startswith(request.prompt):
        return len(request.prompt)
    offsets = logprobs.get("text_offset") or []
    return offsets[count] if count < len(offsets) else len(text)


def _ids(choices: list[dict[str, Any]]) -> list[int] | None:
    """vLLM's `prompt_token_ids` of the first choice, where the server wrote them."""
    ids = choices[0].get("prompt_token_ids") if choices else None
    return ids if isinstance(ids, list) else None
