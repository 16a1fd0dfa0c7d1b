"""A run's budget: `--max-cost USD` and `--max-tokens N` stop taking new rows once this run has
spent that much, and the job stays resumable like any other stop.

Each finished row is priced where the config knows a price (`lmpress.batch.pricing`), and the price
recorded in its response (`cost_usd`), input read from or written to the provider's prompt cache
at its own price. The budget counts what this run spends: a resumed run
starts from zero, so the same command spends at most the cap each time it runs. Rows already
in flight when the cap is reached still finish (their tokens are being paid for), so a run can
pass the cap by those rows' cost.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lmpress.vocabulary.embeddings import EmbedResult, ScoreResult
from lmpress.vocabulary.errors import ConfigError
from lmpress.vocabulary.types import Result, Usage


@dataclass
class Budget:
    max_cost: float | None = None  # USD
    max_tokens: int | None = None  # prompt and completion tokens together
    price: Any | None = None  # lmpress.batch.pricing.Price, where known
    batch: bool = False  # priced at the provider's batch-API rate
    spent: float = 0.0
    live_spent: float = 0.0  # what the same tokens cost at the live price
    tokens: int = 0
    # The budgets of jobs that share the caps (a --models job's models side by side), self
    # among them; empty: this one alone.
    peers: list[Budget] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        if self.max_cost is not None and self.max_cost <= 0:
            raise ConfigError(f"--max-cost {self.max_cost:g}: must be more than 0")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ConfigError(f"--max-tokens {self.max_tokens}: must be at least 1")
        if self.max_cost is not None and self.price is None:
            raise ConfigError(
                "--max-cost needs a price for this model: lmpress knows none, so set "
                "remote_params.input_price_per_million and output_price_per_million (USD)"
            )

    def charge(self, result: Result | EmbedResult | ScoreResult) -> None:
        """Count a finished row's tokens, and price it into `result.cost_usd` where a price
        is known."""
        usage = result.usage
        self.tokens += usage.prompt_tokens + usage.completion_tokens
        if self.price is not None:
            result.cost_usd = self.price_of(usage)
            self.spent += result.cost_usd
            self.live_spent += self.price_of(usage, live=True)

    def price_of(self, usage: Usage, live: bool = False) -> float:
        """What these tokens cost this run (at the batch rate where it runs batches, unless
        `live`), input read from or written to the provider's prompt cache at its own price."""
        assert self.price is not None
        batch = self.batch and self.price.has_batch and not live
        return self.price.cost(
            usage.prompt_tokens, usage.completion_tokens, batch, usage.cached_tokens,
            usage.cache_creation_tokens,
        )  # fmt: skip

    def exceeded(self) -> str | None:
        """Why the run must stop taking rows, or None."""
        shared = self.peers or [self]
        spent, tokens = sum(b.spent for b in shared), sum(b.tokens for b in shared)
        if self.max_cost is not None and spent >= self.max_cost:
            return f"spent ${spent:.4f} of --max-cost ${self.max_cost:g}"
        if self.max_tokens is not None and tokens >= self.max_tokens:
            return f"used {tokens} tokens of --max-tokens {self.max_tokens}"
        return None
