"""The batch APIs lmpress drives (`lmpress/batch/provider/apis.py`): every `BatchApi` a provider
row may name has its class, whole, and a provider's row alone decides which one drives it."""

from __future__ import annotations

import asyncio

import pytest

from lmpress.batch.provider.apis import BATCH_APIS, BatchAPI, batch_api
from lmpress.configs import load_config
from lmpress.engines.registry import create_engine, engine_status
from lmpress.engines.remote.presets import PROVIDERS, BatchApi

# What each batch API must do for a job: the base class leaves every one unimplemented.
LIFECYCLE = ("endpoint", "line", "submit", "progress", "results", "cancel")


def test_every_batch_api_has_its_class():
    assert set(BATCH_APIS) == set(BatchApi)


@pytest.mark.parametrize("kind", list(BatchApi))
def test_each_class_implements_the_whole_lifecycle(kind):
    cls = BATCH_APIS[kind]
    assert issubclass(cls, BatchAPI)
    assert [name for name in LIFECYCLE if getattr(cls, name) is getattr(BatchAPI, name)] == []


def test_the_values_are_the_ones_a_provider_row_spelled():
    assert {kind.value for kind in BatchApi} == {"openai", "anthropic", "gemini"}


@pytest.mark.parametrize(
    "provider", [p for p in PROVIDERS if p.batch_api is not None], ids=lambda p: p.name
)
def test_a_provider_gets_the_class_its_row_names(provider, monkeypatch):
    if engine_status(provider.name).why.startswith("needs "):
        pytest.skip(f"{provider.name}'s SDK is not installed here")
    if provider.key_env:
        monkeypatch.setenv(provider.key_env, "test-key")
    values = {"engine": provider.name, "model.model_name": "m"}
    if provider.url is None:
        values["remote_params.api_url"] = "http://127.0.0.1:9/v1"
    engine = create_engine(load_config(None, values))

    async def made() -> BatchAPI:
        return batch_api(engine, "24h")

    api = asyncio.run(made())
    assert type(api) is BATCH_APIS[provider.batch_api]
    assert api.window == "24h"
