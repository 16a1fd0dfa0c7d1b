"""`lmpress batch`: check every path and flag before any work, fill the job's `BatchOptions`
(lmpress/batch/options.py), run it (lmpress/batch/run.py), and draw its progress and summary
(cli/report.py)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from lmpress.cli.options import (
    FLAG,
    STOP_GRACE_S,
    CacheDirOpt,
    CacheOpt,
    EngineOpt,
    RecipeOpt,
    ReportOpt,
    StopGraceOpt,
    check_cache_mode,
    check_report,
    load_run_config,
    unexpected,
    write_report,
)
from lmpress.data.file_formats import INPUT_FORMATS
from lmpress.vocabulary.errors import DISK_ERRNOS, ConfigError, InputError, OutputWriteError

if TYPE_CHECKING:
    from lmpress.batch import BatchOptions
    from lmpress.configs.schema import RunConfig
    from lmpress.data.file_formats import FileFormat
    from lmpress.data.row_shapes import OutputShape

_INPUT_FORMATS = f"{', '.join(f.value for f in INPUT_FORMATS[:-1])} or {INPUT_FORMATS[-1]}"


def batch(
    ctx: typer.Context,
    input: Annotated[
        str | None,
        typer.Option(
            "-i",
            "--input",
            help="Input: JSONL (.gz .zst .bz2 .xz too), Parquet, CSV/TSV, or a Hugging Face "
            "dataset (a save_to_disk or data directory, or hf:ORG/NAME); - for stdin (a pipe "
            "or FIFO too: JSONL, or CSV/TSV with --input-format).",
        ),
    ] = None,
    output: Annotated[
        str | None,
        typer.Option(
            "-o", "--output", help="Output: JSONL (compressed too), .parquet, or - for stdout."
        ),
    ] = None,
    recipe: RecipeOpt = None,
    engine: EngineOpt = None,
    overwrite: Annotated[
        bool,
        typer.Option(
            "--overwrite", help="Start over instead of resuming the output.", metavar=FLAG
        ),
    ] = False,
    on_error: Annotated[
        str, typer.Option("--on-error", help="skip: set failed rows aside and go on; fail: stop.")
    ] = "skip",
    no_retry_failed: Annotated[
        bool,
        typer.Option(
            "--no-retry-failed", help="Leave rows that failed before aside.", metavar=FLAG
        ),
    ] = False,
    max_errors: Annotated[
        int | None, typer.Option("--max-errors", help="Stop once this many rows failed.")
    ] = None,
    ordered: Annotated[
        bool,
        typer.Option("--ordered", help="Write rows in input order (bounded buffer).", metavar=FLAG),
    ] = False,
    shard: Annotated[
        str | None, typer.Option("--shard", help="I/N: every N-th row starting at I.")
    ] = None,
    output_format: Annotated[
        str,
        typer.Option(
            "--output-format",
            help="auto (by suffix; rows follow the input), jsonl, parquet, lmpress (JSONL "
            "rows) or openai (OpenAI Batch lines).",
        ),
    ] = "auto",
    input_format: Annotated[
        str,
        typer.Option("--input-format", help=f"auto (by suffix), {_INPUT_FORMATS}."),
    ] = "auto",
    split: Annotated[
        str | None, typer.Option("--split", help="The split of a Hugging Face dataset.")
    ] = None,
    prompt_template: Annotated[
        str | None,
        typer.Option(
            "--prompt-template",
            help="Make the user turn from columns: 'Summarize: {text}' or Jinja "
            "'{{ text }}'. A 'messages' column is used as it is.",
        ),
    ] = None,
    system: Annotated[
        str | None, typer.Option("--system", help="A system turn for every row without one.")
    ] = None,
    id_column: Annotated[
        str | None, typer.Option("--id-column", help="The column holding each row's id.")
    ] = None,
    text_column: Annotated[
        str | None,
        typer.Option(
            "--text-column",
            help="With --task embed or perplexity: the column to embed or score.",
        ),
    ] = None,
    limit: Annotated[int | None, typer.Option("--limit", help="Only the first N rows.")] = None,
    sample: Annotated[
        int | None, typer.Option("--sample", help="A random N rows (reproducible with --seed).")
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="The seed --sample picks with.")] = 0,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Read and tokenize every row; print rows, tokens and cost; generate nothing.",
            metavar=FLAG,
        ),
    ] = False,
    max_cost: Annotated[
        float | None, typer.Option("--max-cost", help="Stop once this run has spent USD.")
    ] = None,
    max_tokens: Annotated[
        int | None, typer.Option("--max-tokens", help="Stop once this run has used N tokens.")
    ] = None,
    provider_batch: Annotated[
        bool,
        typer.Option(
            "--provider-batch",
            help="Run through the provider's batch API (OpenAI: generate and embed runs; "
            "Anthropic: generate): half the price, within 24h; re-run to resume waiting.",
            metavar=FLAG,
        ),
    ] = False,
    ray: Annotated[
        bool,
        typer.Option(
            "--ray",
            help="Generate on Ray replicas, as the recipe's ray: section says; "
            "--ray.address joins a cluster, else a local Ray starts.",
            metavar=FLAG,
        ),
    ] = False,
    on_expired: Annotated[
        str,
        typer.Option(
            "--on-expired", help="Rows a provider batch did not run: resubmit, live, fail."
        ),
    ] = "resubmit",
    stop_grace: StopGraceOpt = STOP_GRACE_S,
    cache: CacheOpt = "on",
    cache_dir: CacheDirOpt = None,
    models: Annotated[
        str | None,
        typer.Option(
            "--models",
            help="Run every row through each of these models (recipe names or paths, A,B,C; "
            "instead of -c): one output row per row and model, with a model column.",
        ),
    ] = None,
    compare: Annotated[
        bool,
        typer.Option(
            "--compare",
            help="With --models: write OUT.compare.md (and print it): replies that agree, "
            "length and refusal rates, scored rows' metrics per model.",
            metavar=FLAG,
        ),
    ] = False,
    strict_model: Annotated[
        bool,
        typer.Option(
            "--strict-model",
            help="A line naming another model than the job's fails with a 404 error line, "
            "as vLLM's run-batch does (else the job's model answers it, and it is counted).",
            metavar=FLAG,
        ),
    ] = False,
    report: ReportOpt = False,
    status: Annotated[
        str | None,
        typer.Option(
            "--status", help="Show the provider batches of the job writing OUT.", metavar="OUT"
        ),
    ] = None,
    cancel: Annotated[
        str | None,
        typer.Option(
            "--cancel", help="Cancel the provider batches of the job writing OUT.", metavar="OUT"
        ),
    ] = None,
) -> None:
    """Run every row of a file or dataset through the model, writing each result as it completes.

    Re-running the same command resumes: rows already written are skipped. Failed rows go to
    OUT.errors.jsonl and are retried on the next run. Ctrl-C or SIGTERM stops taking rows,
    lets those in flight finish (--stop-grace), and writes the output and the summary. Exit
    code 0 when every row succeeded, 1 when any failed (or the output could not be written),
    2 for a usage or config error, 130 after Ctrl-C, 143 after SIGTERM.
    """
    config, words = load_run_config(ctx, recipe, engine)
    if words:
        raise ConfigError(unexpected(words[0], "batch reads rows from -i FILE"))
    from lmpress.batch import BatchMode, BatchOptions
    from lmpress.batch.options import ON_ERROR, ON_EXPIRED
    from lmpress.batch.run import RAY_WITH_PROVIDER, batch_mode
    from lmpress.data.columns import RowMapping
    from lmpress.engines.registry import with_model_task

    if on_error not in ON_ERROR:
        raise ConfigError(f"--on-error {on_error}: use {' or '.join(ON_ERROR)}")
    output_shape, file_format = split_output_format(output_format)
    if max_errors is not None and max_errors < 1:
        raise ConfigError("--max-errors: must be at least 1")
    if on_expired not in ON_EXPIRED:
        raise ConfigError(f"--on-expired {on_expired}: use {', '.join(ON_EXPIRED)}")
    mode = BatchMode.PROVIDER if provider_batch else BatchMode.LIVE
    options = BatchOptions(
        input_path="",
        output_path="",
        mode=BatchMode.RAY if ray else mode,
        overwrite=overwrite,
        on_error=on_error,
        retry_failed=not no_retry_failed,
        max_errors=max_errors,
        ordered=ordered,
        shard=parse_shard(shard) if shard else None,
        output_shape=output_shape,
        recipe=recipe,
        input_format=input_format,
        split=split,
        file_format=file_format,
        mapping=RowMapping(prompt_template, system, id_column, text_column),
        limit=limit,
        sample=sample,
        seed=seed,
        max_cost=max_cost,
        max_tokens=max_tokens,
        on_expired=on_expired,
        grace_s=stop_grace,
        cache=check_cache_mode(cache),
        cache_dir=cache_dir,
        strict_model=strict_model,
    )
    report = bool(report and not (dry_run or status or cancel))
    if report:
        check_report(output or config.output_path)
    if models is not None:
        code = several(ctx, models, engine, input, output, options, compare, dry_run)
        raise typer.Exit(_reported(code, options, report))
    if compare:
        raise ConfigError("--compare compares the models of a --models job: add --models A,B")
    if ray and provider_batch:
        raise ConfigError(RAY_WITH_PROVIDER)
    if not (status or cancel or dry_run):
        # Before the model's task is read (for a checkpoint, an import of its backend): a
        # missing input or an output that cannot be written is said at once.
        check_paths(config, input, output, options)
    config = with_model_task(config)  # where no task was chosen: MiniLM embeds
    if text_column is not None and config.task not in ("embed", "perplexity"):
        raise ConfigError(
            f"--text-column: only an embed or perplexity run reads it (task is {config.task})"
        )
    options.mode = batch_mode(config, options)  # a recipe's provider batch is one
    if status or cancel:
        from lmpress.batch.provider.control import show_or_cancel

        raise typer.Exit(show_or_cancel(config, status or cancel, cancel=bool(cancel)))
    if dry_run:
        raise typer.Exit(dry_run_file(config, input, options))
    raise typer.Exit(_reported(run_file(config, input, output, options), options, report))


def _reported(code: int, options: BatchOptions, report: bool) -> int:
    """--report: the run's report, written whatever became of its rows."""
    if report:
        write_report(options.output_path)
    return code


def several(
    ctx: typer.Context,
    models: str,
    engine: str | None,
    input: str | None,
    output: str | None,
    options: BatchOptions,
    compare: bool,
    dry_run: bool,
) -> int:
    """`--models A,B,C`: the job across several models (cli/batch_models.py), or its dry run:
    each model's table."""
    import asyncio
    import sys

    from lmpress.batch.several import run_several
    from lmpress.cli.batch_models import check_several, model_runs, write_comparison
    from lmpress.cli.report import BatchReport, models_table

    check_several(input, output, options.recipe, dry_run)
    runs = model_runs(ctx, models, engine)
    if dry_run:
        for run in runs:
            print(f"lmpress: model {run.label}", file=sys.stderr)
            dry_run_file(run.config, input, options)
        return 0
    check_paths(runs[0].config, input, output, options)
    report = BatchReport()
    summary = asyncio.run(run_several(runs, options, events=report))
    models_table(summary, report.stream)
    if compare:
        write_comparison(summary, options)
    return summary.exit_code


def run_file(
    config: RunConfig, input: str | None, output: str | None, options: BatchOptions | None = None
) -> int:
    """Run a file through the batch runner with the progress bar and summary table; the exit
    code. `infer --input_path` comes here too."""
    import asyncio

    from lmpress.batch import BatchOptions, run_batch
    from lmpress.cli.report import BatchReport
    from lmpress.engines.registry import load_engine_class

    options = options or BatchOptions("", "")
    if not options.output_path:  # `lmpress batch` checked them first
        check_paths(config, input, output, options)
    load_engine_class(config.engine)  # an engine that cannot load is refused before any work
    report = BatchReport()
    summary = asyncio.run(run_batch(config, options, events=report))
    report.summary_table(summary)
    return summary.exit_code


def check_paths(
    config: RunConfig, input: str | None, output: str | None, options: BatchOptions
) -> None:
    """Every path checked before anything is opened for writing or any model loads: the input
    exists and its format is known, the output can be written and is not a file lmpress does
    not own. Sets the options' paths."""
    from lmpress.data.resume import JobFiles
    from lmpress.data.sources import open_source
    from lmpress.data.targets import output_file_format, resolve_output

    input_path = input or config.input_path
    output_path = output or config.output_path
    if not input_path:
        raise ConfigError("no input: give -i FILE or set input_path")
    if not output_path:
        raise ConfigError("no output: give -o FILE (or - for stdout) or set output_path")
    open_source(input_path, options.input_format, options.split)
    file_format = output_file_format(output_path, options.file_format)
    files = JobFiles.found(output_path, file_format)
    target = resolve_output(output_path, input_path, files.side_files)
    if not target.stream:
        _check_writable(output_path)
    options.input_path, options.output_path = input_path, output_path


def dry_run_file(config: RunConfig, input: str | None, options: BatchOptions) -> int:
    """Read and count every picked row without generating: the dry run's table. A provider
    batch the real run would refuse (no batch API for the engine or the task) is refused here
    too, before any row is read, rather than priced."""
    from lmpress.batch.pooling import check_mode
    from lmpress.cli.report import dry_run_table
    from lmpress.dryrun.run import dry_run

    input_path = input or config.input_path
    if not input_path:
        raise ConfigError("no input: give -i FILE or set input_path")
    check_mode(config, options.mode)
    options.input_path = input_path
    dry_run_table(dry_run(config, options))
    return 0


def _check_writable(path: str) -> None:
    """Fail before any work if the output cannot be created (access() lies to root)."""
    target = Path(path).expanduser()
    # A file that does not exist yet is not created here: one that appeared and vanished
    # would confuse whoever watches the output (a scratch file beside it is tried instead).
    probe = target if target.exists() else target.with_name(f".{target.name}.probe")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with probe.open("a"):
            pass
    except OSError as exc:
        if exc.errno in DISK_ERRNOS:
            raise OutputWriteError(path, exc, started=False) from exc
        raise InputError(f"{path}: cannot write output ({exc.strerror})") from exc
    if probe != target:
        probe.unlink(missing_ok=True)  # two jobs starting at once share the probe


def split_output_format(word: str) -> tuple[OutputShape, FileFormat | None]:
    """`--output-format` names either what each output row looks like or how the output file
    is stored: (the row shape, the file format, None when the suffix says)."""
    from lmpress.data.file_formats import OUTPUT_FORMATS, FileFormat
    from lmpress.data.row_shapes import OutputShape

    if word in (f.value for f in OUTPUT_FORMATS):
        return OutputShape.AUTO, FileFormat(word)
    if word in (s.value for s in OutputShape):
        return OutputShape(word), None
    choices = ", ".join([s.value for s in OutputShape] + [f.value for f in OUTPUT_FORMATS])
    raise ConfigError(f"--output-format {word}: use {choices}")


def parse_shard(text: str) -> tuple[int, int]:
    """'I/N' -> (I, N) with 0 <= I < N."""
    index, slash, count = text.partition("/")
    try:
        i, n = int(index), int(count)
    except ValueError:
        i = n = -1
    if not slash or n < 1 or not 0 <= i < n:
        raise InputError(f"--shard {text}: expected I/N with 0 <= I < N, e.g. 0/4")
    return i, n
