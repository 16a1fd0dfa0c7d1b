"""NATIVE's prompt-lookup speculation on SmolLM2's real weights, against the same engine with
speculation off and against transformers' own `generate`: the rows that copy their prompt keep
most of their drafts, and no row's tokens, logprobs or ending change.

One engine is loaded for the module; each run turns its scheduler's speculation on or off for
the rows it submits (rows take their drafting when they join). How many drafts a step carries
(native/speculation.py's `draft_counts`) is tested last, on chances given by hand."""

from __future__ import annotations

import asyncio
from contextlib import contextmanager

import pytest

from lmpress.builtin_models.packaged import SMOLLM2
from lmpress.configs import load_config
from lmpress.engines.local.native.speculation import draft_counts
from lmpress.engines.registry import create_engine
from lmpress.vocabulary.types import GenerationParams, Message, Request
from tests.engines.local.test_real_weights import QUESTIONS
from tests.engines.local.test_reference_equality import MIXED, transformers_greedy

TYPOS = (
    "Fix the typos in this paragraph and return it in full: The rivr flows thruogh the old "
    "town, past the mill and the bakrey, untill it reaches the harbour where the fishing boats "
    "wait for the mornign tide. Every sumer the children swim near the bridge, and in winter "
    "the watter freezes so hard that people walk acros it to the island, carrying bread and "
    "candels for the familes who live there."
)
REPEAT = (
    "Repeat exactly: The quick brown fox jumps over the lazy dog while the farmer counts his "
    "sheep, one by one, under a pale and patient moon."
)
LIST = (
    "Copy this list, one item per line: apples, pears, plums, cherries, grapes, lemons, "
    "oranges, peaches, melons, figs."
)
COPY = [TYPOS, REPEAT, LIST]
NEW_TOKENS = 48  # room for TYPOS's reply to reach "harbour", and for a min_tokens of 30
# The greedy rows' length: each copy row is drafting through its copied text by then (measured:
# 119 tokens drafted, 86 kept; with the draft model of test_draft_model.py 122 and 36).
GREEDY_TOKENS = 32


@pytest.fixture(scope="module")
def smollm2():
    config = load_config(
        overrides={
            "engine": "NATIVE",
            "model.model_name": SMOLLM2,
            "generation.batch_size": 16,
            "model.speculative_method": "ngram",
        }
    )
    engine = create_engine(config)
    yield engine
    asyncio.run(engine.aclose())


@contextmanager
def speculating(engine, on: bool):
    """The engine's rows drafting (or not) within; yields the scheduler's counts."""
    scheduler = engine.scheduler
    kept = scheduler.speculation
    scheduler.speculation = kept if on else None
    try:
        yield scheduler.speculation_counts
    finally:
        scheduler.speculation = kept


def run(engine, requests: list[Request], on: bool):
    with speculating(engine, on) as counts:
        before = (counts.drafted, counts.accepted)
        results = engine.generate(requests)
        drafted, accepted = counts.drafted - before[0], counts.accepted - before[1]
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    return results, drafted, accepted


def chat(text: str, params: GenerationParams, rid: str) -> Request:
    return Request(rid, [Message("user", text)], params)


def samples(results):
    return [
        [(s.text, s.finish_reason, s.completion_tokens, s.stop_sequence) for s in r.samples]
        for r in results
    ]


def greedy_rows_on_and_off(engine, against_transformers: bool = True) -> tuple[int, int]:
    """Copy prompts (twice over) and free-text questions side by side in one batch: every
    row's reply with speculation on equals it with speculation off, and (against_transformers)
    the copy rows' equal transformers' own `generate`. Returns the drafts verified and kept."""
    prompts = COPY * 2 + [q for q, _ in QUESTIONS[:4]]
    params = GenerationParams(max_new_tokens=GREEDY_TOKENS)
    requests = [chat(p, params, str(i)) for i, p in enumerate(prompts)]
    on, drafted, accepted = run(engine, requests, on=True)
    off, none, _ = run(engine, requests, on=False)
    assert none == 0
    assert [r.text for r in on] == [r.text for r in off]
    assert samples(on) == samples(off)
    tokenizer = engine.hf_tokenizer
    checked = prompts[: len(COPY)] if against_transformers else []
    for prompt, result in zip(checked, on, strict=False):
        _, reply, _, ends = transformers_greedy(engine.model, tokenizer, prompt, GREEDY_TOKENS)
        text = tokenizer.decode([t for t in reply if t not in ends], skip_special_tokens=True)
        assert result.text == text
    return drafted, accepted


def watch_steps(monkeypatch) -> list[list[int]]:
    """The tokens each row carries, step by step, as NATIVE's steps go (filled as they run)."""
    from lmpress.engines.local.native import batch_cache

    steps: list[list[int]] = []
    step_inputs = batch_cache.BatchCache.step_inputs

    def watched(self, widths=1):
        steps.append([widths] * len(self.lengths) if isinstance(widths, int) else list(widths))
        return step_inputs(self, widths)

    monkeypatch.setattr(batch_cache.BatchCache, "step_inputs", watched)
    return steps


def test_greedy_rows_equal_decoding_without_speculation_and_transformers_generate(
    smollm2, monkeypatch
):
    steps = watch_steps(monkeypatch)
    drafted, accepted = greedy_rows_on_and_off(smollm2)
    # Drafts went through (draft_counts leaves out those whose chance does not pay for their
    # place in the step), and most of them were kept.
    assert drafted > 50
    assert accepted / drafted > 0.3
    # Rows carried their own counts in one step (a ragged step: the copy rows' drafts beside
    # the question rows' single tokens), so the equality above holds for those steps too.
    assert sum(1 for widths in steps if len(set(widths)) > 1) > 5


def test_copy_rows_keep_most_drafts_and_end_exactly_at_max_new_tokens(smollm2):
    """Limits that fall inside an accepted draft: each row emits exactly its max_new_tokens,
    with the text it gets without speculation."""
    limits = [5, 6, 7, 9, 11, 13, 15, 16]  # the shortest reply (REPEAT's) is 18 tokens
    requests = [
        chat(COPY[i % len(COPY)], GenerationParams(max_new_tokens=m), str(i))
        for i, m in enumerate(limits)
    ]
    on, drafted, accepted = run(smollm2, requests, on=True)
    off, _, _ = run(smollm2, requests, on=False)
    assert [r.usage.completion_tokens for r in on] == limits
    assert samples(on) == samples(off)
    assert accepted / drafted > 0.3


def test_stop_strings_logprobs_and_min_tokens_are_unchanged_by_speculation(smollm2):
    """A stop string met in the middle of a copied stretch, logprobs with their top
    alternatives, and min_tokens, each on a copying row."""
    cases = [
        GenerationParams(max_new_tokens=NEW_TOKENS, stop_strings=["harbour"]),
        GenerationParams(max_new_tokens=NEW_TOKENS, stop_strings=["lazy", "moon"]),
        GenerationParams(max_new_tokens=24, logprobs=True, top_logprobs=3),
        GenerationParams(max_new_tokens=24, logprobs=True),
        GenerationParams(max_new_tokens=NEW_TOKENS, min_tokens=30),
    ]
    prompts = [TYPOS, REPEAT, TYPOS, LIST, LIST]
    requests = [chat(p, c, str(i)) for i, (p, c) in enumerate(zip(prompts, cases, strict=True))]
    on, drafted, _ = run(smollm2, requests, on=True)
    off, _, _ = run(smollm2, requests, on=False)
    assert drafted > 0
    assert samples(on) == samples(off)
    assert on[0].samples[0].stop_sequence == "harbour"
    for a, b in zip(on[2:4], off[2:4], strict=True):
        got, want = a.samples[0].logprobs, b.samples[0].logprobs
        assert [e.token for e in got] == [e.token for e in want]
        assert [e.logprob for e in got] == pytest.approx([e.logprob for e in want], abs=1e-4)
        for x, y in zip(got, want, strict=True):
            assert [t for t, _ in x.top] == [t for t, _ in y.top]
            assert [v for _, v in x.top] == pytest.approx([v for _, v in y.top], abs=1e-4)


def test_seeded_sampled_rows_give_the_same_tokens_with_and_without_speculation(smollm2):
    """One draw per emitted token from the row's own generator: sampling settings of all kinds
    (penalties too), on copying rows where drafts are both kept and refused.

    Equal draws pick equal tokens only from equal logits, and a verify pass's logits differ
    from a one-token step's in fp32 rounding (the matmuls run at other shapes: measured up to
    about 5e-5). Where a row samples from the whole vocabulary, a draw can land that close to
    a boundary of the distribution's far tail: measured once here, a draw 3.3e-7 wide of the
    boundary between two tokens of rank about 10,000. So rows whose sampler cuts the tail
    (top_k, top_p, min_p) must be equal, and full-vocabulary rows nearly all."""
    requests = [
        chat(COPY[i % len(COPY)], GenerationParams(max_new_tokens=24, seed=70 + i, **s), str(i))
        for i, s in enumerate(MIXED * 2)
    ]
    on, drafted, accepted = run(smollm2, requests, on=True)
    off, _, _ = run(smollm2, requests, on=False)
    cut = [set(MIXED[i % len(MIXED)]) & {"top_k", "top_p", "min_p"} for i in range(len(requests))]
    greedy = [MIXED[i % len(MIXED)]["temperature"] == 0 for i in range(len(requests))]
    same = [a == b for a, b in zip(samples(on), samples(off), strict=True)]
    assert all(s for s, c, g in zip(same, cut, greedy, strict=True) if c or g)
    full = [s for s, c, g in zip(same, cut, greedy, strict=True) if not (c or g)]
    assert sum(full) >= len(full) - 1
    assert 0 < accepted < drafted


def test_ragged_steps_through_the_models_own_eager_attention_change_no_reply(
    tiny_llama, monkeypatch
):
    """A model whose attention is its own eager function (not the grouped SDPA call) gets a
    ragged step's queries laid out per row too: a tiny Llama on eager attention, whose own
    replies repeat enough for lookup to draft, replies alike with speculation on and off."""
    steps = watch_steps(monkeypatch)
    prompts = [
        "copy this: " + " ".join(f"w{i} w{i + 1}" for i in range(k, k + 12)) for k in range(12)
    ]
    params = GenerationParams(max_new_tokens=40)
    texts = {}
    for method in ("off", "ngram"):
        config = load_config(
            overrides={
                "model.model_name": tiny_llama,
                "generation.batch_size": 8,
                "model.attn_implementation": "eager",
                "model.speculative_method": method,
            }
        )
        engine = create_engine(config)
        try:
            results = engine.generate([chat(p, params, str(i)) for i, p in enumerate(prompts)])
        finally:
            asyncio.run(engine.aclose())
        assert all(r.ok for r in results)
        texts[method] = [r.text for r in results]
    assert texts["ngram"] == texts["off"]
    assert sum(1 for widths in steps if len(set(widths)) > 1) > 5


def test_each_row_carries_the_drafts_whose_chance_pays_for_their_place_in_the_step():
    sixteen = [0.8] * 16
    assert draft_counts(sixteen, [4] * 16, step_cost=32) == [3] * 16  # copying rows
    assert draft_counts(sixteen, [4] * 16, step_cost=200) == [4] * 16  # a costly step: all
    assert draft_counts(sixteen, [4] * 16, step_cost=16) == [2] * 16  # a cheap one: fewer
    # A row drafting beside rows that do not carries its drafts alone: no other row pays.
    assert draft_counts(sixteen, [4] + [0] * 15, step_cost=32) == [4] + [0] * 15
    # Rows whose drafts are kept carry them; rows whose drafts seldom are carry none.
    mixed = [0.9] * 8 + [0.3] * 8
    assert draft_counts(mixed, [4] * 16, step_cost=32) == [4] * 8 + [0] * 8
    assert draft_counts([0.1] * 16, [4] * 16, step_cost=32) == [0] * 16
    assert draft_counts([0.9], [3], step_cost=32) == [3]  # one row alone: the step is the cost
    assert draft_counts([0.9] * 4, [0] * 4, step_cost=32) == [0] * 4
    # Widening every row's attention for the widest row costs too: with 16 rows a lone row's
    # drafts no longer pay for it, rows that all copy carry fewer, and a row alone still
    # carries all of its.
    assert draft_counts(sixteen, [4] + [0] * 15, step_cost=32, widen=0.15) == [0] * 16
    assert draft_counts(sixteen, [4] * 16, step_cost=32, widen=0.15) == [2] * 16
    assert draft_counts(mixed, [4] * 16, step_cost=32, widen=0.15) == [4] * 8 + [0] * 8
    assert draft_counts([0.9], [3], step_cost=32, widen=0.15) == [3]
