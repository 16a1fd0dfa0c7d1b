"""NATIVE's pooling tasks on real weights: MiniLM's vectors against sentence-transformers' own
`encode`, the tiny cross-encoder's scores against transformers' own logits, and what a request
or a run that cannot be answered is told."""

from __future__ import annotations

import asyncio
import random

import numpy as np
import pytest

from lmpress import LLM
from lmpress.builtin_models.packaged import resolve_packaged_name
from lmpress.builtin_models.tiny import WORDS, tiny_model
from lmpress.configs import load_config
from lmpress.engines.local.native import embedding
from lmpress.engines.registry import create_engine
from lmpress.vocabulary.embeddings import EmbedRequest, ScoreRequest
from lmpress.vocabulary.errors import ErrorKind, UnsupportedParamError
from lmpress.vocabulary.types import GenerationParams, Message, Request

MINILM_LIMIT = 256  # sentence_bert_config.json's max_seq_length


def mixed_texts(n: int, seed: int = 0) -> list[str]:
    """Texts from empty to ~10 KB, deterministic."""
    rng = random.Random(seed)
    texts = ["", "a", "Ünïcode café 東京 ☀"]
    while len(texts) < n:
        words = rng.choice([1, 3, 8, 20, 40]) if len(texts) % 40 else 1900
        texts.append(" ".join(rng.choice(WORDS) for _ in range(words)))
    return texts


def make(model: str, task: str, **overrides):
    return create_engine(
        load_config(
            overrides={"model.model_name": model, "task": task, **overrides}, engine="NATIVE"
        )  # fmt: skip
    )


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


@pytest.fixture(scope="module")
def sentence_transformer():
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(resolve_packaged_name("minilm"), device="cpu")


@pytest.fixture(scope="module")
def minilm():
    llm = LLM("minilm", task="embed", batch_size=32)
    yield llm
    llm.close()


def embed(engine, inputs, **fields):
    return asyncio.run(engine.embed(EmbedRequest("r", inputs, **fields)))


def test_minilm_vectors_equal_sentence_transformers(minilm, sentence_transformer):
    texts = mixed_texts(200)
    assert max(len(t.encode()) for t in texts) > 10000
    vectors = minilm.embed(texts)
    reference = sentence_transformer.encode(texts, batch_size=32)
    assert vectors.dtype == np.float32 and vectors.shape == (200, 384)
    assert cosines(vectors, reference).min() >= 0.9999

    texts = texts[:45]  # the first two ~10 KB texts among them
    result = embed(minilm.engine, texts)
    lengths = [len(ids) for ids in sentence_transformer.tokenizer(texts)["input_ids"]]
    assert [e.truncated for e in result.embeddings] == [n > MINILM_LIMIT for n in lengths]
    assert any(e.truncated for e in result.embeddings)
    assert [e.prompt_tokens for e in result.embeddings] == [min(n, MINILM_LIMIT) for n in lengths]
    assert result.usage.prompt_tokens == sum(min(n, MINILM_LIMIT) for n in lengths)
    assert result.embeddings[0].prompt_tokens == 2  # the empty text: [CLS] [SEP]


def test_token_id_inputs_give_the_texts_vectors(minilm, sentence_transformer):
    texts = ["the quick red fox", "why is the sky blue"]
    ids = sentence_transformer.tokenizer(texts)["input_ids"]
    by_ids = embed(minilm.engine, ids)
    by_text = embed(minilm.engine, texts)
    for a, b in zip(by_ids.embeddings, by_text.embeddings, strict=True):
        np.testing.assert_allclose(a.vector, b.vector, atol=1e-5)


def test_dimensions_are_refused_on_a_model_not_trained_for_them(minilm):
    result = embed(minilm.engine, ["a cat"], dimensions=128)
    assert result.error.kind == ErrorKind.UNSUPPORTED_PARAM
    assert "dimensions: 128" in result.error.message and "\n" not in result.error.message
    assert embed(minilm.engine, ["a cat"], dimensions=384).embeddings[0].vector.shape == (384,)


@pytest.mark.parametrize(
    ("inputs", "says"),
    [
        ([], "input is empty"),
        ([[1, 2], [99999]], "input 1: 99999 is not a token id"),
        (["a text", [101, 102]], "input 0: neither a text nor a list of token ids"),
    ],
)
def test_a_bad_request_fails_alone_in_one_line(minilm, inputs, says):
    result = embed(minilm.engine, inputs)
    assert result.error.kind == ErrorKind.INVALID_REQUEST and says in result.error.message
    assert embed(minilm.engine, ["still answers"]).error is None


def test_matryoshka_cut_and_normalize_match_sentence_transformers(sentence_transformer):
    texts = mixed_texts(20, seed=1)
    engine = make("minilm", "embed", **{"model.model_kwargs": {"matryoshka_dims": [128, 256]}})
    try:
        cut = np.stack([e.vector for e in embed(engine, texts, dimensions=128).embeddings])
        unit = embed(engine, texts, dimensions=128, normalize=True).embeddings
        refused = embed(engine, texts, dimensions=100)
    finally:
        asyncio.run(engine.aclose())
    whole = sentence_transformer.encode(texts)
    np.testing.assert_allclose(cut, whole[:, :128], atol=1e-5)
    assert np.linalg.norm(cut, axis=1).max() < 0.99  # a cut unit vector is no longer one
    reference = sentence_transformer.encode(texts, truncate_dim=128, normalize_embeddings=True)
    np.testing.assert_allclose(np.stack([e.vector for e in unit]), reference, atol=1e-5)
    assert "can be cut to 128, 256" in refused.error.message


def test_batches_are_sorted_by_length_and_capped(minilm, monkeypatch):
    engine = minilm.engine
    seen: list[list[int]] = []
    forward = engine.encoder.forward

    def recording(rows):
        seen.append([len(row.ids) for row in rows])
        return forward(rows)

    monkeypatch.setattr(engine.encoder, "forward", recording)
    monkeypatch.setattr(embedding, "BATCH_TOKENS", 2048)
    texts = mixed_texts(60, seed=2)
    together = embed(engine, texts)  # all its rows wait at once
    lengths = [e.prompt_tokens for e in together.embeddings]
    assert sorted(n for batch in seen for n in batch) == sorted(lengths)
    assert all(len(batch) <= 32 and len(batch) * max(batch) <= 2048 for batch in seen)
    assert all(max(batch) <= 2 * min(batch) for batch in seen)  # no row padded past twice
    # Rows of like length share a batch: against the same batch sizes taken in the given
    # order, less than half the padded tokens.
    in_order, start = 0, 0
    for batch in seen:
        in_order += len(batch) * max(lengths[start : start + len(batch)])
        start += len(batch)
    assert sum(len(batch) * max(batch) for batch in seen) < 0.5 * in_order

    async def apart():  # one request per text, all in flight together
        return await asyncio.gather(*(engine.embed(EmbedRequest(str(i), [t]))
                                      for i, t in enumerate(texts)))  # fmt: skip

    vectors = [result.embeddings[0].vector for result in asyncio.run(apart())]
    # Which requests share a batch here depends on when each reached the queue, so the padding
    # and the matmuls' summing order differ from `together`'s: for MiniLM's float32 (n <= 1536
    # terms, ~36 chained matmuls) about 36*sqrt(1536)*2**-24 = 8e-5 of activations of order 1,
    # and its unit vectors' entries (~0.05) move about 5e-6; 1e-4 leaves room, where another
    # text's vector differs by 1e-2 or more.
    np.testing.assert_allclose(vectors, [e.vector for e in together.embeddings], atol=1e-4)


def test_generation_on_an_embedding_run_is_refused(minilm):
    request = Request("g", [Message("user", "hi")], GenerationParams())
    result = asyncio.run(minilm.engine.complete(request))
    assert result.error.kind == ErrorKind.UNSUPPORTED_PARAM
    assert "loaded for embed, not generate" in result.error.message


def test_cross_encoder_scores_equal_transformers_logits():
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    directory = tiny_model("cross-encoder")
    query = "why is the sky blue"
    documents = ["the sky is blue because of the sun", "", "cat dog " * 400, "Ünïcode café"]
    tokenizer = AutoTokenizer.from_pretrained(directory)
    model = AutoModelForSequenceClassification.from_pretrained(directory).eval()
    pairs = tokenizer([query] * 4, documents, padding=True, truncation=True, return_tensors="pt")
    with torch.no_grad():
        logits = model(**pairs).logits[:, 0].tolist()
    assert pairs["token_type_ids"].sum() > 0  # the documents are read as the second segment

    firsts = ["the sun", "why", "a cat", "what"]  # pairwise: firsts[i] with documents[i]
    pairs = tokenizer(firsts, documents, padding=True, truncation=True, return_tensors="pt")
    with torch.no_grad():
        pairwise_logits = model(**pairs).logits[:, 0].tolist()

    llm = LLM("tiny:cross-encoder", task="rerank")
    try:
        scores = llm.score(query, documents)
        pairwise = llm.score(firsts, documents)
        with pytest.raises(ValueError, match="^3 queries for 4 documents"):
            llm.score(firsts[:3], documents)
        with pytest.raises(RuntimeError, match="is a cross-encoder: it scores pairs"):
            llm.embed("a text")
    finally:
        llm.close()
    np.testing.assert_allclose(scores, logits, atol=1e-5)
    np.testing.assert_allclose(pairwise, pairwise_logits, atol=1e-5)


def test_an_embedding_model_scores_by_cosine(sentence_transformer):
    query, documents = "a cat", ["a kitten", "the stock market", ""]
    firsts = ["a dog", "shares and bonds", "a cat"]  # /v1/score's pairwise form
    engine = make("minilm", "score")
    try:
        result = asyncio.run(engine.score(ScoreRequest("s", query, documents)))
        pairwise = asyncio.run(engine.score(ScoreRequest("p", firsts, documents)))
    finally:
        asyncio.run(engine.aclose())
    vectors = sentence_transformer.encode([query, *documents])
    expected = cosines(vectors[1:], np.repeat(vectors[:1], 3, axis=0))
    np.testing.assert_allclose(result.scores, expected, atol=1e-5)
    assert result.scores[0] > result.scores[1]
    expected = cosines(vectors[1:], sentence_transformer.encode(firsts))
    np.testing.assert_allclose(pairwise.scores, expected, atol=1e-5)


def test_a_cross_encoder_cannot_embed():
    with pytest.raises(UnsupportedParamError) as refused:
        make("tiny:cross-encoder", "embed")
    message = str(refused.value)
    assert message.startswith("task: embed: model 'tiny:cross-encoder' is a cross-encoder")
    assert "\n" not in message


def test_a_plain_directory_embeds_by_mean_pooling():
    import torch
    from transformers import AutoModel, AutoTokenizer

    directory = tiny_model("llama")  # no sentence-transformers files: mean, no norm
    texts = ["the quick red fox", "why", "a longer text about rivers and the sea"]
    tokenizer = AutoTokenizer.from_pretrained(directory)
    model = AutoModel.from_pretrained(directory).eval()
    expected = []
    for text in texts:  # one at a time: no padding to account for
        ids = tokenizer(text, return_tensors="pt")
        with torch.no_grad():
            expected.append(model(**ids).last_hidden_state[0].mean(dim=0).numpy())
    engine = make("tiny:llama", "embed")
    try:
        result = embed(engine, texts)
    finally:
        asyncio.run(engine.aclose())
    np.testing.assert_allclose([e.vector for e in result.embeddings], expected, atol=1e-4)
