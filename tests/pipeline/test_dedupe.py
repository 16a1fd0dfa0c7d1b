"""A dedupe step's decisions as the pipeline's rejects file shows them: which rows are dropped,
and the reason naming the kept row; the settings refused in one line before any work."""

from __future__ import annotations

import asyncio
import tracemalloc
from collections.abc import AsyncIterator

import numpy as np
import pytest

from lmpress.pipeline.dedupe import build_deduplicator
from lmpress.vocabulary.errors import ConfigError


def key(i: int) -> str:
    return f"{i:09d}"


def decide(dedupe, rows: list[dict]) -> list[str | None]:
    """Each row's reason (None: kept), fed in key order as the dedupe step's barrier does."""

    async def run() -> list[str | None]:
        return [await dedupe.duplicate_of(key(i), row) for i, row in enumerate(rows)]

    return asyncio.run(run())


def decide_all(dedupe, rows: list[dict]) -> list[tuple[str, str | None]]:
    async def items() -> AsyncIterator[tuple[str, dict]]:
        for i, row in enumerate(rows):
            yield key(i), row

    async def run() -> list[tuple[str, str | None]]:
        return [decided async for decided in dedupe.decide_all(items())]

    return asyncio.run(run())


# exact


def test_exact_drops_a_repeat_that_differs_in_case_and_spacing_naming_the_first():
    rows = [{"text": "Hello  World"}, {"text": "other"}, {"text": " hello world\n"}]
    assert decide(build_deduplicator({"method": "exact"}), rows) == [
        None, None, "duplicate of 000000000 (exact match)",
    ]  # fmt: skip
    # Without normalisation the three are different texts.
    assert decide(build_deduplicator({"method": "exact", "normalize": False}), rows) == [None] * 3


def test_exact_compares_the_chosen_columns_each_apart():
    dedupe = build_deduplicator({"method": "exact", "columns": ["a", "b"]})
    rows = [
        {"a": "ab", "b": "c", "id": 1},
        {"a": "a", "b": "bc", "id": 2},  # the same letters, split elsewhere
        {"a": "AB", "b": "c", "id": 3},  # a column not chosen differs
        {"a": "ab", "b": None},
        {"a": "ab"},  # a missing column counts as null
        {"a": "ab", "b": 7},
        {"a": "ab", "b": "7"},  # a number and its digits differ
    ]
    assert decide(dedupe, rows) == [
        None, None, "duplicate of 000000000 (exact match)", None,
        "duplicate of 000000003 (exact match)", None, None,
    ]  # fmt: skip


def test_exact_without_columns_reads_every_string_column_whatever_their_order():
    rows = [
        {"q": "What is 2+2?", "a": "4", "score": 1},
        {"a": "4", "q": "what is 2+2?", "score": 2},  # other order, another number
        {"q": "What is 2+2?", "a": "four"},
        {"q": "4", "a": "What is 2+2?"},  # the values in each other's columns
    ]
    assert decide(build_deduplicator({"method": "exact"}), rows) == [
        None, "duplicate of 000000000 (exact match)", None, None,
    ]  # fmt: skip


def test_exact_finds_a_repeat_of_any_earlier_row_among_many():
    # 30,000 rows: the kept digests move from the recent dict into the sorted arrays many times.
    n = 30_000
    rows = [{"text": f"row {i}"} for i in range(n)]
    repeats = [{"text": f"ROW {i}"} for i in (0, 1, 4095, 4096, 17_000, n - 1)]
    decided = decide_all(build_deduplicator({"method": "exact"}), rows + repeats + rows[:2])
    assert [reason for _, reason in decided[:n]] == [None] * n
    assert [reason for _, reason in decided[n:]] == [
        f"duplicate of {key(i)} (exact match)" for i in (0, 1, 4095, 4096, 17_000, n - 1, 0, 1)
    ]


def test_exact_keeps_about_30_bytes_a_kept_row():
    n = 20_000  # 100,000 rows held 28.8 bytes a row (57 at the peak of a merge)
    rows = [(key(i), {"text": f"generated answer number {i}"}) for i in range(n)]
    dedupe = build_deduplicator({"method": "exact", "columns": ["text"]})

    async def run() -> None:
        for k, row in rows:
            assert await dedupe.duplicate_of(k, row) is None

    tracemalloc.start()
    try:
        asyncio.run(run())
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    # 16 digest bytes and 9 key bytes a row in arrays, plus the recent dict (at most a 16th of
    # the rows, ~140 bytes each); a dict of digests to keys would hold over 150.
    assert held / n < 40, f"{held / n:.1f} bytes a row"


# minhash

SENTENCES = [
    "the quick brown fox jumps over the lazy dog near the river bank this morning",
    "The quick brown fox jumps over the lazy dog near the river bank this morning!",
    "a completely different sentence about interest rates and the price of bonds",
    "the quick brown fox leaps over the lazy dog near the river bank this morning",
    "interest rates rose again and bond prices fell for the third week in a row",
]


def test_minhash_drops_near_duplicate_sentences_and_keeps_different_ones():
    settings = {"method": "minhash", "columns": ["text"], "threshold": 0.5, "seed": 7}
    rows = [{"text": text} for text in SENTENCES]
    reasons = decide(build_deduplicator(settings), rows)
    assert [r is None for r in reasons] == [True, False, True, False, True]
    assert reasons[1].startswith("near-duplicate of 000000000 (minhash jaccard ~")
    assert reasons[1].endswith(" >= 0.5)")
    assert reasons[3].startswith("near-duplicate of 000000000 ")
    assert decide(build_deduplicator(settings), rows) == reasons  # the same seed, the same run


def test_minhash_reports_datasketchs_own_estimate():
    from datasketch import MinHash

    settings = {"method": "minhash", "threshold": 0.3, "shingle": "chars", "shingle_size": 4}
    dedupe = build_deduplicator(settings)
    first, second = SENTENCES[0], SENTENCES[3]
    reasons = decide(dedupe, [{"text": first}, {"text": second}])

    def signature(text: str) -> MinHash:
        grams = {text[i : i + 4] for i in range(len(text) - 3)}
        minhash = MinHash(num_perm=128, seed=1)
        for gram in grams:
            minhash.update(gram.encode())
        return minhash

    expected = signature(first).jaccard(signature(second))
    assert 0.3 <= expected < 1
    assert reasons == [
        None,
        f"near-duplicate of 000000000 (minhash jaccard ~{expected:.2f} >= 0.3)",
    ]


# embedding

TABLE = {  # a fixed embedding: "a" and "a2" at cosine 0.98, "b" and "b2" at 0.8
    "a": [1.0, 0.0, 0.0],
    "a2": [0.98, 0.199, 0.0],
    "b": [0.0, 2.0, 0.0],  # not unit length: the deduplicator normalises
    "b2": [0.0, 0.8, 0.6],
    "c": [0.0, 0.0, 1.0],
}


def table_embed(calls: list[int]):
    async def embed(texts: list[str]) -> np.ndarray:
        calls.append(len(texts))
        return np.array([TABLE[t] for t in texts], dtype=np.float32)

    return embed


def test_embedding_drops_rows_at_or_above_the_cosine_naming_the_closest_kept():
    texts = ["a", "b", "a2", "c", "b2", "a", "c"]
    settings = {"method": "embedding", "columns": ["t"], "threshold": 0.9, "batch_size": 3}
    calls: list[int] = []
    decided = decide_all(
        build_deduplicator(settings, table_embed(calls)), [{"t": t} for t in texts]
    )
    assert decided == [
        (key(0), None),
        (key(1), None),
        (key(2), "near-duplicate of 000000000 (cosine 0.980 >= 0.9)"),  # within its batch
        (key(3), None),
        (key(4), None),  # 0.8 to "b": kept
        (key(5), "near-duplicate of 000000000 (cosine 1.000 >= 0.9)"),  # an earlier batch
        (key(6), "near-duplicate of 000000003 (cosine 1.000 >= 0.9)"),
    ]
    assert calls == [3, 3, 1]  # three rows a call
    # One row at a time decides the same.
    one_by_one = build_deduplicator(settings, table_embed([]))
    assert decide(one_by_one, [{"t": t} for t in texts]) == [reason for _, reason in decided]


@pytest.fixture(scope="module")
def minilm():  # all-MiniLM-L6-v2, a real sentence-transformers model, on NATIVE
    from lmpress import LLM

    llm = LLM("minilm", task="embed")
    yield llm
    llm.close()


@pytest.mark.slow
def test_embedding_with_minilm_drops_paraphrases_and_keeps_other_topics(minilm):
    from lmpress.vocabulary.embeddings import EmbedRequest

    async def embed(texts: list[str]) -> np.ndarray:
        result = await minilm.engine.embed(EmbedRequest("dedupe", texts))
        return np.stack([np.asarray(e.vector, dtype=np.float32) for e in result.embeddings])

    texts = [
        "The cat sat on the mat.",
        "Stock markets fell sharply today.",
        "A cat was sitting on the mat.",  # 0.95 to the first
        "Shares dropped steeply on the exchange today.",  # 0.65 to the second: another row
        "How do I bake sourdough bread?",
        "What is the recipe for sourdough bread?",  # 0.85 to the one before
        "The weather in Paris is sunny.",
    ]
    settings = {"method": "embedding", "threshold": 0.8, "batch_size": 4}
    reasons = [
        r for _, r in decide_all(build_deduplicator(settings, embed), [{"text": t} for t in texts])
    ]
    assert [r is None for r in reasons] == [True, True, False, True, True, False, True]
    assert reasons[2].startswith("near-duplicate of 000000000 (cosine 0.9")
    assert reasons[5].startswith("near-duplicate of 000000004 (cosine 0.8")


# settings


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (
            {"method": "exact", "treshold": 0.9},
            "unknown key 'treshold' (did you mean 'threshold'?)",
        ),
        ({"method": "exact", "threshold": 0.9}, "'threshold' does not apply to method exact"),
        ({"method": "fuzzy"}, "'method': Input should be 'exact', 'minhash' or 'embedding'"),
        ({"columns": ["text"]}, "'method' is required (one of: exact, minhash, embedding)"),
        (
            {"method": "minhash", "threshold": 1.5},
            "'threshold': Input should be less than or equal to 1",
        ),
        ({"method": "minhash", "num_perm": "64"}, "'num_perm': Input should be a valid integer"),
        (
            {"method": "minhash", "threshold": 0.99},
            "'threshold' 0.99 is too high for 'num_perm' 128 (MinHash LSH needs 2 bands or more)",
        ),
        ({"method": "exact", "columns": "text"}, "'columns': Input should be a valid list"),
        ({"method": "embedding"}, "method embedding needs an embedding model"),
    ],
)
def test_bad_settings_are_one_line_naming_the_step_and_the_key(settings, message):
    with pytest.raises(ConfigError) as raised:
        build_deduplicator(settings, where="pipe.yaml: step 'dedupe'")
    text = str(raised.value)
    assert text.startswith(f"pipe.yaml: step 'dedupe': {message}")
    assert "\n" not in text


def test_without_where_the_line_starts_at_the_key_for_the_caller_to_place():
    with pytest.raises(ConfigError, match="^method exact takes no embedding model$"):
        build_deduplicator({"method": "exact"}, table_embed([]))
    with pytest.raises(ConfigError, match="^'num_perm' does not apply to method embedding$"):
        build_deduplicator({"method": "embedding", "num_perm": 64}, table_embed([]))
