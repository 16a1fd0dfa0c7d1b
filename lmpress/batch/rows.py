"""The rows a job runs, each read into a request or into the reason it cannot run: what the
batch runner and the dry run share, so that a dry run counts exactly the rows a run would."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from lmpress.batch.events import RowFailure
from lmpress.batch.options import BatchOptions
from lmpress.batch.pooling import AnyRequest
from lmpress.batch.tasks import RunTasks
from lmpress.configs.overrides import generation_with_overrides
from lmpress.configs.schema import RunConfig
from lmpress.data.columns import RowMapping
from lmpress.data.jsonl import Line
from lmpress.data.messages import json_type
from lmpress.data.openai_batch import is_batch_request
from lmpress.data.row_shapes import (
    OutputShape,
    ParsedRow,
    RowError,
    RowShape,
    output_shape_for,
    parse_row,
    row_id,
)
from lmpress.data.selection import RowSelection
from lmpress.data.sources import Source
from lmpress.engines.adapters import adapter_for
from lmpress.engines.base import Engine, check_params, check_tools
from lmpress.vocabulary.embeddings import Task
from lmpress.vocabulary.errors import ErrorKind, LmpressError, RequestError, UnsupportedParamError
from lmpress.vocabulary.types import GenerationParams

Read = tuple[ParsedRow, AnyRequest] | RowFailure
ADAPTER_COLUMN = "adapter"  # the column a row chooses its adapter by (model.adapters' names)
P = TypeVar("P", bound="RowParser")


@dataclass
class RowParser:
    """One line of the input into its row and request, or into why it cannot run. A Ray
    replica parses its rows with this (`batch.cluster`), the rows it is sent being lines."""

    mapping: RowMapping
    base: GenerationParams  # the config's generation settings, which a row may override
    engine_class: type[Engine]
    output_shape: OutputShape = OutputShape.AUTO  # how failed rows are recorded
    task: Task = "generate"  # the run's (vocabulary/embeddings.py): which row shapes it takes
    tasks: RunTasks | None = None  # the tasks its rows may ask (`for_job` sets it)
    config: RunConfig | None = None  # the run's: the adapters a row may choose (`for_job`)

    @classmethod
    def for_job(
        cls: type[P],
        config: RunConfig,
        options: BatchOptions,
        engine_class: type[Engine],
        **more: Any,
    ) -> P:
        """How every runner, and the dry run, reads a job's rows: as its options say."""
        shape = options.output_shape
        task: Task = config.task  # type: ignore[assignment]  # checked by configs.loading
        tasks = RunTasks.of(config, engine_class)
        return cls(
            options.mapping, config.generation, engine_class, shape, task, tasks, config, **more
        )

    def read(self, line: Line) -> tuple[str, Read]:
        if line.error:
            rid = line_id(line.number)
            openai = self.output_shape == OutputShape.OPENAI  # OpenAI's error line, asked for
            return rid, RowFailure(
                line.number, rid, ErrorKind.INVALID_JSON, line.error, None, openai
            )
        value = line.value
        columns = value if isinstance(value, dict) else None
        rid = line_row_id(line, self.mapping.id_column)
        try:
            row = parse_row(value, line.number, mapping=self.mapping, task=self.task)
        except RowError as exc:
            openai = self.output_shape == OutputShape.OPENAI or (
                self.output_shape == OutputShape.AUTO and columns is not None
                and is_batch_request(columns)
            )  # fmt: skip
            failure = RowFailure(
                line.number, rid, ErrorKind.INVALID_ROW, str(exc), None, openai, columns
            )
            return rid, failure
        openai = output_shape_for(row, self.output_shape) is OutputShape.OPENAI
        if (refused := self._refusal(row)) is not None:
            return rid, RowFailure(
                line.number, rid, ErrorKind.INVALID_ROW, refused, None, openai, columns
            )
        try:
            row.adapter = self._adapter(row)
        except RowError as exc:
            kind, message = ErrorKind.INVALID_ROW, str(exc)
            return rid, RowFailure(line.number, rid, kind, message, None, openai, columns)
        except RequestError as exc:  # a name this run does not serve: vLLM's 404
            return rid, RowFailure(
                line.number, rid, exc.kind, str(exc), exc.status, openai, columns
            )
        asked = row.pooling or row.likelihood
        if asked is not None:  # no generation settings to apply
            return rid, (row, asked.request(row.id))
        try:
            params = generation_with_overrides(self.base, row.overrides, source="generation")
            check_params(self.engine_class, params)
            request = row.request(params)
            check_tools(self.engine_class, request)
        except LmpressError as exc:
            kind = (
                ErrorKind.UNSUPPORTED_PARAM
                if isinstance(exc, UnsupportedParamError)
                else ErrorKind.INVALID_ROW
            )
            return rid, RowFailure(line.number, rid, kind, str(exc), None, openai, columns)
        return rid, (row, request)

    def _adapter(self, row: ParsedRow) -> str | None:
        """The adapter a row chose: its line's `model` where that names one (any other name is
        routed by the job, `batch.line_models`), or its `adapter` column, which must name one
        this run serves: an unknown name raises vLLM's 404 (RequestError)."""
        if self.config is None:
            return None
        if row.shape is RowShape.OPENAI_BATCH:  # another name is the job's to route or refuse
            adapters = self.config.model.adapters  # (batch.line_models: --models, the 404)
            chosen = row.model if row.model in adapters else None
        else:
            name = row.raw.get(ADAPTER_COLUMN)
            if name is not None and not isinstance(name, str):
                raise RowError(
                    f"'{ADAPTER_COLUMN}' must be a string, the name of one of model.adapters "
                    f"(or null for the base model), got {json_type(name)}"
                )
            served = self.config.serve.served_model_name  # serve's /v1/batches answers to it
            chosen = adapter_for(self.config, name, served, strict=True)
        if chosen is not None and (row.pooling or row.likelihood) is not None:
            raise RowError(
                f"adapter '{chosen}': only generated replies run on an adapter, this "
                f"{row.task} row runs on the base model; drop its adapter"
            )
        return chosen

    def _refusal(self, row: ParsedRow) -> str | None:
        return self.tasks.refusal(row) if self.tasks is not None else None


@dataclass
class RowReader(RowParser):
    source: Source | None = None
    selection: RowSelection = field(default_factory=RowSelection)

    def rows(self) -> Iterator[tuple[str, Read]]:
        """Each picked row's id, and its parsed row and request or why it cannot run."""
        assert self.source is not None
        for ordinal, line in enumerate(self.source.lines()):
            if self.selection.picks(ordinal):
                yield self.read(line)


def line_row_id(line: Line, id_column: str | None = None) -> str:
    """The id of the row a line holds, whether or not it can run."""
    if line.error or not isinstance(line.value, dict):
        return line_id(line.number)
    return row_id(line.value, line.number, id_column)


def line_id(line_no: int) -> str:
    """The id of a line that has none of its own because it is not a JSON object."""
    return f"line-{line_no}"
