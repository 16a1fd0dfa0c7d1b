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
    def __init__(self, max_cost: float, prices: dict[str, Any]):
        """`prices`: each step with a model, by name, to its `pricing.Price` (None: unknown)."""
        self.max_cost = max_cost
        # One uncapped Budget per step prices its rows; the cap is on their sum.
        self.steps = {name: Budget(price=price) for name, price in prices.items()}
        self.stopped_because: str | None = None

    @classmethod
    def for_pipeline(cls, max_cost: float, spec: Any, models: Any) -> PipelineBudget:
        """Refused in one line, before any work, where a step's model has no known price."""
        from lmpress.batch.pricing import price_for

        prices = {}
        for step in spec.steps:
            ref = spec.model_of(step)
            if ref is None:
                continue
            price = price_for(models.config(ref))
            try:
                Budget(max_cost, price=price)
            except ConfigError as exc:
                raise ConfigError(f"{spec.path}: step '{step.name}': {exc}") from None
            prices[step.name] = price
        if not prices:
            Budget(max_cost)  # still refuses a cap of 0 or less
        return cls(max_cost, prices)

    @property
    def spent(self) -> float:
        return sum(budget.spent for budget in self.steps.values())

    def watch(self, steps: list[Any]) -> None:
        """Charge each model step's rows as they finish. Done at the step, not in the runner,
        so a row the journal replays (no `run` call) is free, as it is."""
        for step in steps:
            if step.name in self.steps:
                step.run = self._charging(step.name, step.run)

    def _charging(self, name: str, run: Any) -> Any:
        budget = self.steps[name]

        async def charged(key: str, row: dict[str, Any]) -> Any:
            if self.reached():
                # Taken from the input but not started: failed, so the rejects say why and
                # the same command runs it again (the journal retries a failed row).
                return Outcome(error=f"not run: {self.stopped_because}; re-run to resume")
            outcome = await run(key, row)
            if outcome.usage is not None and budget.price is not None:
                budget.spent += budget.price_of(outcome.usage)
            return outcome

        return charged

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
