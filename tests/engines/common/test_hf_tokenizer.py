"""The engine contract's Tokenizer over a transformers tokenizer, on the tiny models' two kinds:
byte-level BPE (Llama's here, GPT-2's and SmolLM2's alike) and a SentencePiece-family Unigram,
whose decoder drops the space that starts a text."""

from __future__ import annotations

import pytest

from lmpress.engines.common.hf_tokenizer import HfTokenizer

TEXTS = ["Hello world, the dog sleeps.", " leading space and  two", "line one\nline two"]


@pytest.fixture(scope="module", params=["tiny_llama", "tiny_gpt2"])
def tokenizer(request):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(request.getfixturevalue(request.param))
    return HfTokenizer(hf, 512)


@pytest.mark.parametrize("text", TEXTS)
def test_pieces_join_into_the_decoded_text(tokenizer, text):
    ids = tokenizer.encode(text)
    pieces = tokenizer.pieces(ids)
    assert len(pieces) == len(ids)
    assert "".join(pieces) == tokenizer.decode(ids)


def test_a_word_after_another_keeps_its_leading_space(tokenizer):
    ids = tokenizer.encode("big world")
    pieces = tokenizer.pieces(ids)
    assert " " in "".join(pieces[1:])  # the space before "world" is in a piece of its own token
    assert tokenizer.piece(ids[-1]) == pieces[-1]


def test_special_tokens_are_added_only_when_asked(tokenizer):
    hf = tokenizer._tokenizer
    assert tokenizer.encode("abc") == hf("abc", add_special_tokens=False)["input_ids"]
    assert tokenizer.encode("abc", special=True) == hf("abc")["input_ids"]
    assert (tokenizer.bos_id, tokenizer.eos_id) == (hf.bos_token_id, hf.eos_token_id)
    assert tokenizer.decode([hf.eos_token_id]) == hf.eos_token  # special tokens kept
    assert tokenizer.context_length == 512
