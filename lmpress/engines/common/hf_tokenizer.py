"""A Hugging Face tokenizer as the engine contract's `Tokenizer` (vocabulary/likelihood.py),
for the engines that tokenize with one: scoring and `/tokenize` read text as the model reads a
raw completion prompt, with no chat template, and with the special tokens around a text (a BOS)
only when asked; decoded text keeps special tokens; `pieces` gives each token's own text.

A token's own text is not `decode([id])`: a SentencePiece tokenizer drops the space that
starts the first token of a text ("▁Paris" decodes alone to "Paris"), so the pieces of a
prompt would not join into its text. Here a token is decoded after an anchor token and the
anchor's text is cut off, so a word keeps its leading space; only a text's first token is
decoded alone, as `decode` of the whole text writes it. A piece depends on its id alone, so
each is decoded once and kept: scoring a long text asks for the same few thousand again.
"""

from __future__ import annotations

from typing import Any

# The text the anchor token is encoded from: a plain letter, one token in any vocabulary.
ANCHOR_TEXT = "a"


class HfTokenizer:
    """`tokenizer`: a transformers tokenizer (or one that answers like it); `context_length`:
    the most tokens the engine reads at once, as it settled it at start; `eos_id`: the
    model's end token where the tokenizer names none."""

    def __init__(self, tokenizer: Any, context_length: int | None, eos_id: int | None = None):
        self.hf = tokenizer
        self.bos_id: int | None = tokenizer.bos_token_id
        self.eos_id: int | None = (
            tokenizer.eos_token_id if tokenizer.eos_token_id is not None else eos_id
        )
        self.context_length = context_length
        self._anchor = tokenizer.encode(ANCHOR_TEXT, add_special_tokens=False)[-1:]
        self._anchor_chars = len(self._decode(self._anchor))
        self._pieces: dict[int, str] = {}

    def encode(self, text: str, special: bool = False) -> list[int]:
        return list(self.hf(text, add_special_tokens=special)["input_ids"])

    def decode(self, ids: list[int]) -> str:
        return self._decode(ids)

    def pieces(self, ids: list[int]) -> list[str]:
        if not ids:
            return []
        return [self._decode(ids[:1]), *(self.piece(i) for i in ids[1:])]

    def piece(self, id: int) -> str:
        """The token's text where it follows another token (its leading space kept)."""
        text = self._pieces.get(id)
        if text is None:
            text = self._decode([*self._anchor, id])[self._anchor_chars :]
            self._pieces[id] = text
        return text

    def _decode(self, ids: list[int]) -> str:
        return self.hf.decode(ids, skip_special_tokens=False)
