"""An engine's typed `model.model_kwargs` settings (engines/options.py): the checks every engine
shares, on a small options class of this file's and on the local engines' own."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from lmpress.engines.options import (
    EngineOptions,
    check_model_kwargs,
    check_passed_through,
    describe,
    fits,
    setting,
)
from lmpress.engines.registry import LOCAL, engine_class, engine_settings
from lmpress.vocabulary.errors import ConfigError


@dataclass
class Closed(EngineOptions):
    """Settings of an engine that hands no other key to its backend."""

    refused = {"seed": "set generation.seed instead"}

    budget_gb: float | None = setting(None, "a budget")
    reuse: bool = setting(True, "a switch")
    widths: bool | list[int] | None = setting(None, "true, or the widths")


@dataclass
class Open(Closed):
    passes_to = "the backend"
    known_as = "a setting or backend argument"


def refusal(options: type[EngineOptions], kwargs: dict) -> str:
    with pytest.raises(ConfigError) as caught:
        check_model_kwargs(options, kwargs)
    return str(caught.value)


def test_a_typo_of_a_setting_is_refused_with_the_setting_it_meant():
    expected = (
        "model.model_kwargs.budget_g: not a setting of this engine; did you mean 'budget_gb'?"
    )
    assert refusal(Closed, {"budget_g": 1}) == expected
    # Even where other keys go to the backend: one typo away from a setting is that setting.
    assert refusal(Open, {"reus": False}) == (
        "model.model_kwargs.reus: not a setting or backend argument; did you mean 'reuse'?"
    )


def test_an_unknown_key_is_refused_or_left_to_the_backend():
    assert refusal(Closed, {"n_ctx": 1}) == (
        "model.model_kwargs.n_ctx: not a setting of this engine; valid keys: budget_gb, reuse, "
        "widths"
    )
    check_model_kwargs(Open, {"n_ctx": 1})  # the engine checks it against its backend


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"budget_gb": "lots"}, "model.model_kwargs.budget_gb: 'lots' is not a number, or null"),
        ({"budget_gb": True}, "model.model_kwargs.budget_gb: True is not a number, or null"),
        ({"reuse": "yes"}, "model.model_kwargs.reuse: 'yes' is not true or false"),
        (
            {"widths": [8, "x"]},
            "model.model_kwargs.widths: [8, 'x'] is not true or false, or a list of whole "
            "numbers, or null",
        ),
        ({"seed": 1}, "model.model_kwargs.seed: set generation.seed instead"),
    ],
)
def test_a_setting_of_the_wrong_type_or_a_refused_key_is_one_line(kwargs, expected):
    assert refusal(Open, kwargs) == expected


def test_values_of_the_declared_types_pass():
    check_model_kwargs(Closed, {"budget_gb": 2, "reuse": False, "widths": [64, 128]})
    check_model_kwargs(Closed, {"budget_gb": 0.5, "widths": True})
    options = Closed.of({"budget_gb": 0.5})
    assert (options.budget_gb, options.reuse, options.widths) == (0.5, True, None)


def test_keys_passed_to_the_backend_are_checked_against_what_it_takes():
    passed = check_passed_through(Open, {"reuse": True, "n_ctx": 8}, accepted=["n_ctx", "n_batch"])
    assert passed == {"n_ctx": 8}
    with pytest.raises(ConfigError) as caught:
        check_passed_through(Open, {"n_batc": 8}, accepted=["n_ctx", "n_batch"])
    assert str(caught.value) == (
        "model.model_kwargs.n_batc: not a setting or backend argument; did you mean 'n_batch'?"
    )


def test_fits_reads_yaml_values_strictly():
    assert fits(1, float) and fits(1.5, float) and not fits(True, float)
    assert fits(3, int) and not fits(True, int) and not fits(3.0, int)
    assert fits(None, int | None) and not fits(None, int)
    assert describe(list[int]) == "a list of whole numbers"


def test_every_local_engine_declares_its_settings_each_with_a_type_default_and_one_line():
    for spec in LOCAL:
        options = engine_class(spec.name).options
        assert options is not None, spec.name
        settings, passes_to = engine_settings(spec.name)
        assert passes_to, spec.name  # each hands other keys to its backend
        for s in settings:
            assert s.type and s.description and "\n" not in s.description, (spec.name, s)
            assert len(s.description) <= 90, (spec.name, s.name)
            check_model_kwargs(options, {s.name: s.default})  # a default is a valid value
