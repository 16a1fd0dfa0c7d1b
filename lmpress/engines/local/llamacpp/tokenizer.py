"""The GGUF file's tokenizer as scoring, `/tokenize` and lm-eval use it
(vocabulary/likelihood.py's `Tokenizer`): text in, ids out, as llama.cpp reads a raw prompt.
Special tokens written in the text (`<|im_end|>`) are read as those tokens, as a prompt's
are, and as a Hugging Face tokenizer reads them."""

from __future__ import annotations

from typing import Any

from lmpress.engines.local.llamacpp.loading import Vocab


class GgufTokenizer:
    """`model`: llama-cpp-python's `LlamaModel` (`Llama._model`); `context_length`: the most
    tokens one sequence of the engine's context reads."""

    def __init__(self, model: Any, vocab: Vocab, context_length: int):
        self._model = model
        self._vocab = vocab
        bos, eos = model.token_bos(), model.token_eos()
        self.bos_id = bos if bos >= 0 else None  # llama.cpp says -1 for none
        self.eos_id = eos if eos >= 0 else None
        self.context_length = context_length

    def encode(self, text: str, special: bool = False) -> list[int]:
        """`special`: the BOS the model's tokenizer puts before a prompt, where its GGUF
        metadata says it adds one."""
        return list(self._model.tokenize(text.encode("utf-8"), add_bos=special, special=True))

    def decode(self, ids: list[int]) -> str:
        return self._vocab.decode(ids, special=True)

    def pieces(self, ids: list[int]) -> list[str]:
        return [self._vocab.decode([token], special=True) for token in ids]
