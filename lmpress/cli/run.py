"""`lmpress run`: a pipeline file (lmpress/pipeline/) over an input, into an output directory;
the flags go into one `RunOptions` and `pipeline/job.py` does the rest."""

from __future__ import annotations

from typing import Annotated

import typer

from lmpress.cli.options import FLAG, CacheOpt, ReportOpt, check_report, write_report


def run(
    pipeline: Annotated[str, typer.Argument(help="The pipeline file (YAML).", metavar="PIPELINE")],
    input: Annotated[
        str,
        typer.Option(
            "-i",
            "--input",
            help="Input rows: JSONL, Parquet, CSV/TSV or a dataset.",
            metavar="PATH",
        ),
    ],
    output: Annotated[
        str, typer.Option("-o", "--output", help="The output directory.", metavar="DIR")
    ],
    format: Annotated[
        str,
        typer.Option("--format", help="The dataset's format: jsonl, parquet or hf.", metavar="FMT"),
    ] = "jsonl",
    rerun_from: Annotated[
        str | None,
        typer.Option("--from", help="Run this step and every later one again.", metavar="STEP"),
    ] = None,
    limit: Annotated[
        int | None, typer.Option("--limit", help="Only the first N input rows.", min=0, metavar="N")
    ] = None,
    keep_steps: Annotated[
        bool,
        typer.Option("--keep-steps", help="Write each step's rows to OUT/steps/.", metavar=FLAG),
    ] = False,
    cache: CacheOpt = "on",
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Print each step's estimated rows, tokens and cost; load no model, send nothing.",
            metavar=FLAG,
        ),
    ] = False,
    max_cost: Annotated[
        float | None,
        typer.Option(
            "--max-cost", help="Stop once this run's steps have spent USD.", metavar="USD"
        ),
    ] = None,
    ray: Annotated[
        bool,
        typer.Option("--ray", help="Not supported by `lmpress run` yet (refused).", metavar=FLAG),
    ] = False,
    report: ReportOpt = False,
) -> None:
    """Run a pipeline of steps (generate, judge, filter, map, dedupe) over a dataset.

    [bold]lmpress run pipeline.yaml -i topics.jsonl -o out/[/bold]

    Rows stream from step to step; each step journals what it did in OUT/.lmpress, so the same
    command after a kill, or after editing a step, redoes only what is unfinished or changed.
    Writes the dataset (JSONL, or --format parquet|hf), OUT/rejects.jsonl (dropped and failed
    rows, with the step and why) and the dataset card, OUT/README.md. Exit 1 when a row failed (the rejects say why; the same command tries it again) or --max-cost stopped the run.
    --dry-run prints each step's estimated rows, tokens and cost (rates from a step's
    `estimate: {fan_out, keep}`, or measured from an earlier run into OUT).
    """
    from lmpress.pipeline.job import RunOptions, run_pipeline
    from lmpress.vocabulary.errors import ConfigError

    if ray:
        raise ConfigError(
            "--ray: a pipeline's steps cannot run on Ray replicas yet; run without --ray, or "
            "put a step's model behind a server (`lmpress serve`) and point its api_url there"
        )
    options = RunOptions(
        pipeline, input, output, format, rerun_from, limit, keep_steps, cache, max_cost=max_cost
    )
    if dry_run:
        from lmpress.pipeline.dryrun import dry_run_pipeline

        dry_run_pipeline(options)
        return
    if report:
        check_report(output)
    facts = run_pipeline(options)
    if report:
        write_report(output)
    if facts.stopped_because or any(step.failed for step in facts.steps):
        raise typer.Exit(1)
