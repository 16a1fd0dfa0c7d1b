"""What one batch job is asked to do, beside its config: every `lmpress batch` flag, once.

How the job runs is one field, `mode` (live, on Ray replicas, or through the provider's batch
API), and `batch.run` picks the runner from it alone.

A setting that changes what the output holds is declared here with `output_setting`, and
nowhere else: the fingerprint a resumed job is checked against (`data.resume`) is read from
those fields by `output_settings`, and every runner gets them in the options it is built with,
rows being read through `batch.rows.RowParser.for_job`. So a new such flag is one field here
and one option in `cli/batch.py`; a re-run that changes it is refused, not mixed in.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Literal, get_args

from lmpress.data.columns import RowMapping
from lmpress.data.file_formats import AUTO, Auto, FileFormat
from lmpress.data.row_shapes import OutputShape
from lmpress.data.selection import RowSelection

CHANGES_OUTPUT = "changes_output"  # the metadata key `output_setting` marks a field with
# --on-error: set a failed row aside and go on, or stop the job.
OnError = Literal["skip", "fail"]
ON_ERROR: tuple[OnError, ...] = get_args(OnError)
# --on-expired (provider batches): what becomes of a row its batch did not run.
OnExpired = Literal["resubmit", "live", "fail"]
ON_EXPIRED: tuple[OnExpired, ...] = get_args(OnExpired)


class BatchMode(str, Enum):
    """How a batch's rows are generated."""

    LIVE = "live"  # by an engine in this process
    RAY = "ray"  # by engine replicas on a Ray cluster, as the config's ray: says (--ray)
    PROVIDER = "provider"  # through the provider's batch API (--provider-batch)

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class OutputSetting:
    """How a field that changes the output is recorded in the fingerprint."""

    key: str  # its name there (kept as older outputs have it, so they still resume)
    record: Callable[[Any], Any]  # its value as JSON
    omit_empty: bool = False  # left out when empty, as older outputs left it out


def output_setting(
    key: str, record: Callable[[Any], Any] = lambda v: v, omit_empty: bool = False, **kw: Any
) -> Any:
    """A BatchOptions field whose value decides what the output holds (`dataclasses.field`'s
    arguments in `kw`)."""
    return field(metadata={CHANGES_OUTPUT: OutputSetting(key, record, omit_empty)}, **kw)


def _shard_label(shard: tuple[int, int] | None) -> str | None:
    return f"{shard[0]}/{shard[1]}" if shard else None


@dataclass
class BatchOptions:
    input_path: str
    output_path: str
    mode: BatchMode = BatchMode.LIVE
    overwrite: bool = False
    on_error: OnError = "skip"  # skip: set failed rows aside and go on; fail: stop the job
    retry_failed: bool = True  # retry rows that failed in an earlier run
    max_errors: int | None = None  # stop the job once this many rows failed
    ordered: bool = False  # write rows in input order
    # (I, N): every N-th row starting at I
    shard: tuple[int, int] | None = output_setting("shard", _shard_label, default=None)
    # what each output row looks like: follow the input's, or lmpress rows, or OpenAI lines
    output_shape: OutputShape = output_setting(
        "output_format", lambda v: OutputShape(v).value, default=OutputShape.AUTO
    )
    recipe: str | None = None  # recorded in the fingerprint
    grace_s: float = 10.0  # how long rows in flight may finish after Ctrl-C or SIGTERM
    input_format: FileFormat | Auto = AUTO  # the input's file format; auto: by its suffix
    split: str | None = None  # a Hugging Face dataset's split
    file_format: FileFormat | None = None  # the output's file format; None: by its suffix
    # how a table's columns make the conversation (--prompt-template, --system, --id-column)
    mapping: RowMapping = output_setting(
        "rows", RowMapping.settings, omit_empty=True, default_factory=RowMapping
    )
    limit: int | None = None  # the first N rows (of the shard)
    sample: int | None = None  # a random N rows (of the shard), picked by `seed`
    seed: int = 0
    max_cost: float | None = None  # USD this run may spend
    max_tokens: int | None = None  # tokens this run may use
    on_expired: OnExpired = "resubmit"  # provider batches: rows a batch did not run
    # The response cache (lmpress/cache/): on, all, refresh or off, and where it lives (None:
    # $LMPRESS_RESPONSE_CACHE or lmpress's cache directory). A hit is the reply a live request
    # would give, so neither changes what the output holds.
    cache: str = "on"
    cache_dir: str | None = None
    # --strict-model: a line naming another model than the job's fails with vLLM's 404 line
    # (else it is answered by the job's model, and counted).
    strict_model: bool = output_setting("strict_model", omit_empty=True, default=False)

    def selection(self) -> RowSelection:
        return RowSelection(self.shard, self.limit, self.sample, self.seed)

    def output_settings(self) -> dict[str, Any]:
        """Every setting that decides what the output holds, by its fingerprint key."""
        settings = {}
        for item in dataclasses.fields(self):
            setting: OutputSetting | None = item.metadata.get(CHANGES_OUTPUT)
            if setting is None:
                continue
            value = setting.record(getattr(self, item.name))
            if value or not setting.omit_empty:
                settings[setting.key] = value
        return settings


def output_fields() -> list[dataclasses.Field]:
    """The BatchOptions fields that change the output."""
    return [item for item in dataclasses.fields(BatchOptions) if CHANGES_OUTPUT in item.metadata]
