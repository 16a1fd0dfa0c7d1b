"""Prices: the providers' price list by model name and snapshot, prices in the config over it,
the batch APIs' discount, and no price for a local engine unless the config gives one."""

from __future__ import annotations

import pytest

from lmpress.batch.pricing import Price, listed_price, price_for
from lmpress.configs import load_config
from lmpress.engines.remote.presets import BY_NAME, PRICES
from lmpress.vocabulary.errors import ConfigError


def config(engine: str, model: str, **remote):
    overrides = {"engine": engine, "model.model_name": model}
    overrides.update({f"remote_params.{k}": v for k, v in remote.items()})
    return load_config(overrides=overrides)


@pytest.mark.parametrize(
    "engine, model, listed",
    [
        ("OPENAI", "gpt-4o-mini", (0.15, 0.60, 0.075)),
        ("OPENAI", "gpt-4o-mini-2024-07-18", (0.15, 0.60, 0.075)),
        ("OPENAI", "gpt-4o-2024-08-06", (2.50, 10.00, 1.25)),
        ("OPENAI", "gpt-4.1-nano", (0.10, 0.40, 0.025)),
        ("OPENAI", "gpt-5-mini", (0.25, 2.00, 0.025)),
        ("OPENAI", "text-embedding-3-small", (0.02, 0.0)),  # no prompt cache
        ("ANTHROPIC", "claude-sonnet-4-5-20250929", (3.00, 15.00, 0.30)),
        ("ANTHROPIC", "claude-3-5-haiku-latest", (0.80, 4.00, 0.08)),
        ("GEMINI", "gemini-2.5-flash", (0.30, 2.50, 0.03)),
        ("GOOGLE_VERTEX", "google/gemini-2.5-flash", (0.30, 2.50, 0.03)),
        ("GOOGLE_VERTEX", "google/gemini-2.0-flash-001", (0.10, 0.40, 0.025)),
    ],
)
def test_the_price_list_knows_models_and_their_snapshots(engine, model, listed):
    assert listed_price(engine, model) == listed


@pytest.mark.parametrize(
    "engine, model",
    [
        ("OPENAI", "gpt-4o-mini-tts"),  # another model, not a snapshot of gpt-4o-mini
        ("OPENAI", "o3-mini"),
        ("OPENAI", "gpt-9"),
        ("ANTHROPIC", "claude-sonnet-4-5-preview"),
        ("TOGETHER", "meta-llama/Llama-3.3-70B-Instruct-Turbo"),  # a host with no price list
        ("NATIVE", "gpt-4o-mini"),
    ],
)
def test_a_model_that_is_not_listed_has_no_price(engine, model):
    assert listed_price(engine, model) is None
    assert price_for(config(engine, model)) is None


def test_cost_live_and_through_the_batch_api():
    price = price_for(config("OPENAI", "gpt-4o-mini"))
    assert price == Price(0.15, 0.60, 0.5, "OPENAI price list, gpt-4o-mini", 0.075)
    assert price.cost(2_000_000, 1_000_000) == pytest.approx(0.30 + 0.60)
    assert price.cost(2_000_000, 1_000_000, batch=True) == pytest.approx((0.30 + 0.60) / 2)


def test_the_recipes_bundled_for_hosted_providers_are_priced():
    for recipe in ("openai", "anthropic", "gemini", "google-vertex"):
        price = price_for(load_config(recipe))
        assert price is not None and price.has_batch, recipe


def test_providers_with_a_batch_api_are_the_ones_marked():
    marked = {p.name for p in BY_NAME.values() if p.batch_discount is not None}
    assert marked == {"OPENAI", "ANTHROPIC", "GEMINI", "GOOGLE_VERTEX"}
    assert set(PRICES) <= set(BY_NAME)


def test_a_price_in_the_config_wins_over_the_list_field_by_field():
    price = price_for(config("OPENAI", "gpt-4o-mini", output_price_per_million=0.5))
    assert (price.input_per_million, price.output_per_million) == (0.15, 0.5)
    assert price.batch_discount == 0.5  # the provider's batch API still halves it
    assert price.source == "remote_params over the OPENAI price list"


def test_a_local_engine_is_priced_only_as_the_config_says():
    assert price_for(load_config("smollm2")) is None
    given = config("LLAMACPP", "smollm2:135m-instruct", input_price_per_million=0.02,
                   output_price_per_million=0.08)  # fmt: skip
    price = price_for(given)
    assert price == Price(0.02, 0.08, None, "remote_params")
    assert price.cost(1_000_000, 500_000) == pytest.approx(0.06)
    with pytest.raises(ValueError, match="no batch API"):
        price.cost(1, 1, batch=True)


def test_an_unlisted_remote_model_takes_a_price_from_the_config():
    price = price_for(config("TOGETHER", "some/model", input_price_per_million=0.9))
    assert price == Price(0.9, 0.0, None, "remote_params")


@pytest.mark.parametrize("value", ["-1", ".inf", ".nan"])
def test_an_impossible_price_is_refused_naming_the_key(value):
    with pytest.raises(ConfigError, match=r"remote_params.input_price_per_million"):
        config("OPENAI", "gpt-4o", input_price_per_million=value)


def test_cached_input_and_cache_writes_are_priced_apart():
    # claude-sonnet-4-5: $3 in, $15 out, cache reads $0.30, 5-minute cache writes 1.25 x $3.
    price = price_for(config("ANTHROPIC", "claude-sonnet-4-5"))
    assert (price.cached_input_per_million, price.cache_write_per_million) == (0.30, 3.75)
    # 1M prompt tokens: 600K read from the cache, 100K written to it, 300K plain; 10K out.
    cost = price.cost(1_000_000, 10_000, cached_tokens=600_000, cache_creation_tokens=100_000)
    assert cost == pytest.approx(0.3 * 3.00 + 0.6 * 0.30 + 0.1 * 3.75 + 0.01 * 15.00)
    batch = price.cost(1_000_000, 10_000, True, 600_000, 100_000)
    assert batch == pytest.approx(cost / 2)  # the batch discount stacks on the cache's


def test_openai_bills_no_cache_write_and_the_config_can_price_cached_input():
    price = price_for(config("OPENAI", "gpt-4.1"))
    assert (price.cached_input_per_million, price.cache_write_per_million) == (0.50, None)
    assert price.cost(2_000_000, 0, cached_tokens=1_000_000) == pytest.approx(2.00 + 0.50)
    given = price_for(config("OPENAI", "gpt-4.1", cached_input_price_per_million=0.2))
    assert given.cached_input_per_million == 0.2
    assert given.source == "remote_params over the OPENAI price list"
    # Without a cached price, cached input costs what input costs.
    local = price_for(config("LLAMACPP", "m", input_price_per_million=1.0))
    assert local.cost(1_000_000, 0, cached_tokens=1_000_000) == pytest.approx(1.0)


@pytest.mark.parametrize("value", ["-1", ".nan"])
def test_an_impossible_cached_price_is_refused_naming_the_key(value):
    with pytest.raises(ConfigError, match=r"remote_params.cached_input_price_per_million"):
        config("OPENAI", "gpt-4o", cached_input_price_per_million=value)
