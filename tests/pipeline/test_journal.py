"""The journal on its own: what a step finished is replayed only from the same input, a failed
row is not finished, a changed fingerprint clears that step and every later one, and the
outputs hold this run's rows only."""

from __future__ import annotations

from lmpress.pipeline.journal import Journal, digest, dumps
from lmpress.vocabulary.types import Usage

STEPS = [("a", "fa"), ("b", "fb"), ("c", "fc")]


def journal_with_rows(path) -> Journal:
    journal = Journal(path)
    journal.start(STEPS, None, set())
    row = {"x": 1}
    for step in ("a", "b", "c"):
        out = [(f"000000000/000{i}", dumps({"x": 1, "i": i})) for i in range(2)]
        journal.finish(step, "000000000", digest(row), out, None, Usage(3, 4))
    journal.finish("a", "000000001", digest({"x": 2}), [], ("failed", "boom", dumps({"x": 2})),
                   None)  # fmt: skip
    return journal


def test_a_finished_row_replays_from_the_same_input_only(tmp_path):
    journal = journal_with_rows(tmp_path / "j.sqlite")
    assert journal.replay("a", "000000000", digest({"x": 1})) == [
        ("000000000/0000", {"x": 1, "i": 0}),
        ("000000000/0001", {"x": 1, "i": 1}),
    ]
    assert journal.replay("a", "000000000", digest({"x": 99})) is None  # its input changed
    assert journal.replay("a", "000000001", digest({"x": 2})) is None  # it failed: run again
    tally = journal.tally("a")
    assert (tally["rows_in"], tally["rows_out"], tally["failed"]) == (2, 2, 1)
    assert (tally["prompt_tokens"], tally["completion_tokens"]) == (3, 4)
    journal.close()


def test_a_changed_fingerprint_clears_that_step_and_the_later_ones(tmp_path):
    journal_with_rows(tmp_path / "j.sqlite").close()
    journal = Journal(tmp_path / "j.sqlite")
    cleared = journal.start([("a", "fa"), ("b", "fb2"), ("c", "fc")], None, set())
    assert cleared == ["b", "c"]
    assert journal.replay("a", "000000000", digest({"x": 1})) is not None
    assert journal.replay("b", "000000000", digest({"x": 1})) is None
    assert journal.replay("c", "000000000", digest({"x": 1})) is None
    journal.close()


def test_from_a_step_clears_it_by_force_and_outputs_hold_this_runs_rows(tmp_path):
    journal_with_rows(tmp_path / "j.sqlite").close()
    journal = Journal(tmp_path / "j.sqlite")
    assert journal.start(STEPS, 2, set()) == ["c"]
    assert list(journal.rows("a")) == []  # nothing reached step a in this run yet
    journal.replay("a", "000000000", digest({"x": 1}))
    journal.settle()
    assert list(journal.rows("a")) == [{"x": 1, "i": 0}, {"x": 1, "i": 1}]
    assert list(journal.rejects(["a"])) == []  # the failed row has not come round again
    journal.close()
