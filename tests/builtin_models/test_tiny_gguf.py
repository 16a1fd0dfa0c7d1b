"""The tiny GGUF files: deterministic, cached, and read by the real llama.cpp tokenizers."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from lmpress.builtin_models.tiny_gguf import SPECS, resolve_gguf_name, tiny_gguf
from lmpress.vocabulary.errors import ModelLoadError
from tests.conftest import REPO

TEXT = "Hello the quick cat, naïve café 東京 ☀ runs."


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def vocab_only(request):
    from llama_cpp import Llama

    llm = Llama(model_path=str(tiny_gguf(request.param)), vocab_only=True, verbose=False)
    yield request.param, llm
    llm.close()


def test_text_round_trips_through_llama_cpp_tokenizers(vocab_only):
    tokenizer, llm = vocab_only
    ids = llm.tokenize(TEXT.encode(), add_bos=False, special=False)
    assert 1 < len(ids) < len(TEXT.encode())  # pieces, not one token per byte
    text = llm.detokenize(ids).decode("utf-8")
    # SentencePiece marks the start of the text as a word start, with a space.
    assert text == (" " + TEXT if tokenizer == "llama" else TEXT)


def test_chat_control_tokens_are_single_tokens(vocab_only):
    tokenizer, llm = vocab_only
    control = "<s>" if tokenizer == "llama" else "<|im_start|>"
    ids = llm.tokenize(control.encode(), add_bos=False, special=True)
    assert len(ids) == 1
    assert llm.detokenize(ids, special=True).decode() == control


def test_builds_are_deterministic_and_cached(tmp_path):
    first = tiny_gguf("gpt2", cache_dir=tmp_path / "a")
    second = tiny_gguf("gpt2", cache_dir=tmp_path / "b")
    assert first.read_bytes() == second.read_bytes()
    built_at = first.stat().st_mtime_ns
    assert tiny_gguf("gpt2", cache_dir=tmp_path / "a") == first
    assert first.stat().st_mtime_ns == built_at  # not rebuilt
    assert first.stat().st_mode & stat.S_IROTH  # a model file, readable like one
    assert [p.name for p in first.parent.iterdir()] == [first.name]  # no scratch left behind


def test_names_resolve():
    assert resolve_gguf_name("tiny-gguf:llama") == str(tiny_gguf("llama"))
    assert resolve_gguf_name("./model.gguf") == "./model.gguf"
    with pytest.raises(ModelLoadError, match="unknown tiny GGUF model 'nope'"):
        resolve_gguf_name("tiny-gguf:nope")


def matrix_parameters(spec) -> int:
    head_dim = spec.hidden // spec.heads
    attention = 2 * spec.hidden * (spec.heads + spec.kv_heads) * head_dim
    return spec.vocab_size * spec.hidden + spec.layers * (
        attention + 3 * spec.hidden * spec.intermediate
    )


def test_benchmark_model_has_about_100m_parameters():
    import gguf

    for name in ("llama", "gpt2"):  # the count below is what the builder writes
        reader = gguf.GGUFReader(str(tiny_gguf(name)))
        written = sum(
            int(t.n_elements) for t in reader.tensors if not t.name.endswith("norm.weight")
        )
        assert written == matrix_parameters(SPECS[name])
    assert 90e6 < matrix_parameters(SPECS["bench-100m"]) < 110e6


def test_command_prints_the_path(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "lmpress.builtin_models.tiny_gguf", "llama"],
        capture_output=True, text=True, check=True, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), "LMPRESS_CACHE": str(tmp_path)},
    )  # fmt: skip
    path = out.stdout.strip()
    assert path.startswith(str(tmp_path)) and path.endswith(".gguf")
    assert Path(path).read_bytes()[:4] == b"GGUF"
