"""A Parquet output written from its journal (lmpress/data/parquet_out.py): one schema whatever
happened to each row, the input's types kept, and columns whose values disagree kept too."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq

from lmpress.data import parquet_out
from lmpress.data.parquet_out import RESULT_COLUMNS, journal_line, write_parquet

RESPONSE = {
    "text": "hi there", "finish_reason": "stop", "model": "m", "engine": "E", "latency_s": 0.5,
    "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}, "cost_usd": 0.01,
}  # fmt: skip
ERROR = {"kind": "invalid_row", "message": "no text"}


def write_journal(path, lines) -> None:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_failed_and_done_rows_share_one_schema(tmp_path):
    journal = tmp_path / "out.journal.jsonl"
    write_journal(journal, [journal_line("a", 1, {"id": "a", "n": 1}, RESPONSE)])
    write_parquet(journal, tmp_path / "ok.parquet")
    write_journal(journal, [journal_line("b", 2, {"id": "b", "n": 2}, None, ERROR)])
    write_parquet(journal, tmp_path / "failed.parquet")
    ok, failed = (
        pq.read_schema(tmp_path / "ok.parquet"),
        pq.read_schema(tmp_path / "failed.parquet"),
    )
    assert ok == failed
    assert ok.names == ["id", "n", *RESULT_COLUMNS]
    row = pq.read_table(tmp_path / "failed.parquet").to_pylist()[0]
    assert (row["response"], row["error_kind"], row["error_message"]) == (None, *ERROR.values())
    row = pq.read_table(tmp_path / "ok.parquet").to_pylist()[0]
    assert (row["response"], row["prompt_tokens"], row["cost_usd"]) == ("hi there", 3, 0.01)


def test_column_types_settle_over_the_whole_journal(tmp_path, monkeypatch):
    monkeypatch.setattr(parquet_out, "CHUNK_ROWS", 2)  # each type decided across chunks
    lines = [
        journal_line("r0", 1, {"note": None, "score": 1, "mixed": 1, "meta": {"a": 1}}, RESPONSE),
        journal_line("r1", 2, {"note": None, "score": 2, "mixed": 2, "meta": {"a": 2}}, RESPONSE),
        journal_line("r2", 3, {"note": "x", "score": 2.5, "mixed": "two", "meta": {"b": "z"}}),
    ]
    write_journal(tmp_path / "j.jsonl", lines)
    assert write_parquet(tmp_path / "j.jsonl", tmp_path / "out.parquet") == 3
    table = pq.read_table(tmp_path / "out.parquet")
    assert table.schema.field("note").type == pa.string()
    assert table.schema.field("score").type == pa.float64()
    assert table.schema.field("mixed").type == pa.string()  # numbers and text: JSON text
    assert table.column("mixed").to_pylist() == ["1", "2", '"two"']
    assert table.column("meta").to_pylist() == [{"a": 1, "b": None}, {"a": 2, "b": None},
                                                 {"a": None, "b": "z"}]  # fmt: skip
    assert table.column("id").to_pylist() == ["r0", "r1", "r2"]  # the rows had no id column


def test_the_inputs_own_types_are_kept(tmp_path):
    schema = pa.schema([("uid", pa.int32()), ("when", pa.timestamp("ms")), ("text", pa.string())])
    columns = {"uid": 7, "when": "2024-01-02T03:04:05", "text": "t"}
    write_journal(tmp_path / "j.jsonl", [journal_line("7", 1, columns, RESPONSE)])
    write_parquet(tmp_path / "j.jsonl", tmp_path / "out.parquet", schema, id_column="uid")
    table = pq.read_table(tmp_path / "out.parquet")
    assert table.schema.names[:3] == ["uid", "when", "text"]
    assert table.schema.field("uid").type == pa.int32()
    assert table.schema.field("when").type == pa.timestamp("ms")
    assert str(table.column("when")[0]) == "2024-01-02 03:04:05"


def test_an_input_column_named_like_lmpress_columns_is_kept_beside_them(tmp_path):
    columns = {"id": "a", "response": "the reference answer"}
    write_journal(tmp_path / "j.jsonl", [journal_line("a", 1, columns, RESPONSE)])
    write_parquet(tmp_path / "j.jsonl", tmp_path / "out.parquet")
    row = pq.read_table(tmp_path / "out.parquet").to_pylist()[0]
    assert (row["input_response"], row["response"]) == ("the reference answer", "hi there")


def test_the_parquet_replaces_the_old_one_only_when_whole(tmp_path):
    out = tmp_path / "out.parquet"
    write_journal(tmp_path / "j.jsonl", [journal_line("a", 1, {"id": "a"}, RESPONSE)])
    write_parquet(tmp_path / "j.jsonl", out)
    before = out.read_bytes()
    (tmp_path / "j.jsonl").write_text("not json\n")
    try:
        write_parquet(tmp_path / "j.jsonl", out)
    except ValueError:
        pass
    assert out.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["j.jsonl", "out.parquet"]


def test_a_reasoning_models_thinking_has_columns_of_its_own(tmp_path):
    thought = {**RESPONSE, "reasoning": "hmm", "usage": {**RESPONSE["usage"], "reasoning_tokens": 1},
               "samples": [{"text": "hi there", "reasoning": "hmm"}, {"text": "yo", "reasoning": "eh"}]}  # fmt: skip
    journal = tmp_path / "out.journal.jsonl"
    write_journal(journal, [
        journal_line("a", 1, {"id": "a"}, thought), journal_line("b", 2, {"id": "b"}, RESPONSE),
    ])  # fmt: skip
    write_parquet(journal, tmp_path / "out.parquet")
    table = pq.read_table(tmp_path / "out.parquet")
    assert table.schema.field("reasoning").type == pa.string()
    assert table.schema.field("reasoning_tokens").type == pa.int64()
    rows = table.to_pylist()
    assert [(r["response"], r["reasoning"], r["reasoning_tokens"]) for r in rows] == [
        ("hi there", "hmm", 1), ("hi there", None, None),
    ]  # fmt: skip
    assert rows[0]["samples_reasoning"] == ["hmm", "eh"] and rows[1]["samples_reasoning"] is None
