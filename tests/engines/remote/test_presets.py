"""The providers table: each row is one engine, listed by the registry and built with the
row's URL, key variable, parameters and dialect, and nothing else describes a provider."""

from __future__ import annotations

import pytest

from lmpress.engines.registry import engine_names, engine_status, get_spec, load_engine_class
from lmpress.engines.remote.presets import PROVIDERS


@pytest.mark.parametrize("provider", PROVIDERS, ids=lambda p: p.name)
def test_each_row_is_an_engine_built_from_it(provider):
    assert provider.name in engine_names()
    spec = get_spec(provider.name)
    assert (spec.summary, spec.extra, spec.requires) == (
        provider.summary,
        provider.extra,
        provider.requires,
    )
    if engine_status(provider.name).why.startswith("needs "):
        return  # its SDK is not installed here
    cls = load_engine_class(provider.name)
    assert cls.name == provider.name
    assert cls.supported_params == provider.params
    assert cls.default_api_url == provider.url and cls.default_key_env == provider.key_env
    assert cls.key_required == provider.key_required
    assert cls.model_required == provider.model_required
    assert load_engine_class(provider.name) is cls  # bound once


def test_names_are_unique():
    names = [p.name for p in PROVIDERS]
    assert len(names) == len(set(names))
