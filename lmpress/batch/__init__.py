"""The batch runner: read rows as a stream, keep the engine's worth in flight, write each result
as it completes, and pick up where a stopped run left off.

- Input is JSONL, Parquet, CSV/TSV or a Hugging Face dataset (`data.sources`), a row at a time;
  `--prompt-template`, `--system` and `--id-column` say how columns make a conversation
  (`data.columns`); `--shard`, `--limit` and `--sample` pick the rows (`data.selection`).
- Memory stays flat: at most `engine.max_in_flight` rows are in flight (and, with `--ordered`,
  a bounded reorder window), whatever the input's size.
- Resume needs no flag: rows already in the output (a Parquet output's journal) are skipped,
  a torn last line is cut, and a re-run with other settings is refused (see `data.resume`).
  `--overwrite` starts over.
- A row that cannot be parsed or whose generation fails goes to OUT.errors.jsonl; the job goes
  on (`--on-error skip`, the default) or stops (`--on-error fail`, `--max-errors N`), as it
  does when `--max-cost` or `--max-tokens` is reached (`batch.budget`).
- Ctrl-C stops taking rows, gives those in flight a few seconds, writes the summary and exits
  130; a second Ctrl-C exits at once. The output stays valid for resume either way.

The runner shows nothing itself: it reports what happens to a `BatchEvents` (started, a row
done or failed, a notice, finished), and `cli/report.py` draws the progress bar, the failed
rows' lines and the summary table from those.
"""

from lmpress.batch.events import (
    EXIT_FAILED_ROWS,
    EXIT_INTERRUPTED,
    EXIT_OK,
    BatchEvents,
    BatchSummary,
    RowFailure,
)
from lmpress.batch.job import BatchOptions
from lmpress.batch.run import run_batch

__all__ = [
    "EXIT_FAILED_ROWS",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "BatchEvents",
    "BatchOptions",
    "BatchSummary",
    "RowFailure",
    "run_batch",
]
