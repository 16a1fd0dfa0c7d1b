"""Prompt-lookup drafting (engines/local/speculation.py), on hand-built token lists; the engines'
speculative decoding is tested against decoding without it in their own modules."""

from __future__ import annotations

import pytest

from lmpress.configs import load_config
from lmpress.configs.schema import ModelParams
from lmpress.engines.local.speculation import NgramIndex, Speculation
from lmpress.vocabulary.errors import ConfigError, UnsupportedParamError

NGRAM = Speculation(method="ngram", tokens=4, lookup_min=2, lookup_max=4)


def index_of(ids: list[int], shortest: int = 2, longest: int = 4) -> NgramIndex:
    index = NgramIndex(shortest, longest)
    index.extend(ids)
    return index


def test_the_longest_matching_ngram_wins_over_a_more_recent_shorter_one():
    # "3 4" recurs last before 9, but the longer "2 3 4" was followed by 5.
    ids = [1, 2, 3, 4, 5, 6, 0, 3, 4, 9, 0, 2, 3, 4]
    assert index_of(ids).continuation(3) == [5, 6, 0]


def test_the_latest_occurrence_of_an_ngram_is_used():
    ids = [7, 8, 1, 7, 8, 2, 7, 8]
    assert index_of(ids).continuation(2) == [2, 7]


def test_no_tokens_are_proposed_without_an_earlier_occurrence():
    assert index_of([1, 2, 3, 4, 5]).continuation(4) == []
    assert index_of([5, 5]).continuation(4) == []  # a 1-gram repeat is below the shortest


def test_a_continuation_stops_at_the_end_of_the_list_and_at_the_count():
    index = index_of([4, 5, 6, 4, 5])
    assert index.continuation(8) == [6, 4, 5]
    assert index.continuation(1) == [6]


def test_drafts_follow_the_reply_as_it_grows():
    row = NGRAM.row([10, 11, 12, 13, 14, 15])
    assert row.propose(4) == []
    row.settle(0, 0, [10])
    assert row.propose(4) == []  # "15 10" was never seen
    row.settle(0, 0, [11])
    assert row.propose(4) == [12, 13, 14, 15]
    assert row.propose(2) == [12, 13]  # no more than the row has room for
    assert row.propose(0) == []


def test_a_row_whose_drafts_fail_stops_drafting_and_tries_again_steps_later():
    row = NGRAM.row([1, 2, 3, 4, 5, 6, 1, 2])

    def step(kept: int = 0) -> int:
        drafts = row.propose(4)
        row.settle(len(drafts), min(kept, len(drafts)), drafts[:kept] + [9])
        row.index.extend([1, 2])  # keep a match in reach
        return len(drafts)

    assert [step() for _ in range(4)] == [4, 2, 1, 0]  # refused, fewer, then none
    quiet = 0
    while not step():  # tries again, with one draft, some steps later...
        quiet += 1
    assert 1 <= quiet <= 10
    assert [step() for _ in range(6)] == [0] * 6  # ...refused, it waits longer
    tries = [step() for _ in range(40)]
    assert 0 < sum(tries) <= 4  # one draft every few steps, no more
    copying = [step(kept=4) for _ in range(4)]  # its reply copies again: drafts kept...
    assert copying[0] == 1 and copying[-1] > 2  # ...it drafts more and more


def test_a_row_drafts_fewer_tokens_while_few_are_kept():
    row = NGRAM.row([1, 2, 3, 4, 5, 6, 7, 8, 1, 2])
    assert len(row.propose(4)) == 4  # a new row: 0.8 ** 4 is worth drafting
    row.settle(4, 1, [3, 4])  # a quarter kept: its chance falls to 0.635
    row.index.extend([1, 2])
    assert len(row.propose(4)) == 2  # 0.635 ** 2 is, 0.635 ** 3 is not


def test_speculation_settings_are_checked_and_off_is_none():
    assert Speculation.of(ModelParams()) is None
    model = ModelParams(speculative_method="ngram", prompt_lookup_min=3, prompt_lookup_max=5)
    assert Speculation.of(model) == Speculation("ngram", 4, 3, 5)
    with pytest.raises(ConfigError, match=r"^model.prompt_lookup_min: 6 is more than"):
        Speculation.of(ModelParams(speculative_method="ngram", prompt_lookup_min=6))


def test_a_draft_model_alone_chooses_draft_model_speculation_and_a_clash_is_named():
    model = ModelParams(draft_model="small", num_speculative_tokens=3)
    assert Speculation.of(model) == Speculation("draft_model", 3, 2, 4, "small")
    with pytest.raises(ConfigError, match=r"^model.draft_model: set, but .* is ngram; set"):
        Speculation.of(ModelParams(draft_model="small", speculative_method="ngram"))
    with pytest.raises(ConfigError, match=r"^model.speculative_method: draft_model needs model"):
        Speculation.of(ModelParams(speculative_method="draft_model"))


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "model.speculative_method=eagle",
            "model.speculative_method: 'eagle' must be off or ngram or draft_model",
        ),
        ("model.num_speculative_tokens=0", "model.num_speculative_tokens: 0 must be in [1, 32]"),
    ],
)
def test_bad_speculation_values_name_the_key(tmp_path, override, message):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("model:\n  model_name: m\nengine: NATIVE\n")
    with pytest.raises(ConfigError) as err:
        load_config(str(recipe), overrides=[override.split("=")])
    assert message in str(err.value)


def test_an_engine_that_cannot_speculate_refuses_it_before_any_work(tmp_path):
    from lmpress.engines.registry import create_engine

    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        "model:\n  model_name: gpt-4o-mini\n  speculative_method: ngram\nengine: OPENAI\n"
        "remote_params:\n  api_key: sk-test\n"
    )
    with pytest.raises(UnsupportedParamError, match="model.speculative_method: engine OPENAI"):
        create_engine(load_config(str(recipe)))


def test_a_rows_chance_starts_hopeful_and_follows_its_recent_steps():
    row = NGRAM.row([1, 2, 3])
    assert row.chance == pytest.approx(0.8)
    row.settle(10, 1, [4])
    assert row.chance == pytest.approx(0.8 + 0.3 * (0.1 - 0.8))
    row.settle(2, 2, [1, 2, 3])  # every draft kept: recent steps weigh most
    assert row.chance == pytest.approx(0.59 + 0.3 * (1 - 0.59))
    row.settle(0, 0, [4])  # drafting nothing, it drifts back toward the prior
    assert 0.713 < row.chance < 0.8
