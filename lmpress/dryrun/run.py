"""`lmpress batch --dry-run`: every picked row read as a run would read it, its prompt counted
by the engine's own tokenizer, and nothing generated (`lmpress.dryrun.tally` keeps the tally).

No output is written or checked and no model weights load: a dry run answers "what would
this job be, and what would it cost" before any of it is spent.
"""

from __future__ import annotations

from lmpress.batch.options import BatchOptions
from lmpress.batch.rows import RowReader
from lmpress.cache.responses import ResponseCache
from lmpress.configs.schema import RunConfig
from lmpress.data.sources import Source, open_source
from lmpress.data.spool import spooled
from lmpress.dryrun.tally import DryRun, DryRunSummary
from lmpress.engines.registry import load_engine_class
from lmpress.vocabulary.errors import InputError


def dry_run(config: RunConfig, options: BatchOptions) -> DryRunSummary:
    source = open_source(options.input_path, options.input_format, options.split)
    with spooled(source) as readable:  # a piped input is read twice when sampling
        return _dry_run(config, options, readable)


def _dry_run(config: RunConfig, options: BatchOptions, source: Source) -> DryRunSummary:
    selection = options.selection()
    if selection.sample is not None:  # the sample is drawn over the whole shard first
        for ordinal, _ in enumerate(source.lines()):
            if selection.in_shard(ordinal):
                selection.offer(selection.place(ordinal))
    selection.scanned()
    engine_class = load_engine_class(config.engine)
    reader = RowReader.for_job(config, options, engine_class, source=source, selection=selection)
    cache = ResponseCache.open(config, options.cache, options.cache_dir, readonly=True)
    tally = DryRun(config, cache=cache)
    try:
        for rid, read in reader.rows():
            tally.add(rid, read)
    finally:
        if cache is not None:
            cache.close()
    summary = tally.summary()
    if summary.rows == 0:
        raise InputError(f"{source.name}: the input has no rows")
    return summary
