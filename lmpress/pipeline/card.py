"""The dataset card a pipeline run leaves in its output directory: a README.md in the Hugging
Face card format, so the directory uploads to the hub as it is and says how it was made.

The YAML front matter holds what the hub reads (`configs` naming the data file, `dataset_info`
with the splits and, where the dataset's file has a schema, its features, `size_categories`,
`tags`); the Markdown after it, the provenance: the command, lmpress's version and the date,
each step's rows in and out, what each filter dropped and why, failures, tokens, cost and time,
each model with the identity the response cache gives it (the digest of its files' content, so
a card names the exact weights), and the pipeline file, verbatim.

The facts are plain dataclasses (`CardFacts`, `StepFacts`, `ModelFacts`) of ints, strs and
dicts, which the pipeline's runner fills in from its journal; `model_facts` and `step_cost`
make a model's entry and a step's cost from its RunConfig as the cache and the budgets do.

lmpress never replaces a file it does not own: a README.md without our mark (a line the card
writes, `MARK`) stays as it is, and the card goes to DATASET_CARD.md instead.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from lmpress.configs.schema import ModelParams, RunConfig
from lmpress.pipeline.hub_metadata import front_matter
from lmpress.version import __version__

MARK = "<!-- lmpress dataset card"
MARK_LINE = f"{MARK}: lmpress rewrites this file on each run; delete this line to keep it. -->"
CARD_NAME = "README.md"
FALLBACK_NAME = "DATASET_CARD.md"  # where the card goes when README.md is the user's
_ABSENT = object()  # a setting ModelParams has no default for: always shown


@dataclass
class ModelFacts:
    """One model the pipeline names under `models:`."""

    name: str  # the pipeline's name for it
    engine: str  # NATIVE, LLAMACPP, VLLM, OPENAI...
    model_name: str  # as the pipeline gives it
    identity: str  # the response cache's: "sha256:<its files' digest>", or a remote model's name
    settings: dict[str, Any] = field(default_factory=dict)  # model settings set, JSON-able
    endpoint: str | None = None  # a remote model's URL
    price: str | None = None  # its price per million tokens and where it comes from


@dataclass
class StepFacts:
    """One step of the run, as its journal counts it."""

    name: str
    kind: str  # generate, judge, filter, map, dedupe
    model: str | None = None  # the ModelFacts.name it ran on, for generate and judge
    settings: dict[str, Any] = field(default_factory=dict)  # generation settings, JSON-able
    seed: int | None = None
    rows_in: int = 0
    rows_out: int = 0  # fan-out makes more than came in
    dropped: dict[str, int] = field(default_factory=dict)  # reason -> rows dropped for it
    failed: int = 0  # rows that failed (sent to the rejects with their error)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float | None = None  # None: the model has no price
    seconds: float = 0.0  # wall time from its first row in to its last row out


@dataclass
class CardFacts:
    """Everything the card says about one run."""

    pipeline_path: str  # the pipeline file as the command named it
    pipeline_text: str  # its text, verbatim
    command: str  # the command line
    data_path: str  # the dataset written, relative to the output directory
    data_format: str  # jsonl, parquet or hf
    rows: int  # rows in the dataset
    steps: list[StepFacts] = field(default_factory=list)
    models: list[ModelFacts] = field(default_factory=list)
    input_path: str | None = None
    rejects_path: str | None = None  # the rejects file, relative to the output directory
    seconds: float = 0.0  # the run's wall time (steps overlap, so not their sum)
    title: str | None = None  # the card's heading; the output directory's name by default
    version: str = __version__
    created: str = field(
        default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds")
    )
    stopped_because: str | None = None  # why the run stopped early (--max-cost): rows left


def write_card(path: Path, facts: CardFacts) -> Path | None:
    """Write the card into the output directory `path`: README.md, or DATASET_CARD.md where a
    README.md lmpress did not write is there. Returns the file written, so the caller can say
    where it went; None where both names hold files of the user's (nothing is written)."""
    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    target = next(
        (directory / n for n in (CARD_NAME, FALLBACK_NAME) if _ours_or_free(directory / n)),
        None,
    )
    if target is None:
        return None
    text = card_text(facts, directory)
    tmp = target.with_name(f".{target.name}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


def _ours_or_free(path: Path) -> bool:
    if not path.exists():
        return True
    try:
        return MARK in path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False


def card_text(facts: CardFacts, directory: Path) -> str:
    """The card: YAML front matter, our mark, then the Markdown."""
    import yaml

    front = yaml.safe_dump(
        front_matter(directory, facts.data_path, facts.data_format, facts.rows),
        sort_keys=False,
        allow_unicode=True,
    )
    title = facts.title or directory.resolve().name
    return f"---\n{front}---\n{MARK_LINE}\n\n{card_markdown(facts, title)}"


def model_facts(name: str, config: RunConfig) -> ModelFacts:
    """A model's entry: its identity and settings as the response cache keys them (cache/
    keys.py: the files' content digest, settings that only train left out), and its price."""
    from lmpress.batch.pricing import price_for
    from lmpress.cache.keys import RunKey, endpoint_of

    identity = dict(RunKey(config).model)
    defaults = dataclasses.asdict(ModelParams())
    settings = {
        key: value
        for key, value in identity.items()
        if key != "model_name" and value != defaults.get(key, _ABSENT)
    }
    price = price_for(config)
    priced = None
    if price is not None:
        priced = (
            f"${price.input_per_million:g} in, ${price.output_per_million:g} out per million "
            f"tokens ({price.source})"
        )
    return ModelFacts(
        name=name,
        engine=config.engine,
        model_name=config.model.model_name,
        identity=str(identity.get("model_name") or config.model.model_name),
        settings=settings,
        endpoint=endpoint_of(config),
        price=priced,
    )


def step_cost(config: RunConfig, prompt_tokens: int, completion_tokens: int) -> float | None:
    """What a step's tokens cost on its model, priced as the budgets price them; None where
    the model has no price."""
    from lmpress.batch.pricing import price_for

    price = price_for(config)
    return None if price is None else price.cost(prompt_tokens, completion_tokens)


def fence(text: str) -> str:
    """A code fence longer than any run of backticks in `text`, so the text shows verbatim."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


def card_markdown(facts: CardFacts, title: str) -> str:
    """The card's Markdown: how the dataset was made, step by step, then on what models, then
    the pipeline file itself."""
    parts = [
        f"# {title}\n",
        _made_by(facts),
        _steps_table(facts.steps),
        _dropped(facts.steps),
        _models(facts.models),
        _settings(facts.steps),
        f"## Pipeline\n\n`{facts.pipeline_path}`:\n\n{_block(facts.pipeline_text, 'yaml')}",
    ]
    return "\n".join(part for part in parts if part)


def _made_by(facts: CardFacts) -> str:
    where = f"`{facts.data_path}` ({facts.data_format})"
    lines = [
        f"{facts.rows} rows in {where}, made by lmpress {facts.version} on {facts.created} "
        f"in {_seconds(facts.seconds)}"
        + (f" from `{facts.input_path}`" if facts.input_path else "")
        + ", with:\n",
        _block(facts.command, "sh"),
    ]
    if facts.rejects_path:
        lines.append(f"Rows dropped or failed, with the step and why: `{facts.rejects_path}`.\n")
    return "\n".join(lines)


STEP_COLUMNS = (
    "step", "kind", "model", "rows in", "rows out", "dropped", "failed", "tokens in",
    "tokens out", "cost (USD)", "time",
)  # fmt: skip


def _steps_table(steps: list[StepFacts]) -> str:
    rows = [
        [
            _cell(s.name),
            s.kind,
            _cell(s.model or ""),
            str(s.rows_in),
            str(s.rows_out),
            str(sum(s.dropped.values())),
            str(s.failed),
            str(s.prompt_tokens),
            str(s.completion_tokens),
            _cost(s.cost_usd),
            _seconds(s.seconds),
        ]  # fmt: skip
        for s in steps
    ]
    costs = [s.cost_usd for s in steps if s.cost_usd is not None]
    rows.append(
        [
            "**total**",
            "",
            "",
            "",
            "",
            str(sum(sum(s.dropped.values()) for s in steps)),
            str(sum(s.failed for s in steps)),
            str(sum(s.prompt_tokens for s in steps)),
            str(sum(s.completion_tokens for s in steps)),
            _cost(sum(costs) if costs else None),
            "",
        ]  # fmt: skip
    )
    head = "| " + " | ".join(STEP_COLUMNS) + " |\n|" + "---|" * len(STEP_COLUMNS) + "\n"
    return "## Steps\n\n" + head + "".join("| " + " | ".join(r) + " |\n" for r in rows)


def _dropped(steps: list[StepFacts]) -> str:
    lines = [
        f"- `{s.name}`: {count} × {_cell(reason)}"
        for s in steps
        for reason, count in sorted(s.dropped.items(), key=lambda item: (-item[1], item[0]))
    ]
    return "### Dropped rows, by reason\n\n" + "\n".join(lines) + "\n" if lines else ""


def _models(models: list[ModelFacts]) -> str:
    if not models:
        return ""
    out = ["## Models\n"]
    for m in models:
        out.append(f"### `{m.name}`\n")
        out.append(f"- engine: {m.engine}")
        out.append(f"- model: `{m.model_name}`")
        out.append(f"- identity (the response cache's): `{m.identity}`")
        if m.endpoint:
            out.append(f"- endpoint: {m.endpoint}")
        if m.price:
            out.append(f"- price: {m.price}")
        if m.settings:
            out.append(f"- settings:\n\n{_block(_yaml(m.settings), 'yaml', indent='  ')}")
        else:
            out[-1] += "\n"
    return "\n".join(out)


def _settings(steps: list[StepFacts]) -> str:
    out = []
    for s in steps:
        shown = dict(s.settings)
        if s.seed is not None:
            shown["seed"] = s.seed
        if shown:
            out.append(f"### `{s.name}`\n\n{_block(_yaml(shown), 'yaml')}")
    return "## Settings and seeds\n\n" + "\n".join(out) if out else ""


def _yaml(value: Any) -> str:
    import yaml

    return yaml.safe_dump(value, sort_keys=True, allow_unicode=True)


def _block(text: str, language: str, indent: str = "") -> str:
    """`text` fenced so that it shows verbatim, whatever backticks it holds."""
    mark = fence(text)
    body = text if text.endswith("\n") else text + "\n"
    if indent:  # inside a list item; never the pipeline file, which is shown as it is
        body = "".join(indent + line if line.strip() else line for line in body.splitlines(True))
    return f"{indent}{mark}{language}\n{body}{indent}{mark}\n"


def _cell(text: str) -> str:
    """Text for a table cell or a list item: one line, its pipes escaped."""
    return " ".join(text.split()).replace("|", "\\|")


def _cost(usd: float | None) -> str:
    return "–" if usd is None else f"{usd:.4f}"


def _seconds(seconds: float) -> str:
    return f"{seconds:.1f} s"
