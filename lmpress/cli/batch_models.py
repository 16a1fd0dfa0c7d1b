"""`lmpress batch --models A,B,C`: the models read and checked before any work, and with
`--compare` the report on how their replies compare (lmpress/batch/compare.py), read from the
merged output. cli/batch.py runs the job (lmpress/batch/several.py)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from lmpress.vocabulary.errors import ConfigError

if TYPE_CHECKING:
    from lmpress.batch import BatchOptions
    from lmpress.batch.several import ModelRun, SeveralSummary


def model_runs(ctx: typer.Context, models: str, engine: str | None) -> list[ModelRun]:
    """Each --models name (a bundled recipe or a recipe's path, as -c takes) with its config:
    the command line's overrides apply to every model. A bad name is refused naming it."""
    from lmpress.batch.several import ModelRun
    from lmpress.configs import load_config, parse_overrides
    from lmpress.engines.registry import check_engine, with_model_task

    labels = [label.strip() for label in models.split(",")]
    if any(not label for label in labels):
        raise ConfigError(f"--models {models}: an empty name; give recipes as A,B,C")
    repeated = sorted({label for label in labels if labels.count(label) > 1})
    if repeated:
        raise ConfigError(f"--models: '{repeated[0]}' is named twice; name each model once")
    overrides, _ = parse_overrides(ctx.args)
    runs = []
    for label in labels:
        try:
            config = load_config(label, overrides, engine=engine)
            check_engine(config)
            config = with_model_task(config)
        except ConfigError as exc:
            raise ConfigError(f"--models: model '{label}': {exc}") from exc
        runs.append(ModelRun(label, config))
    tasks = {run.config.task for run in runs}
    if len(tasks) > 1:
        raise ConfigError(f"--models: the models run different tasks ({', '.join(sorted(tasks))})")
    return runs


def check_several(
    input: str | None, output: str | None, recipe: str | None, dry_run: bool = False
) -> None:
    if recipe:
        raise ConfigError("--models names every model's recipe: drop -c (or add it to --models)")
    if dry_run:
        return
    if input in (None, "-") or output in (None, "-"):
        raise ConfigError(
            "--models reads the input once per model and writes a part per model beside the "
            "output: give -i FILE and -o FILE (not - for stdin or stdout)"
        )


def write_comparison(summary: SeveralSummary, options: BatchOptions) -> None:
    """--compare: the report, read from the merged output a row at a time, written beside it
    (OUT.compare.md) and printed."""
    from lmpress.batch.compare import compare

    labels = [label for label, _ in summary.models]
    text = compare(labels, merged_rows(options)).markdown()
    path = Path(options.output_path).expanduser()
    report = path.with_name(f"{path.name}.compare.md")
    report.write_text(text, encoding="utf-8")
    print(text, end="")
    print(f"lmpress: wrote {report}", file=sys.stderr)


def merged_rows(options: BatchOptions):
    """(model, row id, line) of every row of a --models job's output."""
    from lmpress.data.row_shapes import output_row_id

    path = Path(options.output_path).expanduser()
    id_column = options.mapping.id_column
    if path.suffix in (".parquet", ".pq"):
        import pyarrow.parquet as pq

        for batch in pq.ParquetFile(path).iter_batches():
            for line in batch.to_pylist():
                rid = output_row_id(line, id_column)
                if rid is not None and line.get("error_kind") is None:
                    yield line["model"], rid, line
        return
    from lmpress.batch.model_parts import part_lines

    for line in part_lines(path):
        rid = output_row_id(line, id_column)
        model = line.get("model") or _body_model(line)
        if rid is not None and model is not None:
            yield model, rid, line


def _body_model(line: dict) -> str | None:
    response = line.get("response")
    body = response.get("body") if isinstance(response, dict) else None
    return body.get("model") if isinstance(body, dict) else None
