"""`lmpress eval`: lm-evaluation-harness's tasks on the recipe's engine (integrations/lm_eval).

lm-eval, its tasks and the engine's backend are imported once the command runs, so `lmpress
--help` loads none of them."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from lmpress.cli.options import (
    FLAG,
    EngineOpt,
    RecipeOpt,
    ReportOpt,
    check_report,
    debug_wanted,
    load_run_config,
    write_report,
)
from lmpress.vocabulary.errors import ConfigError, EngineUnavailableError


def evaluate(
    ctx: typer.Context,
    recipe: RecipeOpt = None,
    engine: EngineOpt = None,
    tasks: Annotated[
        str, typer.Option("--tasks", help="lm-eval task names, comma-separated: T1,T2.")
    ] = "",
    output: Annotated[
        str,
        typer.Option("-o", "--output", help="Directory for the results, samples and summary."),
    ] = "",
    include_path: Annotated[
        str | None,
        typer.Option("--include-path", help="A directory of task YAML (and data) files."),
    ] = None,
    limit: Annotated[
        float | None,
        typer.Option("--limit", help="Samples per task at most (below 1: a fraction of them)."),
    ] = None,
    num_fewshot: Annotated[
        int | None, typer.Option("--num-fewshot", help="Examples shown before each question.")
    ] = None,
    max_length: Annotated[
        int | None,
        typer.Option("--max-length", help="Tokens a request reads at most (default: the model's)."),
    ] = None,
    resume: Annotated[
        bool,
        typer.Option(
            "--resume/--no-resume",
            help="Reuse the answers an earlier run into the same -o got.",
            metavar=FLAG,
        ),
    ] = True,
    report: ReportOpt = False,
) -> None:
    """Evaluate the recipe's model on lm-evaluation-harness tasks, batched by the engine.

    [bold]lmpress eval -c smollm2 --engine NATIVE --tasks hellaswag --limit 100 -o results/[/bold]

    Writes lm-eval's results JSON and per-sample logs under -o, and a summary table
    (summary.md, also printed). With no network, give the tasks as YAML and data files with
    --include-path DIR. Needs the eval extra: pip install 'lmpress\\[eval]'.
    """
    names = [t.strip() for t in tasks.split(",") if t.strip()]
    if not names:
        raise ConfigError("--tasks: name at least one lm-eval task, e.g. --tasks hellaswag")
    if not output:
        raise ConfigError("-o DIR: say where the results go")
    config, words = load_run_config(ctx, recipe, engine)
    if words:
        raise ConfigError(f"unexpected argument '{words[0]}' (tasks go in --tasks T1,T2)")
    if report:
        check_report(output)
    if limit is not None and limit <= 0:
        raise ConfigError("--limit: give a number of samples above 0, or a fraction below 1")
    if not debug_wanted(ctx):
        # lm-eval draws a bar for each of its own steps (building requests, reading its answers
        # database); tqdm reads this when it is imported, so it is set before lm-eval loads.
        os.environ.setdefault("TQDM_DISABLE", "1")
    try:
        from lmpress.integrations.lm_eval.run import run_eval
    except ModuleNotFoundError as exc:
        if exc.name is None or not exc.name.startswith("lm_eval"):
            raise
        raise EngineUnavailableError(
            "lmpress eval needs lm-eval: pip install 'lmpress[eval]'"
        ) from None
    count = int(limit) if limit is not None and limit >= 1 else limit
    table = run_eval(
        config,
        names,
        Path(output),
        include_path=include_path,
        limit=count,
        num_fewshot=num_fewshot,
        resume=resume,
        max_length=max_length,
        say=lambda line: print(f"lmpress: {line}", file=sys.stderr),
    )
    print(table)
    if report:
        write_report(output)
