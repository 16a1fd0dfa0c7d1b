"""What a job's tokens cost: a model's price per million tokens, from the providers' price list
(`PRICES` in engines/remote/presets.py) or from `remote_params.input_price_per_million`,
`output_price_per_million` and `cached_input_price_per_million`, which win over the list field
by field.

Prompt tokens the provider read from its prompt cache are priced at the cached-input price, and
those it wrote to it (Anthropic) at the input price times the provider's `cache_write_share`;
with neither known, at the input price.

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
    the price came from, for the dry run to show. Cached input and cache writes: None where
    the provider bills them as input."""

    input_per_million: float
    output_per_million: float
    batch_discount: float | None = None
    source: str = ""
    cached_input_per_million: float | None = None
    cache_write_per_million: float | None = None

    @property
    def has_batch(self) -> bool:
        return self.batch_discount is not None

    def cost(
        self, prompt_tokens: int, completion_tokens: int, batch: bool = False,
        cached_tokens: int = 0, cache_creation_tokens: int = 0,
    ) -> float:  # fmt: skip
        """USD for these tokens, live or (`batch`) through the provider's batch API (whose
        discount applies to cached input too). `prompt_tokens` counts all input, of it
        `cached_tokens` read from the provider's prompt cache and `cache_creation_tokens`
        written to it."""
        cached = self.input_per_million
        if self.cached_input_per_million is not None:
            cached = self.cached_input_per_million
        written = self.input_per_million
        if self.cache_write_per_million is not None:
            written = self.cache_write_per_million
        plain = max(0, prompt_tokens - cached_tokens - cache_creation_tokens)
        live = (
            plain * self.input_per_million
            + cached_tokens * cached
            + cache_creation_tokens * written
            + completion_tokens * self.output_per_million
        ) / 1_000_000
        if not batch:
            return live
        if self.batch_discount is None:
            raise ValueError(f"no batch price: {self.source or 'this price'} has no batch API")
        return live * self.batch_discount


def listed_price(engine: str, model: str) -> tuple[float, ...] | None:
    """The price list's (input, output[, cached input]) for a provider's model, matched by
    exact name or as a dated snapshot of a listed model; a publisher prefix ("google/") is
    dropped."""
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
    list's, field by field (an input or output price neither gives is 0; a cached-input price
    neither gives is the input price). None: neither gives a price."""
    remote = config.remote_params
    given = (
        remote.input_price_per_million,
        remote.output_price_per_million,
        remote.cached_input_price_per_million,
    )
    listed = listed_price(config.engine, config.model.model_name)
    if listed is None and given == (None, None, None):
        return None
    base = (*(listed or (0.0, 0.0)), None, None)[:3]
    provider = BY_NAME.get(config.engine)
    if given == (None, None, None):
        source = f"{config.engine} price list, {config.model.model_name}"
    elif listed is None:
        source = "remote_params"
    else:
        source = f"remote_params over the {config.engine} price list"
    input_price, output_price, cached = (
        listed_value if given_value is None else float(given_value)
        for listed_value, given_value in zip(base, given, strict=True)
    )
    share = provider.cache_write_share if provider else None
    return Price(
        input_price,
        output_price,
        provider.batch_discount if provider else None,
        source,
        cached,
        None if share is None else input_price * share,
    )
