"""A Hugging Face tokenizer as the engine contract's Tokenizer (vocabulary/likelihood.py), for
the engines that tokenize with one (VLLM hands back its own wrapper of it, which answers the
same calls).

Scoring and `/tokenize` read text as the model's tokenizer reads a raw completion prompt: with
no chat template, and with the special tokens around a text (a BOS) only when asked.
"""

from __future__ import annotations

from typing import Any


class HfTokenizer:
    """`tokenizer`: a transformers tokenizer (or one that answers like it); `context_length`:
    the most tokens the engine reads at once, as it settled it at start."""

    def __init__(self, tokenizer: Any, context_length: int | None):
        self._tokenizer = tokenizer
        self.bos_id: int | None = tokenizer.bos_token_id
        self.eos_id: int | None = tokenizer.eos_token_id
        self.context_length = context_length

    def encode(self, text: str, special: bool = False) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=special))

    def decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=False)

    def pieces(self, ids: list[int]) -> list[str]:
        # Each token decoded alone: a byte-level BPE's "Ġthe" is " the", as OpenAI's legacy
        # `tokens` show it; a character split over tokens decodes to U+FFFD in each of them.
        return [self._tokenizer.decode([token], skip_special_tokens=False) for token in ids]
