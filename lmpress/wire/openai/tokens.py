"""vLLM's tokenizer routes, beside its OpenAI ones: `/tokenize` (a prompt, or a conversation
through the model's chat template, to token ids), `/detokenize` (ids to text) and
`/tokenizer_info` (the special tokens, which lm-eval's `remote` tokenizer reads before it
tokenizes through the server). The bodies and answers keep vLLM's field names and defaults.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from lmpress.vocabulary.likelihood import Tokenizer

TOKENIZE_PATH = "/tokenize"
DETOKENIZE_PATH = "/detokenize"
TOKENIZER_INFO_PATH = "/tokenizer_info"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class TokenizeBody(_Strict):
    """A text (`prompt`) or a conversation (`messages`), not both."""

    model: str | None = None
    prompt: str | None = None
    messages: list[Any] | None = None
    # vLLM's default: a prompt gets the tokens the tokenizer puts around a text (a BOS); a
    # conversation gets only what its chat template writes.
    add_special_tokens: bool | None = None
    add_generation_prompt: bool = True
    return_token_strs: bool = False


class DetokenizeBody(_Strict):
    model: str | None = None
    tokens: list[Annotated[int, Field(ge=0)]]


def tokenize_response(ids: list[int], tokenizer: Tokenizer, token_strs: bool) -> dict[str, Any]:
    """vLLM's answer: the ids, how many, and the model's context length (0 where unknown)."""
    out: dict[str, Any] = {
        "count": len(ids),
        "max_model_len": tokenizer.context_length or 0,
        "tokens": ids,
        "token_strs": tokenizer.pieces(ids) if token_strs else None,
    }
    return out


def tokenizer_info(tokenizer: Tokenizer, model: str) -> dict[str, Any]:
    """The tokenizer's special tokens as text, as vLLM's `/tokenizer_info` says them (what
    lm-eval reads: eos_token, bos_token, pad_token), and its context length."""

    def text(token: int | None) -> str | None:
        return None if token is None else tokenizer.decode([token])

    return {
        "tokenizer_class": type(tokenizer).__name__,
        "name_or_path": model,
        "eos_token": text(tokenizer.eos_id),
        "bos_token": text(tokenizer.bos_id),
        "pad_token": None,
        "model_max_length": tokenizer.context_length,
    }
