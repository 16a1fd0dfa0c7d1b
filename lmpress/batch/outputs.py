"""Where a batch job's finished rows go: a JSONL output (a file appended to, or a stream), or a
Parquet output's journal, written out as Parquet when the run ends (`data.parquet_out`).

Either way the runner hands over one JSON line per row, in the order it finished or, with
`--ordered`, through `Reorder` in input order; what the line holds is the output's business.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lmpress.batch.events import RowFailure
from lmpress.batch.pooling import AnyResult
from lmpress.data import likelihood_rows, pooling_rows
from lmpress.data.file_formats import FileFormat
from lmpress.data.jsonl import JsonlWriter
from lmpress.data.parquet_out import journal_line, write_parquet
from lmpress.data.response_records import response_record
from lmpress.data.resume import JobFiles
from lmpress.data.row_shapes import OutputShape, ParsedRow, render_row
from lmpress.data.targets import STDIO, OutputTarget
from lmpress.vocabulary.errors import UnsupportedParamError
from lmpress.vocabulary.likelihood import LoglikelihoodResult, PerplexityResult, Tokenizer
from lmpress.vocabulary.types import Result


@dataclass
class JsonlOutput:
    """Rows rendered in the output shape asked for (lmpress rows or OpenAI Batch lines)."""

    target: OutputTarget
    files: JobFiles
    output_shape: OutputShape
    # The engine's tokenizer, for a line that echoes its prompt's tokens (set by the job).
    tokenizer: Callable[[], Tokenizer | None] = lambda: None

    def open(self) -> JsonlWriter:
        """The output: the file (appended to, for resume), or the stream as it is."""
        if not self.target.stream:
            return JsonlWriter(self.files.output, mode="a")
        if self.target.path == STDIO:
            return JsonlWriter(STDIO, handle=sys.stdout)
        path = self.target.path
        return JsonlWriter(path, handle=open(path, "a", encoding="utf-8"))

    def done_line(self, row: ParsedRow, result: AnyResult) -> dict[str, Any]:
        return render_row(row, result, self.output_shape, self.tokenizer)

    def failed_line(self, failure: RowFailure) -> dict[str, Any] | None:
        return None  # failed rows go to OUT.errors.jsonl only

    def finish(self) -> str | None:
        return None


class EngineTokenizer:
    """The job's engine's tokenizer, loaded when a line first asks; None where the engine has
    none (a remote API) or has not started."""

    def __init__(self, engine: Callable[[], Any]):
        self.engine = engine
        self.loaded: Tokenizer | None | bool = None

    def __call__(self) -> Tokenizer | None:
        engine = self.engine()
        if self.loaded is None and engine is not None:
            try:
                self.loaded = engine.tokenizer()
            except UnsupportedParamError:
                self.loaded = False
        return self.loaded or None


@dataclass
class ParquetOutput:
    """Rows journaled with their columns, and OUT.parquet written from the journal."""

    files: JobFiles
    input_schema: Any | None = None  # the input's Arrow schema, where it has one
    id_column: str | None = None
    wrote: bool = False  # a row went to the journal in this run

    def open(self) -> JsonlWriter:
        assert self.files.journal is not None
        return JsonlWriter(self.files.journal, mode="a")

    def done_line(self, row: ParsedRow, result: AnyResult) -> dict[str, Any]:
        self.wrote = True
        if row.likelihood is not None:
            assert isinstance(result, (LoglikelihoodResult, PerplexityResult))
            scores = likelihood_rows.values(row.likelihood, result)
            record = {**scores, **pooling_rows.meta(result)}
        elif row.pooling is not None:
            assert not isinstance(result, Result)
            record = {**pooling_rows.values(row.pooling, result), **pooling_rows.meta(result)}
        else:
            assert isinstance(result, Result)
            record = response_record(result)
        return journal_line(row.id, row.line, row.raw, record)

    def failed_line(self, failure: RowFailure) -> dict[str, Any] | None:
        self.wrote = True
        error = {"kind": failure.kind, "message": failure.message}
        return journal_line(failure.row_id, failure.line, failure.columns, None, error)

    def finish(self) -> str | None:
        """Write OUT.parquet when this run added rows or it is missing; what was done."""
        journal, output = self.files.journal, self.files.output
        assert journal is not None
        if not journal.exists() or (output.exists() and not self.wrote):
            return None
        rows = write_parquet(journal, output, self.input_schema, self.id_column)
        return f"wrote {output} ({rows} rows)"


class Reorder:
    """Holds finished rows until every earlier row is written (a row with no line leaves a
    gap)."""

    def __init__(self, out: JsonlWriter):
        self.out = out
        self.next = 0
        self.waiting: dict[int, dict[str, Any] | None] = {}

    @property
    def held(self) -> int:
        return len(self.waiting)

    def put(self, seq: int, line: dict[str, Any] | None) -> None:
        self.waiting[seq] = line
        while self.next in self.waiting:
            ready = self.waiting.pop(self.next)
            if ready is not None:
                self.out.write(ready)
            self.next += 1


def output_for(
    target: OutputTarget,
    files: JobFiles,
    file_format: FileFormat,
    output_shape: OutputShape,
    input_schema: Any | None = None,
    id_column: str | None = None,
) -> JsonlOutput | ParquetOutput:
    if file_format is FileFormat.PARQUET:
        return ParquetOutput(files, input_schema, id_column)
    return JsonlOutput(target, files, output_shape)
