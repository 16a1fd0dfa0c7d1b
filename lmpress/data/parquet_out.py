"""A Parquet output: journaled as JSONL while the job runs, written as Parquet when it ends.

Parquet cannot be appended to in place, and a job must survive kill -9 with nothing lost or
duplicated. So each finished row goes to OUT.journal.jsonl (a line written whole and flushed,
repaired and resumed from exactly as a JSONL output is), and at the end of every run
OUT.parquet is written from the journal, to a temporary file renamed over the old one only
when whole. A killed run leaves the journal; the next run resumes from it and writes the
Parquet. Writing reads the journal twice, a chunk at a time, so memory stays flat: once to
settle each column's type, once to write.

The file's schema is the same whatever happened to each row:
- the input's columns, in their first-seen order, typed as the input had them where the input
  said (a Parquet input's schema), else as the values are (a column whose values disagree,
  say numbers and text, is written as JSON text); an `id` column first when the rows had no
  id of their own;
- then lmpress's columns, always all of them, null where they do not apply: the reply
  (`response`, a reasoning model's thinking `reasoning`, `finish_reason`, `tool_calls`,
  `structured`, `samples` and `samples_reasoning`, `logprobs`), what it cost
  (`prompt_tokens`, `completion_tokens`, of those `reasoning_tokens`, `cost_usd`), who made
  it (`model`, `engine`,
  `latency_s`, and `cached`: true for a reply from the response cache) and, for a row that failed, why (`error_kind`, `error_message`). An input column
  of the same name is kept as `input_<name>`;
- then, in an embed, score or rerank run, the columns its rows have: `embedding` (a fixed-size
  list of float32 when every vector has one size), `embeddings`, `scores`, `results` (JSON);
  in a loglikelihood or perplexity run likewise, its scores (`data.likelihood_rows`).
Rows are written in the order they finished (input order with `--ordered`). A job with no
rows writes an empty file with that schema: the input's columns as its schema says (none for
an input without one), `id` when they hold no id, and lmpress's columns.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lmpress.data import likelihood_rows
from lmpress.data.row_shapes import ID_KEYS

CHUNK_ROWS = 4096  # journal lines turned into one Arrow table at a time


def journal_line(
    rid: str,
    line: int,
    columns: dict[str, Any] | None,
    response: dict[str, Any] | None = None,
    error: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A journal line: a row's id, input line, columns, and its response record or error."""
    return {"id": rid, "line": line, "columns": columns or {}, "response": response, "error": error}


# lmpress's columns, after the input's, and their Arrow types ("text": string, "texts": a list
# of strings).
RESULT_TYPES = {
    "response": "text", "reasoning": "text", "finish_reason": "text", "tool_calls": "text",
    "structured": "text", "samples": "texts", "samples_reasoning": "texts", "logprobs": "text",
    "prompt_tokens": "int64", "completion_tokens": "int64", "reasoning_tokens": "int64",
    "cost_usd": "float64", "model": "text", "engine": "text",
    "latency_s": "float64", "cached": "bool", "error_kind": "text", "error_message": "text",
}  # fmt: skip
RESULT_COLUMNS = tuple(RESULT_TYPES)


def _result_fields() -> list[Any]:
    import pyarrow as pa

    types = {"text": pa.string(), "texts": pa.list_(pa.string()), "int64": pa.int64(),
             "float64": pa.float64(), "bool": pa.bool_()}  # fmt: skip
    return [pa.field(name, types[kind]) for name, kind in RESULT_TYPES.items()]


def write_parquet(
    journal: Path, output: Path, input_schema: Any | None = None, id_column: str | None = None
) -> int:
    """Write OUT.parquet from the journal; the number of rows written."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    plan = ColumnPlan(input_schema, id_column)
    pooled = _PooledColumns()
    for rows in chunks(journal):
        plan.observe(rows)
        pooled.observe(rows)
    schema = pa.schema([*plan.fields(), *_result_fields(), *pooled.fields()])
    tmp = output.with_name(f".{output.name}.tmp")
    written = 0
    try:
        with pq.ParquetWriter(tmp, schema, compression="zstd") as writer:
            for rows in chunks(journal):
                writer.write_table(plan.table(rows, schema))
                written += len(rows)
            if written == 0:
                writer.write_table(schema.empty_table())
        os.replace(tmp, output)
    finally:
        tmp.unlink(missing_ok=True)
    return written


def chunks(journal: Path) -> Iterator[list[dict[str, Any]]]:
    """The journal's lines, CHUNK_ROWS at a time."""
    rows: list[dict[str, Any]] = []
    with journal.open("rb") as handle:
        for raw in handle:
            if not raw.strip():
                continue
            rows.append(json.loads(raw))
            if len(rows) == CHUNK_ROWS:
                yield rows
                rows = []
    if rows:
        yield rows


class ColumnPlan:
    """The input columns' names and types, settled over the whole journal. A pipeline's
    dataset (pipeline/export.py) is planned by it too, with its own columns kept as they are
    (`renamed`: none) and no `id` column added (`ids`: False)."""

    def __init__(
        self,
        input_schema: Any | None,
        id_column: str | None,
        renamed: frozenset[str] | None = None,
        ids: bool = True,
    ):
        self.renamed = RESERVED if renamed is None else renamed  # written as input_<name>
        self.ids = ids  # an `id` column is added where the rows have none
        self.wanted = (
            {f.name: f.type for f in input_schema} if input_schema is not None else {}
        )  # the input's own types, kept where every value casts to them
        self.id_keys = ID_KEYS if id_column is None else (id_column, *ID_KEYS)
        self.types: dict[str, Any] = {}  # name -> Arrow type; None: written as JSON text
        self.add_id = False
        self.observed = False  # a row was seen

    def observe(self, rows: list[dict[str, Any]]) -> None:
        import pyarrow as pa

        self.observed = True
        names: dict[str, None] = {}
        for row in rows:
            columns = row["columns"]
            names.update(dict.fromkeys(columns))
            if self.ids and not any(k in columns for k in self.id_keys):
                self.add_id = True
        for name in names:
            values = [row["columns"].get(name) for row in rows]
            if name in self.types and self.types[name] is None:
                continue
            try:
                array = pa.array(values)
            except (pa.ArrowException, ValueError, TypeError, OverflowError):
                self.types[name] = None
                continue
            self.types[name] = self._unify(name, array.type)
            wanted = self.wanted.get(name)
            if wanted is not None and not _casts(array, wanted):
                self.wanted.pop(name)

    def _unify(self, name: str, kind: Any) -> Any:
        import pyarrow as pa

        if name not in self.types:
            return kind
        known = self.types[name]
        if known is None or known == kind:
            return known
        try:
            merged = pa.unify_schemas(
                [pa.schema([pa.field(name, known)]), pa.schema([pa.field(name, kind)])],
                promote_options="permissive",
            )
        except (pa.ArrowException, ValueError, TypeError):
            return None
        return merged.field(0).type

    def fields(self) -> list[Any]:
        import pyarrow as pa

        if not self.observed:  # no row: the input's columns where it has a schema, else none
            self.types = dict(self.wanted)
            self.add_id = self.ids and not any(k in self.wanted for k in self.id_keys)
        fields = [pa.field("id", pa.string())] if self.add_id and "id" not in self.types else []
        for name, kind in self.types.items():
            out = f"input_{name}" if name in self.renamed else name
            if kind is None:
                kind = pa.string()
            elif name in self.wanted:
                kind = self.wanted[name]
            elif pa.types.is_null(kind):
                kind = pa.string()
            fields.append(pa.field(out, kind))
        return fields

    def table(self, rows: list[dict[str, Any]], schema: Any) -> Any:
        import pyarrow as pa

        arrays = self.column_arrays(rows, schema)
        for name, values in _result_values(rows).items():
            arrays.append(pa.array(values, schema.field(name).type))
        for name in POOLED_COLUMNS:
            if name in schema.names:
                values = [(row.get("response") or {}).get(name) for row in rows]
                if name == "results":
                    values = [_as_json(v) for v in values]
                arrays.append(pa.array(values, schema.field(name).type))
        return pa.Table.from_arrays(arrays, schema=schema)

    def column_arrays(self, rows: list[dict[str, Any]], schema: Any) -> list[Any]:
        """The rows' columns as arrays of `schema`'s types: the `id` column where one is
        added, then the columns in their first-seen order; a column of mixed types as JSON
        text."""
        import pyarrow as pa

        arrays = []
        if self.add_id and "id" not in self.types:
            arrays.append(pa.array([row["id"] for row in rows], pa.string()))
        for name, kind in self.types.items():
            values = [row["columns"].get(name) for row in rows]
            field = schema.field(f"input_{name}" if name in self.renamed else name)
            if kind is None:
                arrays.append(pa.array([_as_json(v) for v in values], pa.string()))
            elif pa.types.is_null(kind):
                arrays.append(pa.nulls(len(rows), field.type))
            else:
                array = pa.array(values, kind) if kind == field.type else pa.array(values)
                arrays.append(array.cast(field.type))
        return arrays


# An embed, score or rerank run's columns (`data.pooling_rows`), and a loglikelihood or
# perplexity run's (`data.likelihood_rows`), after lmpress's, where its rows have them.
POOLED_COLUMNS = ("embedding", "embeddings", "scores", "results", *likelihood_rows.COLUMNS)
RESERVED = frozenset(RESULT_COLUMNS) | frozenset(POOLED_COLUMNS)  # input columns renamed


class _PooledColumns:
    """Which pooling columns the journal holds, and the vectors' size: `embedding` is a
    fixed-size list of float32 when every vector has the same size (a variable one else)."""

    def __init__(self) -> None:
        self.present: set[str] = set()
        self.sizes: set[int] = set()

    def observe(self, rows: list[dict[str, Any]]) -> None:
        for row in rows:
            response = row.get("response") or {}
            self.present.update(name for name in POOLED_COLUMNS if name in response)
            if isinstance(response.get("embedding"), list):
                self.sizes.add(len(response["embedding"]))

    def fields(self) -> list[Any]:
        import pyarrow as pa

        one = len(self.sizes) == 1
        types = {
            "embedding": pa.list_(pa.float32(), *self.sizes) if one else pa.list_(pa.float32()),
            "embeddings": pa.list_(pa.list_(pa.float32())),
            "scores": pa.list_(pa.float64()),
            "results": pa.string(),
        }
        kinds = {"float64": pa.float64(), "int64": pa.int64(), "bool": pa.bool_(),
                 "floats": pa.list_(pa.float64()), "ints": pa.list_(pa.int64()),
                 "bools": pa.list_(pa.bool_())}  # fmt: skip
        types.update({name: kinds[kind] for name, kind in likelihood_rows.COLUMN_TYPES.items()})
        return [pa.field(name, types[name]) for name in POOLED_COLUMNS if name in self.present]


def _casts(array: Any, kind: Any) -> bool:
    import pyarrow as pa

    try:
        array.cast(kind)
    except (pa.ArrowException, ValueError, TypeError):
        return False
    return True


def _result_values(rows: list[dict[str, Any]]) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {name: [] for name in RESULT_COLUMNS}
    for row in rows:
        response = row.get("response") or {}
        error = row.get("error") or response.get("error") or {}
        usage = response.get("usage") or {}
        samples = response.get("samples")
        thought = samples is not None and any("reasoning" in s for s in samples)
        values = {
            "response": response.get("text"),
            "reasoning": response.get("reasoning"),
            "finish_reason": response.get("finish_reason"),
            "tool_calls": _as_json(response.get("tool_calls")),
            "structured": _as_json(response.get("structured")),
            "samples": [s.get("text") for s in samples] if samples else None,
            "samples_reasoning": [s.get("reasoning") for s in samples] if thought else None,
            "logprobs": _as_json(response.get("logprobs")),
            "prompt_tokens": usage.get("prompt_tokens"),
            "completion_tokens": usage.get("completion_tokens"),
            "reasoning_tokens": usage.get("reasoning_tokens"),
            "cost_usd": response.get("cost_usd"),
            "model": response.get("model"),
            "engine": response.get("engine"),
            "latency_s": response.get("latency_s"),
            "cached": bool(response.get("cached")) if row.get("response") else None,
            "error_kind": error.get("kind"),
            "error_message": error.get("message"),
        }
        for name, value in values.items():
            out[name].append(value)
    return out


def _as_json(value: Any) -> str | None:
    return None if value is None else json.dumps(value, ensure_ascii=False)
