"""`lmpress eval`: lm-eval's tasks on a recipe's engine, through `LmpressLM`.

What lands in the output directory is what lm-eval's own command line writes there, so tools
that read lm-eval's output read lmpress's: `<model>/results_<date>.json` (the metrics and the
run's config) and `<model>/samples_<task>_<date>.jsonl` (each sample's prompt, answers and
metrics); beside them `summary.md`, the table lm-eval prints, and `requests/`, lm-eval's
database of answers for this model, keyed by each request. A run that stops (Ctrl-C, a crash)
leaves every answer it got there, and the same command run again asks the engine only for the
rest (`--no-resume` starts afresh).
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmpress.vocabulary.errors import ConfigError

if TYPE_CHECKING:
    from lmpress.configs.schema import RunConfig


def run_eval(
    config: RunConfig,
    tasks: list[str],
    output: Path,
    include_path: str | None = None,
    limit: float | None = None,
    num_fewshot: int | None = None,
    resume: bool = True,
    max_length: int | None = None,
    say: Callable[[str], None] = print,
) -> str:
    """Evaluate the config's model on `tasks` and write the results under `output`; returns
    the summary table. `say` gets a line on the answers an earlier run had already got."""
    from lm_eval import simple_evaluate
    from lm_eval.loggers import EvaluationTracker

    from lmpress.integrations.lm_eval.model import LmpressLM

    _quiet_lm_eval()
    manager = task_manager(tasks, include_path)
    requests = output / "requests"
    if not resume:
        shutil.rmtree(requests, ignore_errors=True)
    model = LmpressLM(config=config, max_length=max_length)
    tracker = EvaluationTracker(output_path=str(output))
    try:
        results = simple_evaluate(
            model=model,
            model_args={"model": config.model.model_name, "engine": config.engine},
            tasks=tasks,
            num_fewshot=num_fewshot,
            limit=limit,
            use_cache=str(requests / run_digest(config, model.max_length)),
            log_samples=True,
            evaluation_tracker=tracker,
            task_manager=manager,
        )
    finally:
        model.close()
    assert results is not None  # None only on another rank of a distributed run
    asked = sum(len(sample["resps"]) for task in results["samples"].values() for sample in task)
    if asked > model.answered:
        say(
            f"{asked - model.answered} of {asked} requests answered by an earlier run into "
            f"{output} (--no-resume asks them again)"
        )
    return write_results(results, tracker, output)


def task_manager(tasks: list[str], include_path: str | None) -> Any:
    """lm-eval's tasks, with the YAML files under `include_path`; an unknown name refused in
    one line before any model loads."""
    from lm_eval.tasks import TaskManager

    if include_path is not None and not Path(include_path).is_dir():
        raise ConfigError(f"--include-path {include_path}: not a directory of task YAML files")
    if include_path is not None:
        # Indexing lm-eval's own ~15,000 task files takes 6-10 s at every start: tasks that
        # all stand alone under --include-path are found without it. A group or tag there
        # may name lm-eval's own tasks, so it takes the whole index.
        own = TaskManager(include_path=include_path, include_defaults=False)
        entries = [own.task_index.get(t) for t in tasks]
        if all(e is not None and e.kind.name in ("TASK", "PY_TASK") for e in entries):
            return own
    manager = TaskManager(include_path=include_path)
    unknown = [t for t in tasks if t not in set(manager.all_tasks)]
    if unknown:
        where = f"under {include_path}" if include_path else "(give --include-path DIR)"
        raise ConfigError(f"--tasks: no task named {', '.join(unknown)} {where}")
    return manager


def run_digest(config: RunConfig, max_length: int) -> str:
    """The name of this model's answers database: the engine, the model by the content of its
    files and its settings, and the window size, so another model never reads its answers."""
    from lmpress.cache.keys import RunKey

    run = {"engine": config.engine, "model": RunKey(config).model, "max_length": max_length}
    text = json.dumps(run, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def write_results(results: dict, tracker: Any, output: Path) -> str:
    """lm-eval's results JSON and per-sample logs, as its command line writes them, and the
    summary table (`summary.md`), which is returned."""
    samples = results.pop("samples")
    tracker.save_results_aggregated(results=results, samples=samples)
    for task in results["configs"]:
        tracker.save_results_samples(task_name=task, samples=samples[task])
    table = summary_table(results)
    (output / "summary.md").write_text(table)
    return table


def summary_table(results: dict) -> str:
    """The metrics as a Markdown table, a row per task, filter and metric, with lm-eval's
    columns. (lm-eval's own `make_table` loses its header row with the pytablewriter release
    its other pins resolve to.)"""
    lines = [
        "| Task | Version | Filter | n-shot | Metric | Value | Stderr |",
        "|------|--------:|--------|-------:|--------|------:|-------:|",
    ]
    for task, metrics in sorted(results["results"].items()):
        version = results.get("versions", {}).get(task, "")
        shots = results.get("n-shot", {}).get(task, "")
        for key, value in sorted(metrics.items()):
            metric, _, filter_name = key.partition(",")
            if not filter_name or "_stderr" in metric or not isinstance(value, int | float):
                continue
            error = metrics.get(f"{metric}_stderr,{filter_name}")
            spread = f"{error:.4f}" if isinstance(error, int | float) else "N/A"
            cells = [task, version, filter_name, shots, metric, f"{value:.4f}", spread]
            lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def _quiet_lm_eval() -> None:
    """lm-eval logs each step at INFO and its task notes as warnings; lmpress shows its own
    progress and the summary, and --debug the rest."""
    import os

    level = logging.DEBUG if os.environ.get("LMPRESS_DEBUG") else logging.ERROR
    logging.getLogger("lm_eval").setLevel(level)
    logging.getLogger("lm-eval").setLevel(level)
