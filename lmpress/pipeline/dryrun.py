"""`lmpress run --dry-run`: what a pipeline would cost, before any of it is spent. No model
loads and no request goes out; nothing is written.

Rows flow through the steps on rates: a step's own `estimate: {fan_out, keep}` where it sets
one, else what a finished run (`--limit N`) into the same output journaled for it, else the
step's settings (a generate's `n`) and 1. Tokens per row are measured from that journal where
it has the step; else a step that reads the input rows (nothing before it made or multiplied
them) has its prompts counted by its engine's own tokenizer (`dryrun/prompt_tokens.py`), and
its completions bounded by `max_new_tokens`. The `basis` column says which.
"""

from __future__ import annotations

import sqlite3
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SAMPLE = 200  # input rows whose prompts are counted; the rest are priced at their mean


@dataclass
class StepEstimate:
    name: str
    kind: str
    rows_in: float
    rows_out: float
    prompt_tokens: float | None = None  # None: not knowable before a run measures it
    completion_tokens: float | None = None
    cost_usd: float | None = None
    basis: str = "default"  # where the rates came from: estimate, measured or default
    model: bool = False  # a step with no model spends no tokens


def dry_run_pipeline(options: Any) -> list[StepEstimate]:
    """Estimate every step and print the table on stdout."""
    from lmpress.data.sources import open_source
    from lmpress.pipeline.models import Models
    from lmpress.pipeline.spec import load_pipeline

    source = open_source(options.input)
    rows = _input_rows(source, options.limit)
    spec = load_pipeline(options.pipeline, set(rows[0]) if rows else None)
    models = Models(spec, options.cache)
    measured = _measured(Path(options.output) / ".lmpress" / "pipeline.sqlite")
    estimates, count, sample = [], float(len(rows)), rows[:SAMPLE]
    for step in spec.steps:
        estimate = _estimate(spec, step, models, count, sample, measured.get(step.name))
        estimates.append(estimate)
        count = estimate.rows_out
        if step.kind != "filter":
            sample = []  # the rows changed (or multiplied): later prompts cannot be counted
    _print(estimates, len(rows))
    return estimates


def _input_rows(source: Any, limit: int | None) -> list[dict[str, Any]]:
    rows = []
    for index, line in enumerate(source.lines()):
        if limit is not None and index >= limit:
            break
        if line.error is None and isinstance(line.value, dict):
            rows.append(line.value)
    return rows


def _measured(path: Path) -> dict[str, dict[str, float]]:
    """Per step, what an earlier run journaled: rows in, rows out and tokens. Read-only, so a
    dry run next to a running job neither waits for it nor changes its journal."""
    if not path.exists():
        return {}
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        # Failed rows left out: one a budget stopped, or the engine refused, says nothing of
        # what a row makes or costs.
        done = db.execute(
            "SELECT d.step, COUNT(*), SUM(d.prompt_tokens), SUM(d.completion_tokens) FROM done d "
            "LEFT JOIN rejects r ON r.step = d.step AND r.key = d.key AND r.kind = 'failed' "
            "WHERE r.key IS NULL GROUP BY d.step"
        ).fetchall()
        emitted = dict(db.execute("SELECT step, COUNT(*) FROM emitted GROUP BY step"))
    except sqlite3.Error:
        return {}
    finally:
        db.close()
    return {
        step: {"in": n, "out": emitted.get(step, 0), "prompt": p or 0, "completion": c or 0}
        for step, n, p, c in done
        if n
    }


def _estimate(spec: Any, step: Any, models: Any, rows_in: float, sample: list[dict],
              measured: dict[str, float] | None) -> StepEstimate:  # fmt: skip
    out = StepEstimate(step.name, step.kind, rows_in, rows_in)
    ref = spec.model_of(step)
    if step.estimate is not None:
        out.basis = "estimate"
        out.rows_out = rows_in * step.estimate.fan_out * step.estimate.keep
    elif measured is not None:
        out.basis = "measured"
        out.rows_out = rows_in * measured["out"] / measured["in"]
    elif step.kind == "generate":
        out.rows_out = rows_in * step.n
    if ref is None:
        return out
    out.model = True
    config = models.config(ref)
    if measured is not None:
        out.prompt_tokens = rows_in * measured["prompt"] / measured["in"]
        out.completion_tokens = rows_in * measured["completion"] / measured["in"]
        if out.basis == "default":
            out.basis = "measured"
    else:
        out.completion_tokens = 0.0  # a dedupe's embeddings make none
        if step.kind in ("generate", "judge"):
            generation = getattr(step, "generation", {})
            bound = generation.get("max_new_tokens", config.generation.max_new_tokens)
            out.completion_tokens = rows_in * bound * getattr(step, "n", 1)
        if sample and step.kind in ("generate", "judge"):
            counted = _prompt_tokens(spec, step, config, sample)
            out.prompt_tokens = rows_in * counted / len(sample)
    out.cost_usd = _cost(config, out.prompt_tokens, out.completion_tokens)
    return out


def _prompt_tokens(spec: Any, step: Any, config: Any, sample: list[dict]) -> int:
    """The sample's prompt tokens for this step, as its engine will count them."""
    from lmpress.dryrun.prompt_tokens import prompt_counter
    from lmpress.vocabulary.errors import RequestError
    from lmpress.vocabulary.types import GenerationParams, Request

    where = f"{spec.path}: step '{step.name}'"
    build = _messages(step, where)
    counter = prompt_counter(config)
    total = 0
    for index, row in enumerate(sample):
        try:
            total += counter.count(Request(str(index), build(row), GenerationParams()))
        except (RequestError, KeyError, ValueError):
            continue  # a row the run would reject costs nothing
    return total


def _messages(step: Any, where: str) -> Any:
    """The step's conversation for a row, as its running step builds it."""
    if step.kind == "judge":
        from lmpress.pipeline.columns import build_step_judge

        return build_step_judge(step, where).messages
    from lmpress.data.columns import RowMapping
    from lmpress.vocabulary.types import Message

    prompt = RowMapping(prompt_template=step.prompt)
    system = RowMapping(prompt_template=step.system) if step.system else None

    def build(row: dict[str, Any]) -> list[Any]:
        messages = [Message("user", prompt.prompt(row))]
        if system is not None:
            messages.insert(0, Message("system", system.prompt(row)))
        return messages

    return build


def _cost(config: Any, prompt: float | None, completion: float | None) -> float | None:
    from lmpress.batch.pricing import price_for

    price = price_for(config)
    if price is None or prompt is None or completion is None:
        return None
    return price.cost(round(prompt), round(completion))


def _print(estimates: list[StepEstimate], rows: int) -> None:
    def number(value: float | None, model: bool = True) -> str:
        if not model:
            return "-"
        return "?" if value is None else f"{round(value):,}"

    header = ("step", "kind", "rows in", "rows out", "prompt tok", "completion tok", "cost $",
              "basis")  # fmt: skip
    lines = [header]
    for e in estimates:
        cost = "?" if e.cost_usd is None else f"{e.cost_usd:.4f}"
        cost = cost if e.model else "-"
        lines.append((e.name, e.kind, number(e.rows_in), number(e.rows_out),
                      number(e.prompt_tokens, e.model), number(e.completion_tokens, e.model),
                      cost, e.basis))  # fmt: skip
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    print(f"lmpress run --dry-run: {rows:,} input rows; nothing loaded or sent")
    for line in lines:
        print("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)))
    known = [e.cost_usd for e in estimates if e.cost_usd is not None]
    unknown = any(e.model and e.cost_usd is None for e in estimates)
    total = f"${sum(known):.4f}" + (" and steps not yet known" if unknown else "")
    print(f"total cost: {total} (completions at max_new_tokens unless measured)")
    if unknown:
        print("lmpress: ?: not known before a run (a prompt over columns a step makes, or a "
              "model without a price): run with --limit N first to measure", file=sys.stderr)  # fmt: skip
