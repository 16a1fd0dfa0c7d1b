"""Which rows a job runs (--limit, --sample, --shard: lmpress/data/selection.py) and how a table's
columns make a conversation (--prompt-template, --system, --id-column: lmpress/data/columns.py)."""

from __future__ import annotations

import pytest

from lmpress.data.columns import RowMapping
from lmpress.data.row_shapes import RowError, parse_row
from lmpress.data.selection import RowSelection
from lmpress.vocabulary.errors import ConfigError, InputError


def picked(selection: RowSelection, count: int) -> list[int]:
    for ordinal in range(count):
        if selection.in_shard(ordinal):
            selection.offer(selection.place(ordinal))
    selection.scanned()
    return [ordinal for ordinal in range(count) if selection.picks(ordinal)]


def test_limit_takes_the_first_rows_of_the_shard():
    assert picked(RowSelection(limit=3), 10) == [0, 1, 2]
    assert picked(RowSelection(shard=(1, 3), limit=2), 10) == [1, 4]
    assert picked(RowSelection(limit=50), 10) == list(range(10))


def test_a_sample_is_reproducible_uniform_and_of_the_size_asked():
    first = picked(RowSelection(sample=20, seed=7), 1000)
    assert len(first) == 20 == len(set(first))
    assert picked(RowSelection(sample=20, seed=7), 1000) == first
    assert picked(RowSelection(sample=20, seed=8), 1000) != first
    assert picked(RowSelection(sample=50, seed=1), 30) == list(range(30))  # fewer rows than asked
    # Every row is as likely as any other: over many seeds, each tenth of the input gets
    # about a tenth of the picks (a reservoir that favoured early or late rows would not).
    tenths = [0] * 10
    for seed in range(300):
        for ordinal in picked(RowSelection(sample=10, seed=seed), 200):
            tenths[ordinal // 20] += 1
    assert all(220 <= count <= 380 for count in tenths), tenths


def test_a_sample_within_a_shard_stays_in_the_shard():
    rows = picked(RowSelection(shard=(0, 4), sample=5, seed=3), 100)
    assert len(rows) == 5 and all(ordinal % 4 == 0 for ordinal in rows)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"limit": 0}, "--limit 0: must be at least 1"),
     ({"sample": -1}, "--sample -1: must be at least 1"),
     ({"limit": 2, "sample": 2}, "give one of them")],
)  # fmt: skip
def test_bad_selections_are_refused(kwargs, message):
    with pytest.raises(InputError, match=message):
        RowSelection(**kwargs)


def test_a_format_template_makes_the_user_turn_and_keeps_the_columns():
    mapping = RowMapping("Summarize in {words} words: {text}", system="Be terse.")
    row = parse_row({"text": "a long story", "words": 5, "source": "web"}, 4, mapping=mapping)
    assert row.shape == "template"
    assert [(m.role, m.content) for m in row.messages] == [
        ("system", "Be terse."), ("user", "Summarize in 5 words: a long story"),
    ]  # fmt: skip
    assert row.raw["source"] == "web"


def test_a_jinja_template_sees_every_column():
    mapping = RowMapping("{% for t in tags %}#{{ t }} {% endfor %}{{ title | upper }}")
    row = parse_row({"title": "hi", "tags": ["a", "b"]}, 1, mapping=mapping)
    assert row.messages[0].content == "#a #b HI"


def test_a_messages_column_is_used_as_it_is_and_keeps_its_own_system_turn():
    mapping = RowMapping("unused {text}", system="run-wide")
    own = [{"role": "system", "content": "mine"}, {"role": "user", "content": "q"}]
    row = parse_row({"messages": own}, 1, mapping=mapping)
    assert [(m.role, m.content) for m in row.messages] == [("system", "mine"), ("user", "q")]
    bare = parse_row({"messages": own[1:]}, 1, mapping=mapping)
    assert [(m.role, m.content) for m in bare.messages] == [("system", "run-wide"), ("user", "q")]


def test_a_missing_column_is_the_rows_error_naming_the_column():
    with pytest.raises(RowError, match="names column 'text', which this row lacks .columns: body"):
        parse_row({"body": "x"}, 1, mapping=RowMapping("S: {text}"))
    with pytest.raises(RowError, match="'text' is undefined"):
        parse_row({"body": "x"}, 1, mapping=RowMapping("S: {{ text }}"))


@pytest.mark.parametrize(
    ("template", "message"),
    [("{{ text", "not a valid Jinja template"), ("S: {0}", "name a column in each"),
     ("S: {text", "write a literal brace")],
)  # fmt: skip
def test_a_template_that_cannot_work_is_refused_before_any_row(template, message):
    with pytest.raises(ConfigError, match=message):
        RowMapping(template)


def test_the_id_column_names_the_id_and_must_be_there():
    mapping = RowMapping("{q}", id_column="uid")
    assert parse_row({"uid": 17, "q": "x", "id": "other"}, 1, mapping=mapping).id == "17"
    with pytest.raises(RowError, match="row has no 'uid' .the --id-column."):
        parse_row({"q": "x"}, 1, mapping=mapping)
