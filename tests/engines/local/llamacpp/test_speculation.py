"""LLAMACPP with `model.speculative_method: ngram`, and with a draft model, against the same
engine with speculation off, on SmolLM2-135M-Instruct: the same text, greedy and seeded, at
batch 16, with drafts kept (read from the scheduler's counts, so these fail if speculation
never ran); and how a step is shaped over llama.cpp's split of a batch
(lmpress/engines/local/llamacpp/speculation.py)."""

from __future__ import annotations

import asyncio
from itertools import pairwise

import pytest

from lmpress.builtin_models.packaged import SMOLLM2, SMOLLM2_Q4_1, resolve_packaged_name
from lmpress.builtin_models.tiny_gguf import tiny_gguf
from lmpress.configs import load_config
from lmpress.engines.local.llamacpp.rows import LlamaCppSubmission, SequenceRow
from lmpress.engines.local.llamacpp.speculation import Candidate, micro_batches, plan
from lmpress.engines.registry import create_engine
from lmpress.vocabulary.errors import ConfigError
from lmpress.vocabulary.types import GenerationParams, Message, Request
from tests.engines.local.test_real_weights import QUESTIONS
from tests.engines.local.test_reference_equality import MIXED

PARAGRAPHS = [
    "Teh comittee met on Tusday in Bostn to discus the anual budgte. Mrs Hannah Lee presentd "
    "the figures, wich showed a payment of 4,200 dolars to the contracter. Evryone agreed to "
    "revew the plan next wek, and the ofice in Boston will send a full reprot.",
    "On March 11 the group travelled to Lisbon to visit the new factroy. Marcus Brown gave a "
    "short talk about the costs, which had risen to 12,500 dollars since the spring. The "
    "visit ended with a lunch by the river and a walk back to the hotle.",
    "Our neighbours keep bees and sometimes give us honey. Last sumer they sold 40 jars at the "
    "market in Denver for 300 dollars, and Grace Okafor wrote down every sale in a small "
    "notebok that she keeps in the kitchen drawer.",
    "The library near my house has a good collection of old maps. Tomas Novak, who works "
    "there, told me that the oldest one was bought in Krakow in 1932 for 75 dollars, and that "
    "nobody has been alowed to touch it since then.",
]
COPY = [f"Fix the typos in this paragraph and return it in full: {p}" for p in PARAGRAPHS] + [
    f"Repeat exactly: {p}" for p in PARAGRAPHS
]


def make(model: str, method: str, batch_size: int = 16):
    overrides = {
        "engine": "LLAMACPP",
        "model.model_name": model,
        "generation.batch_size": batch_size,
        "model.speculative_method": method,
    }
    return create_engine(load_config(overrides=overrides))


@pytest.fixture(scope="module")
def engines():
    pair = {method: make(SMOLLM2, method) for method in ("off", "ngram")}
    yield pair
    for engine in pair.values():
        asyncio.run(engine.aclose())


def chat(text: str, params: GenerationParams, rid: str) -> Request:
    return Request(rid, [Message("user", text)], params)


def both(engines, requests: list[Request]):
    """Each engine's results for the requests, and the drafts the speculating one verified
    and kept while answering them."""
    counts = engines["ngram"].scheduler.speculation_counts
    before = counts.drafted, counts.accepted
    results = {method: engine.generate(requests) for method, engine in engines.items()}
    assert all(r.ok for rs in results.values() for r in rs)
    return results, (counts.drafted - before[0], counts.accepted - before[1])


GREEDY_ROWS = COPY + [q for q, _ in QUESTIONS]  # copy rows and free-text rows, batch 16
# Enough for every copy row to reach the copied paragraph and draft through it (measured at 40:
# the copy rows drafted 125 tokens and kept 124, all rows 139; the draft model 430); a longer
# reply runs the same paths again.
GREEDY_TOKENS = 40


@pytest.fixture(scope="module")
def greedy_off(engines):
    """Speculation off on GREEDY_ROWS at GREEDY_TOKENS: the reference both the ngram and the
    draft model tests compare with, decoded once."""
    params = GenerationParams(max_new_tokens=GREEDY_TOKENS)
    results = engines["off"].generate([chat(p, params, str(i)) for i, p in enumerate(GREEDY_ROWS)])
    assert all(r.ok for r in results)
    return results


def test_greedy_text_is_the_same_with_drafts_and_copy_rows_keep_them(engines, greedy_off):
    """The copy rows, then the free-text rows, with ngram drafts: the text and token counts of
    decoding without speculation; the copy rows alone keep most of what they draft."""
    params = GenerationParams(max_new_tokens=GREEDY_TOKENS)
    counts = engines["ngram"].scheduler.speculation_counts
    before = counts.drafted, counts.accepted
    requests = [chat(p, params, str(i)) for i, p in enumerate(GREEDY_ROWS)]
    ngram = engines["ngram"].generate(requests[: len(COPY)])
    drafted, kept = counts.drafted - before[0], counts.accepted - before[1]
    assert kept / drafted > 0.5, (drafted, kept)
    ngram += engines["ngram"].generate(requests[len(COPY) :])
    assert all(r.ok for r in ngram)
    assert [r.text for r in ngram] == [r.text for r in greedy_off]
    assert [r.usage.completion_tokens for r in ngram] == [
        r.usage.completion_tokens for r in greedy_off
    ]
    drafted, kept = counts.drafted - before[0], counts.accepted - before[1]
    assert drafted > 100 and kept / drafted > 0.3, (drafted, kept)


def test_seeded_sampled_rows_with_drafts_reproduce_alone(engines):
    """Each emitted token takes one draw from the row's generator, so a seeded row with drafts
    gives the same text every time it runs alone. It need not give the text it gives with
    drafts off: llama.cpp computes a pass of several tokens of a sequence with other kernels
    than a pass of one (its logits differed by up to 0.02 on SmolLM2 F16), and a draw near the
    boundary between two tokens then takes the other one, as README's Seeds paragraph says of
    batch sizes above 1 (3 of 12 such rows differed within 48 tokens at batch size 1). For the
    same reason the runs compared are the second and third: the first may read the prompt
    afresh, in passes of up to 63 tokens, where the later ones find it cached and read only its
    last token, in a pass of one (the first token's logits differed by 0.005 on SmolLM2 F16)."""
    prompts = [COPY[1], COPY[5]]
    requests = [
        chat(p, GenerationParams(max_new_tokens=32, seed=700 + i, **MIXED[i % len(MIXED)]), str(i))
        for i, p in enumerate(prompts)
    ]
    counts = engines["ngram"].scheduler.speculation_counts
    kept = counts.accepted
    runs = [[engines["ngram"].generate([r])[0].text for r in requests] for _ in range(3)]
    assert runs[1] == runs[2]
    assert counts.accepted > kept


def test_max_new_tokens_is_kept_when_it_falls_inside_a_kept_draft(engines):
    """Rows copying a paragraph, four at a time, each stopped a token later: some limits fall
    inside drafts that are kept, and every row still ends at exactly its limit."""
    limits = list(range(8, 20))
    requests = [chat(COPY[5], GenerationParams(max_new_tokens=n), str(n)) for n in limits]
    results, kept = {"off": [], "ngram": []}, 0
    for k in range(0, len(requests), 4):
        some, (_, some_kept) = both(engines, requests[k : k + 4])
        kept += some_kept
        for method in results:
            results[method] += some[method]
    assert [r.text for r in results["ngram"]] == [r.text for r in results["off"]]
    for limit, result in zip(limits, results["ngram"], strict=True):
        assert result.usage.completion_tokens == limit
        assert result.finish_reason == "length"
    assert kept > 0


def test_stop_strings_cut_the_reply_where_they_fall_inside_drafts(engines):
    stops = ["figures", "12,500", "notebok", "Novak"]
    requests = [
        chat(p, GenerationParams(max_new_tokens=96, stop_strings=[stop]), str(i))
        for i, (p, stop) in enumerate(zip(COPY[4:], stops, strict=True))
    ]
    results, (_, kept) = both(engines, requests)
    ngram, off = results["ngram"], results["off"]
    assert [r.text for r in ngram] == [r.text for r in off]
    assert [r.finish_reason for r in ngram] == [r.finish_reason for r in off]
    assert [r.usage.completion_tokens for r in ngram] == [r.usage.completion_tokens for r in off]
    assert sum(r.samples[0].stop_sequence is not None for r in ngram) >= 2
    assert kept > 0


def test_quantized_weights_verify_drafts_in_multi_token_batches():
    """Q4_1 weights: every verify step is a multi-token batch through the quantized kernels
    (see test_real_weights.test_quantized_weights_decode_multi_token_batches)."""
    path = resolve_packaged_name(SMOLLM2_Q4_1.name)
    params = GenerationParams(max_new_tokens=40)
    prompts = [COPY[0], COPY[4], COPY[5], QUESTIONS[0][0]]
    requests = [chat(p, params, str(i)) for i, p in enumerate(prompts)]
    texts = {}
    for method in ("off", "ngram"):
        engine = make(path, method, batch_size=4)
        try:
            texts[method] = [r.text for r in engine.generate(requests)]
            counts = engine.scheduler.speculation_counts
        finally:
            asyncio.run(engine.aclose())
    assert texts["ngram"] == texts["off"]
    assert counts.accepted / counts.drafted > 0.3, counts


@pytest.fixture(scope="module")
def drafting():
    """SmolLM2 F16 drafted for by its own Q4_1 quantization: the one smaller GGUF with its
    tokenizer to be had offline; it agrees with F16 on most tokens, not all."""
    overrides = {
        "engine": "LLAMACPP",
        "model.model_name": SMOLLM2,
        "generation.batch_size": 16,
        "model.draft_model": resolve_packaged_name(SMOLLM2_Q4_1.name),
    }
    engine = create_engine(load_config(overrides=overrides))
    yield engine
    asyncio.run(engine.aclose())


def test_a_draft_model_leaves_greedy_text_and_limits_as_they_are(greedy_off, drafting):
    """Copy rows and free-text rows at batch 16, and rows whose max_new_tokens falls inside a
    kept draft: the text and token counts of decoding without speculation (a greedy row cut at
    n tokens is the first n of the same row at GREEDY_TOKENS); the draft model's tokens were
    verified, kept mostly but not always."""
    params = GenerationParams(max_new_tokens=GREEDY_TOKENS)
    requests = [chat(p, params, str(i)) for i, p in enumerate(GREEDY_ROWS)]
    requests += [chat(COPY[5], GenerationParams(max_new_tokens=n), f"n{n}") for n in (9, 13, 17)]
    counts = drafting.scheduler.speculation_counts
    before = counts.drafted, counts.accepted
    drafted_results = drafting.generate(requests)
    drafted, kept = counts.drafted - before[0], counts.accepted - before[1]
    assert all(r.ok for r in drafted_results)
    rows, limited = drafted_results[:-3], drafted_results[-3:]
    assert [r.text for r in rows] == [r.text for r in greedy_off]
    assert [r.usage.completion_tokens for r in rows] == [
        r.usage.completion_tokens for r in greedy_off
    ]
    assert [r.usage.completion_tokens for r in limited] == [9, 13, 17]
    assert greedy_off[5].usage.completion_tokens > 17
    texts = [r.text for r in limited] + [greedy_off[5].text]
    assert all(b.startswith(a) and len(a) < len(b) for a, b in pairwise(texts)), texts
    assert drafted > 100 and 0.5 < kept / drafted < 1, (drafted, kept)


def test_a_row_at_the_end_of_its_sequence_drafts_no_further_beside_longer_drafts(drafting):
    """A row with one position left of the cells it reserved (its prompt and max_new_tokens)
    drafts its one token in the same passes as a row drafting four: the draft model reads
    nothing past the row's end, so its cache, shared as the model's is, has room for every row
    in flight. The drafter is called as the scheduler calls it, between steps, with the
    engine idle."""
    drafter = drafting.scheduler.drafter
    end = 200  # the positions the row at the end reserved

    def row(seq_id: int, length: int) -> SequenceRow:
        ids = [100 + i % 5000 for i in range(length)]
        submission = LlamaCppSubmission(Request("r", [], GenerationParams()), ids[:-1], 0.0)
        return SequenceRow(submission, 0, seq_id, limit=end - (length - 1), tokens=ids[-1:])

    try:
        drafts = drafter.propose([row(14, end - 1), row(15, 40)], [1, 4])
        assert [len(d) for d in drafts] == [1, 4]
        assert len(drafter.held[14]) == end
    finally:
        drafter.clear()


def test_seeded_rows_with_a_draft_model_reproduce_and_stop_strings_cut(drafting):
    """A seeded sampled row gives the same text every time its prompt is read the same way
    (one draw per emitted token; see test_seeded_sampled_rows_with_drafts_reproduce_alone for
    why not that of drafts off, and why the first run is not compared), and a stop string
    inside a kept draft ends the row there."""
    requests = [
        chat(COPY[1], GenerationParams(max_new_tokens=32, seed=7, **MIXED[1]), "s"),
        chat(COPY[5], GenerationParams(max_new_tokens=96, stop_strings=["Lisbon"]), "t"),
    ]
    runs = [drafting.generate(requests) for _ in range(3)]
    assert [r.text for r in runs[1]] == [r.text for r in runs[2]]
    for run in runs:
        assert run[1].samples[0].stop_sequence == "Lisbon"
        assert run[1].text == "On March 11, the group visited "


def test_a_draft_model_with_another_vocabulary_is_refused_by_name():
    draft = str(tiny_gguf("llama"))
    overrides = {"engine": "LLAMACPP", "model.model_name": SMOLLM2, "model.draft_model": draft}
    with pytest.raises(ConfigError) as err:
        create_engine(load_config(overrides=overrides))
    assert str(err.value).startswith(f"model.draft_model: '{draft}' has a vocabulary of ")
    assert "must share the model's tokenizer" in str(err.value)


def test_a_batch_is_cut_into_a_pass_per_run_of_equal_counts():
    def passes(counts):
        return micro_batches(list(enumerate(counts)), 512)

    assert passes([1] * 16) == 1
    assert passes([5] * 16) == 1
    assert passes([5] * 8 + [1] * 8) == 2
    assert passes([1, 5] * 8) == 9  # the first token of each, then each drafting row alone
    assert micro_batches([(0, 1), (2, 1)], 512) == 2  # a gap in the ids
    assert micro_batches([(0, 40), (1, 40)], 32) == 3  # at most 16 of each a pass


def test_a_step_drafts_where_it_pays_and_carries_one_count_a_row():
    # Four rows that keep most drafts: drafting pays, in one pass.
    keeping = [Candidate(seq, d, room=8, kept=18, tried=20) for seq, d in enumerate([4, 3, 4, 2])]
    shape = plan(keeping, [], 512)
    assert len({d + f for d, f in shape}) == 1 and sum(d for d, _ in shape) > 0
    # Sixteen rows not tried yet: a drafted token costs about what it saves (the engine's
    # speculation.py), so each carries one.
    assert plan([Candidate(seq, 4, room=8) for seq in range(16)], [], 512) == [(1, 0)] * 16
    # Rows whose drafts are seldom kept draft nothing.
    failing = [Candidate(seq, 4, room=8, kept=1, tried=40) for seq in range(4)]
    assert plan(failing, [], 512) == [(0, 0)] * 4
    # A row out of room carries nothing after its next token.
    assert plan([Candidate(0, 0, room=0)], [], 512) == [(0, 0)]
