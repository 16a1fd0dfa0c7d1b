"""`lmpress run --max-cost USD`: the whole pipeline's spend, every step's tokens priced at its
own model's price (`lmpress.batch.pricing`), stops the run from taking new input rows once it
reaches the cap, as `lmpress batch`'s budget does (`lmpress.batch.budget`): requests in flight
finish (their tokens are being paid for), rows read but not yet sent to a model fail with the
reason (a failed row is retried by the next run), the outputs are written, and the same
command resumes from the journal. The budget counts what this run spends: a resumed run
starts from zero, and rows the journal replays cost nothing.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from typing import Any

from lmpress.batch.budget import Budget
from lmpress.pipeline.steps.base import Outcome
from lmpress.vocabulary.errors import ConfigError


class PipelineBudget:
    def __init__(self, max_cost: float):
        if max_cost <= 0:
            raise ConfigError(f"--max-cost {max_cost:g}: must be more than 0")
        self.max_cost = max_cost
        # An uncapped Budget per model (by its loaded config) prices its answers.
        self.models: dict[int, Budget] = {}
        self.model_steps: set[str] = set()
        self.stopped_because: str | None = None

    @classmethod
    def for_pipeline(cls, max_cost: float, spec: Any, models: Any) -> PipelineBudget:
        """Refused in one line, before any work, where a step's model has no known price."""
        from lmpress.batch.pricing import price_for

        budget = cls(max_cost)
        for step in spec.steps:
            ref = spec.model_of(step)
            if ref is None:
                continue
            price = price_for(models.config(ref))
            try:
                Budget(max_cost, price=price)
            except ConfigError as exc:
                raise ConfigError(f"{spec.path}: step '{step.name}': {exc}") from None
            budget.models[id(models.config(ref))] = Budget(price=price)
            budget.model_steps.add(step.name)
        return budget

    @property
    def spent(self) -> float:
        return sum(budget.spent for budget in self.models.values())

    def watch(self, steps: list[Any], models: Any) -> None:
        """Charge every answer a model generates (a response-cache hit costs nothing, as in
        batch), and fail a model step's row not yet started once the cap is reached."""
        answers = models.answers

        def charged(ref: Any) -> Any:
            return _Charged(answers(ref), self.models[id(models.config(ref))])

        models.answers = charged
        for step in steps:
            if step.name in self.model_steps:
                step.run = self._refusing(step.run)

    def _refusing(self, run: Any) -> Any:
        async def refusing(key: str, row: dict[str, Any]) -> Any:
            if self.reached():
                # Read from the input but not started: failed, so the rejects say why and
                # the same command runs it again (the journal retries a failed row).
                return Outcome(error=f"not run: {self.stopped_because}; re-run to resume")
            return await run(key, row)

        return refusing

    def reached(self) -> bool:
        """Whether the cap is reached; said once, when it first is."""
        if self.stopped_because is None and self.spent >= self.max_cost:
            self.stopped_because = f"spent ${self.spent:.4f} of --max-cost ${self.max_cost:g}"
            print(
                f"lmpress: stopping: {self.stopped_because}; rows in flight finish first",
                file=sys.stderr,
                flush=True,
            )
        return self.stopped_because is not None

    def gate(self, rows: Iterable[Any]) -> Iterator[Any]:
        """The input rows, until the cap is reached: then no more are read."""
        for item in rows:
            if self.reached():
                return
            yield item


class _Charged:
    """A model's answers (`cache.answers.CachedAnswers`) whose generated results are priced
    into `budget` as they arrive."""

    def __init__(self, answers: Any, budget: Budget):
        self._answers = answers
        self._budget = budget

    def __getattr__(self, name: str) -> Any:
        return getattr(self._answers, name)

    async def complete(self, request: Any) -> Any:
        return self._charge(await self._answers.complete(request))

    async def embed(self, request: Any) -> Any:
        return self._charge(await self._answers.embed(request))

    async def score(self, request: Any) -> Any:
        return self._charge(await self._answers.score(request))

    def _charge(self, result: Any) -> Any:
        if not result.cached and self._budget.price is not None:
            self._budget.charge(result)
        return result
