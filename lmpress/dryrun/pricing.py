"""What a job's tokens cost: a model's price per million tokens, from the providers' price list
(`PRICES` in engines/remote/presets.py) or from `remote_params.input_price_per_million` and
`output_price_per_million`, which win over the list field by field.

A local engine (NATIVE, LLAMACPP, VLLM) has no price unless the config gives one; then it is
used as given (GPU hours spread over the tokens they make, say). The dry run prices a job with
`Price.cost`, live and, where the provider has a batch API, batch; the budget guardrails price
each row the same way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from lmpress.configs.schema import RunConfig
from lmpress.engines.remote.presets import BY_NAME, PRICES

# What may follow a model's name in a snapshot of it: a date (2024-07-18, 20250929), a
# three-digit version (Vertex's -001) or "latest". Anything else is another model:
# gpt-4o-mini is not a snapshot of gpt-4o.
SNAPSHOT = re.compile(r"-(\d{4}-\d{2}-\d{2}|\d{8}|\d{3}|latest)$")


@dataclass(frozen=True)
class Price:
    """USD per million tokens in and out, live; `batch_discount` is the batch API's price as a
    share of that (0.5: half), None where the provider has no batch API. `source` says where
    the price came from, for the dry run to show."""

    input_per_million: float
    output_per_million: float
    batch_discount: float | None = None
    source: str = ""

    @property
    def has_batch(self) -> bool:
        return self.batch_discount is not None

    def cost(self, prompt_tokens: int, completion_tokens: int, batch: bool = False) -> float:
        """USD for these tokens, live or (`batch`) through the provider's batch API."""
        live = (
            prompt_tokens * self.input_per_million + completion_tokens * self.output_per_million
        ) / 1_000_000
        if not batch:
            return live
        if self.batch_discount is None:
            raise ValueError(f"no batch price: {self.source or 'this price'} has no batch API")
        return live * self.batch_discount


def listed_price(engine: str, model: str) -> tuple[float, float] | None:
    """The price list's (input, output) for a provider's model, matched by exact name or as a
    dated snapshot of a listed model; a publisher prefix ("google/") is dropped."""
    table = PRICES.get(engine)
    if not table or not model:
        return None
    name = model.rsplit("/", 1)[-1]
    if name in table:
        return table[name]
    base = SNAPSHOT.sub("", name)
    return table.get(base) if base != name else None


def price_for(config: RunConfig) -> Price | None:
    """The price of the config's engine and model: remote_params' prices over the price
    list's, field by field (a field neither gives is 0). None: neither gives a price."""
    remote = config.remote_params
    given = (remote.input_price_per_million, remote.output_price_per_million)
    listed = listed_price(config.engine, config.model.model_name)
    if listed is None and given == (None, None):
        return None
    base = listed or (0.0, 0.0)
    provider = BY_NAME.get(config.engine)
    if given == (None, None):
        source = f"{config.engine} price list, {config.model.model_name}"
    elif listed is None:
        source = "remote_params"
    else:
        source = f"remote_params over the {config.engine} price list"
    return Price(
        base[0] if given[0] is None else float(given[0]),
        base[1] if given[1] is None else float(given[1]),
        provider.batch_discount if provider else None,
        source,
    )
