"""LLAMACPP's embeddings and rank pooling on the tiny BERT GGUFs, against llama-cpp-python's
own `embed` and, for the reranker, transformers' BERT run on the same weights."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from lmpress.builtin_models.tiny_gguf import tiny_gguf
from lmpress.builtin_models.tiny_gguf_bert import BERTS, CLS, SEP, hf_state_dict, wordpiece_vocab
from lmpress.configs import load_config
from lmpress.engines.registry import create_engine
from lmpress.vocabulary.embeddings import EmbedRequest, ScoreRequest
from lmpress.vocabulary.errors import ConfigError, ErrorKind, UnsupportedParamError
from lmpress.vocabulary.types import Message, Request

CONTEXT = BERTS["bert"].context
TEXTS = [
    "the quick cat",
    "",
    "every small bird sings to the dog " * 30,  # past the 128-token context: cut there
    "a red fish!",
    "Blue, green; and dark?",
    *[f"the {w} dog runs" for w in ("happy", "quiet", "loud", "slow", "large")],
    "unknown zebra-words ü",
]


def make(name: str, task: str, **model_kwargs):
    overrides = {"engine": "LLAMACPP", "model.model_name": str(tiny_gguf(name)), "task": task}
    if model_kwargs:
        overrides["model.model_kwargs"] = model_kwargs
    return create_engine(load_config(overrides=overrides))


@pytest.fixture(scope="module")
def embedder():
    engine = make("bert", "embed")
    yield engine
    asyncio.run(engine.aclose())


@pytest.fixture(scope="module")
def reranker():
    engine = make("bert-rerank", "rerank")
    yield engine
    asyncio.run(engine.aclose())


@pytest.fixture(scope="module")
def reference():
    """llama-cpp-python's own embedding mode on the same file, its batch the model's context
    (its `embed` cuts inputs at the batch, as lmpress cuts them at the context)."""
    from llama_cpp import Llama

    llama = Llama(
        str(tiny_gguf("bert")), embedding=True, n_batch=CONTEXT, n_ubatch=CONTEXT, verbose=False
    )
    yield llama
    llama.close()


def cosine(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def test_vectors_equal_llama_cpp_python_and_transformers(embedder, reference, tmp_path):
    async def both():  # two requests at once: their inputs share the worker's batches
        return await asyncio.gather(
            embedder.embed(EmbedRequest("a", TEXTS[:6])),
            embedder.embed(EmbedRequest("b", TEXTS[6:])),
        )

    first, second = asyncio.run(both())
    assert first.error is None and second.error is None
    got = first.embeddings + second.embeddings
    assert [len(e.vector) for e in got] == [64] * len(TEXTS)
    # llama-cpp-python's own embed, on every text it reads whole (it cuts a long one bluntly)
    for i, expected in enumerate(reference.embed(TEXTS)):
        if i != 2:
            assert np.allclose(got[i].vector, expected, rtol=1e-4, atol=1e-4), TEXTS[i]
    # transformers' BERT on the same weights and vocabulary, mean-pooled: every text, the long
    # one cut at the 128-token context with its [SEP] kept, as its tokenizer cuts
    want, counts = transformers_embeddings(TEXTS, tmp_path)
    for text, embedding, expected in zip(TEXTS, got, want, strict=True):
        assert cosine(embedding.vector, expected) >= 0.9999, text[:40]
        assert np.allclose(embedding.vector, expected, atol=5e-3), text[:40]
    assert [e.prompt_tokens for e in got] == counts and counts[2] == CONTEXT
    assert [e.truncated for e in got] == [i == 2 for i in range(len(TEXTS))]
    assert first.usage.prompt_tokens == sum(counts[:6])
    assert (first.engine, first.request_id) == ("LLAMACPP", "a")


def transformers_bert():
    """transformers' BertForSequenceClassification on the tiny GGUFs' weights: llama.cpp reads
    every token as sentence A (token type 0) and BERT's GELU as its tanh form."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    spec = BERTS["bert-rerank"]
    config = BertConfig(
        vocab_size=len(wordpiece_vocab()), hidden_size=spec.hidden, num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads, intermediate_size=spec.intermediate,
        max_position_embeddings=spec.context, layer_norm_eps=1e-12, num_labels=1,
        hidden_act="gelu_pytorch_tanh",
    )  # fmt: skip
    model = BertForSequenceClassification(config).eval()
    weights = {k: torch.from_numpy(v) for k, v in hf_state_dict(spec).items()}
    model.load_state_dict(weights, strict=False)
    return model


def transformers_embeddings(texts: list[str], tmp_path) -> tuple[list, list[int]]:
    """Mean-pooled vectors from transformers, the texts tokenized by its BertTokenizer over the
    same WordPiece vocabulary; and their token counts."""
    import torch
    from transformers import BertTokenizer

    vocab_file = tmp_path / "vocab.txt"
    vocab_file.write_text("\n".join(wordpiece_vocab()) + "\n")
    tokenizer = BertTokenizer(str(vocab_file), do_lower_case=True)
    model = transformers_bert()
    vectors, counts = [], []
    for text in texts:
        ids = tokenizer(text, truncation=True, max_length=CONTEXT)["input_ids"]
        with torch.no_grad():
            hidden = model.bert(torch.tensor([ids])).last_hidden_state[0]
        vectors.append(hidden.mean(0).numpy())
        counts.append(len(ids))
    return vectors, counts


def test_normalize_token_ids_and_refused_dimensions(embedder, reference):
    ids = reference.tokenize(b"the quick cat")
    result = asyncio.run(embedder.embed(EmbedRequest("n", [ids, "a red fish!"], normalize=True)))
    assert result.error is None
    assert [float(np.linalg.norm(e.vector)) for e in result.embeddings] == pytest.approx([1, 1])
    assert cosine(result.embeddings[0].vector, reference.embed("the quick cat")) >= 0.9999

    refused = asyncio.run(embedder.embed(EmbedRequest("d", ["the cat"], dimensions=16)))
    assert refused.error.kind == ErrorKind.INVALID_REQUEST and refused.embeddings == []
    assert "dimensions: 16" in refused.error.message
    bad = asyncio.run(embedder.embed(EmbedRequest("t", [[5, 10_000]])))
    assert "token 10000 is not a token id" in bad.error.message


def transformers_scores(pairs: list[list[int]]) -> list[float]:
    import torch

    model = transformers_bert()
    with torch.no_grad():
        return [float(model(torch.tensor([ids])).logits[0, 0]) for ids in pairs]


def test_rerank_scores_equal_transformers_on_llama_servers_pair_format(reranker, reference):
    query, documents = "the quick cat", ["a quick cat runs", "the dog", "blue fish sings", ""]
    result = asyncio.run(reranker.score(ScoreRequest("r", query, documents)))
    assert result.error is None

    def ids(text: str) -> list[int]:
        return reference.tokenize(text.encode(), add_bos=False)

    # llama-server's rerank pair for a BERT vocabulary: [CLS] query [SEP] document.
    pairs = [[CLS, *ids(query), SEP, *ids(document)] for document in documents]
    want = transformers_scores(pairs)
    assert result.scores == pytest.approx(want, rel=1e-3, abs=1e-3)
    assert np.argsort(result.scores).tolist() == np.argsort(want).tolist()
    assert result.usage.prompt_tokens == sum(len(p) for p in pairs)

    firsts = ["a dog", "the dog", "fish", "the quick cat"]  # /v1/score's pairwise form
    pairwise = asyncio.run(reranker.score(ScoreRequest("p", firsts, documents)))
    pairs = [[CLS, *ids(q), SEP, *ids(d)] for q, d in zip(firsts, documents, strict=True)]
    assert pairwise.scores == pytest.approx(transformers_scores(pairs), rel=1e-3, abs=1e-3)


@pytest.mark.parametrize(
    ("name", "task", "message"),
    [
        ("bert-rerank", "embed", "pools with rank"),
        ("bert", "rerank", "task: rerank needs a reranker GGUF (rank pooling)"),
        ("llama", "embed", "pools with none"),
    ],
)
def test_a_model_whose_pooling_does_not_fit_the_task_is_refused(name, task, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        make(name, task)


def test_pooling_type_override_and_calls_outside_the_task(embedder):
    from llama_cpp import Llama

    cls = make("bert", "embed", pooling_type=2)  # llama.cpp's CLS pooling over the GGUF's mean
    own = Llama(str(tiny_gguf("bert")), embedding=True, pooling_type=2, verbose=False)
    try:
        got = asyncio.run(cls.embed(EmbedRequest("c", TEXTS[:2])))
        mean = asyncio.run(embedder.embed(EmbedRequest("m", TEXTS[:2])))
        for vector, expected, pooled in zip(
            [e.vector for e in got.embeddings], own.embed(TEXTS[:2]), mean.embeddings, strict=True
        ):
            assert cosine(vector, expected) >= 0.9999
            assert not np.allclose(vector, pooled.vector, atol=1e-2)  # not the default mean
    finally:
        asyncio.run(cls.aclose())
        own.close()
    with pytest.raises(UnsupportedParamError, match="started for task embed"):
        asyncio.run(embedder.score(ScoreRequest("s", "q", ["d"])))
    generated = asyncio.run(embedder.complete(Request("g", [Message("user", "hi")])))
    assert "started for task embed: generate needs" in generated.error.message
