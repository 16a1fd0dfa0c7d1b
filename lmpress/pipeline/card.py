"""STAND-IN (branch core only) for the `card` helper's pipeline/card.py, same names and
shapes (`CardFacts`, `StepFacts`, `ModelFacts`, `model_facts`, `step_cost`, `write_card`):
the smallest card, the facts as JSON. The lead merges theirs over this file."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class ModelFacts:
    name: str
    engine: str
    model_name: str
    identity: str
    settings: dict[str, Any] = field(default_factory=dict)
    endpoint: str | None = None
    price: str | None = None


@dataclass
class StepFacts:
    name: str
    kind: str
    model: str | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    seed: int | None = None
    rows_in: int = 0
    rows_out: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    failed: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float | None = None
    seconds: float = 0.0


@dataclass
class CardFacts:
    pipeline_path: str
    pipeline_text: str
    command: str
    data_path: str
    data_format: str
    rows: int
    steps: list[StepFacts] = field(default_factory=list)
    models: list[ModelFacts] = field(default_factory=list)
    input_path: str | None = None
    rejects_path: str | None = None
    seconds: float = 0.0
    title: str | None = None


def model_facts(name: str, config: Any) -> ModelFacts:
    from lmpress.cache.keys import RunKey

    identity = RunKey(config).model
    return ModelFacts(name, config.engine, config.model.model_name, str(identity))


def step_cost(config: Any, prompt_tokens: int, completion_tokens: int) -> float | None:
    return None


def write_card(path: Path, facts: CardFacts) -> Path | None:
    target = Path(path) / "README.md"
    body = json.dumps(dataclasses.asdict(facts), indent=2, default=str)
    target.write_text(f"# Dataset made by lmpress\n\n```json\n{body}\n```\n", encoding="utf-8")
    return target
