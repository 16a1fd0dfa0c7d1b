"""The offline tiny models load through the ordinary transformers loaders."""

from __future__ import annotations

import pytest

from lmpress.builtin_models.tiny import resolve_model_name, tiny_model
from lmpress.vocabulary.errors import ModelLoadError


def test_tiny_models_are_cached_and_loadable(tiny_llama, tiny_gpt2):
    from transformers import AutoConfig, AutoTokenizer

    assert tiny_model("llama") == tiny_model("llama")
    assert AutoConfig.from_pretrained(tiny_llama).model_type == "llama"
    assert AutoConfig.from_pretrained(tiny_gpt2).model_type == "gpt2"
    for path in (tiny_llama, tiny_gpt2):
        tok = AutoTokenizer.from_pretrained(path)
        text = tok.apply_chat_template(
            [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
        )
        assert "hi" in text
        assert (
            tok.decode(tok("naïve café 東京")["input_ids"], skip_special_tokens=True).strip()
            == "naïve café 東京"
        )


def test_tiny_names_resolve():
    assert resolve_model_name("tiny:llama") == str(tiny_model("llama"))
    assert resolve_model_name("org/model") == "org/model"
    with pytest.raises(ModelLoadError, match="unknown tiny model 'nope'"):
        resolve_model_name("tiny:nope")
