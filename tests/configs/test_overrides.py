"""Per-row generation overrides (`configs/overrides.py`), checked against OmegaConf's structured
merge, which is what recipes and flags go through and what rows went through before."""

from __future__ import annotations

import dataclasses

import pytest
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from lmpress.configs.loading import _coerce_lists, _omegaconf_message, load_config
from lmpress.configs.overrides import generation_with_overrides
from lmpress.configs.schema import check_range
from lmpress.vocabulary.errors import ConfigError
from lmpress.vocabulary.types import GenerationParams

BASE = GenerationParams(temperature=0.3, stop_strings=["END"]).mark_explicit({"temperature"})

# Values as rows and OpenAI Batch bodies give them: right, convertible, and wrong.
CASES = [
    {"temperature": 0.7, "max_new_tokens": 16},
    {"temperature": "0.5"}, {"temperature": " 0.5"}, {"temperature": 1}, {"temperature": "1e-3"},
    {"temperature": "hot"}, {"temperature": True}, {"temperature": None}, {"temperature": [1]},
    {"temperature": {"a": 1}}, {"temperature": -1}, {"temperature": float("nan")},
    {"top_p": "high"}, {"top_p": 2}, {"min_p": 2}, {"presence_penalty": 3},
    {"max_new_tokens": "12"}, {"max_new_tokens": "+12"}, {"max_new_tokens": 1.5},
    {"max_new_tokens": 10.0}, {"max_new_tokens": True}, {"max_new_tokens": None},
    {"max_new_tokens": "1e3"}, {"max_new_tokens": 0}, {"max_new_tokens": [1]},
    {"top_k": None}, {"top_k": 5}, {"top_k": "x"}, {"top_k": True},
    {"seed": 3}, {"seed": -1}, {"seed": 2**70}, {"seed": 1.0}, {"seed": "abc"},
    {"stop_strings": "x"}, {"stop_strings": 5}, {"stop_strings": ["a", 1, True, 1.5]},
    {"stop_strings": []}, {"stop_strings": [""]}, {"stop_strings": None}, {"stop_strings": [None]},
    {"stop_token_ids": [1, "2"]}, {"stop_token_ids": 5}, {"stop_token_ids": ["x"]},
    {"stop_token_ids": [1.5]}, {"stop_token_ids": [True]}, {"stop_token_ids": None},
    {"logprobs": True}, {"logprobs": "yes"}, {"logprobs": "On"}, {"logprobs": "0"},
    {"logprobs": 2}, {"logprobs": "maybe"}, {"logprobs": 1.0}, {"logprobs": None},
    {"logprobs": [1]}, {"top_logprobs": 3}, {"top_logprobs": 21},
    {"logit_bias": {"5": 1}}, {"logit_bias": {"5": "x"}}, {"logit_bias": {"5": True}},
    {"logit_bias": {"5": None}}, {"logit_bias": {"5": 101}}, {"logit_bias": None},
    {"logit_bias": "x"}, {"logit_bias": {5: 1}},
    {"guided_decoding": {"json": {"type": "object"}}}, {"guided_decoding": None},
    {"guided_decoding": {"regex": None, "choice": ["a"], "strict": False}},
    {"use_sampling": False, "temperature": 0.7}, {"use_sampling": "off"}, {"use_sampling": None},
    {"use_sampling": "maybe"}, {"tool_choice": {"a": [1]}}, {"tool_choice": "auto"},
    {"n": 0}, {"n": "2"}, {"skip_special_tokens": "no"}, {"num_beams": 2},
    {"repetition_penalty": 0}, {"min_tokens": -1},
]  # fmt: skip


def omegaconf_overrides(base: GenerationParams, overrides: dict) -> GenerationParams:
    """The reference: OmegaConf's structured merge, then the same range checks."""
    try:
        merged = OmegaConf.merge(
            OmegaConf.structured(base), _coerce_lists(overrides, GenerationParams)
        )
        params: GenerationParams = OmegaConf.to_object(merged)  # type: ignore[assignment]
    except OmegaConfBaseException as exc:
        raise ConfigError(f"generation: {_omegaconf_message(exc)}") from exc
    params.mark_explicit(base.explicit_fields() | set(overrides))
    for name in overrides:
        check_range(params, f"generation.{name}", "generation")
    return params


def outcome(apply, overrides: dict):
    try:
        params = apply(BASE, overrides)
    except ConfigError as exc:
        return "error", str(exc)
    return dataclasses.asdict(params), params.explicit_fields()


@pytest.mark.parametrize("overrides", CASES, ids=repr)
def test_overrides_match_omegaconf(overrides):
    assert outcome(generation_with_overrides, overrides) == outcome(omegaconf_overrides, overrides)


def test_values_come_back_typed():
    params = generation_with_overrides(BASE, {"temperature": "0.5", "stop_token_ids": ["7"]})
    assert type(params.temperature) is float and params.stop_token_ids == [7]
    assert params.explicit_fields() == {"temperature", "stop_token_ids"}
    assert BASE.temperature == 0.3 and BASE.stop_token_ids == []  # the base is left as it was


# Where OmegaConf crashed, let a non-string stop string through, or spoke of its own merge
# (guided_decoding is a typed value now), the error names the key and what it should be.
@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"stop_strings": {"a": 1}}, "generation: stop_strings[0]: Invalid type assigned: dict"),
        ({"stop_strings": ["a", ["b"]]}, "generation: stop_strings[1]: Invalid type assigned"),
        ({"logit_bias": [1]}, "generation: logit_bias: Cannot assign list to Dict[str, float]"),
        (
            {"guided_decoding": [1]},
            "generation.guided_decoding must be a mapping such as {json: SCHEMA}, got list",
        ),
        (
            {"guided_decoding": "x"},
            "generation.guided_decoding must be a mapping such as {json: SCHEMA}, got str",
        ),
        (
            {"guided_decoding": 5},
            "generation.guided_decoding must be a mapping such as {json: SCHEMA}, got int",
        ),
        ({"temprature": 1}, "generation: Key 'temprature' not in 'GenerationParams'"),
    ],
)
def test_values_omegaconf_did_not_refuse_cleanly(overrides, message):
    with pytest.raises(ConfigError) as caught:
        generation_with_overrides(BASE, overrides)
    assert str(caught.value).startswith(message)


# GenerationParams refuses these with a bare ValueError when built; a row, a chat's /set and a
# recipe each say it in one line naming the key.
@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            {"reasoning_effort": "bogus"},
            "generation.reasoning_effort: 'bogus' must be one of none, minimal, low, medium, high",
        ),
        ({"max_reasoning_tokens": -2}, "generation.max_reasoning_tokens: -2 must be 0 or more"),
    ],
)
def test_a_bad_reasoning_setting_names_its_key(overrides, message):
    with pytest.raises(ConfigError) as caught:
        generation_with_overrides(BASE, overrides, source="row 3")
    assert str(caught.value).startswith(f"row 3: {message}")
    key, value = next(iter(overrides.items()))
    with pytest.raises(ConfigError) as caught:
        load_config(overrides={f"generation.{key}": value})
    assert str(caught.value).startswith(message)


def test_good_reasoning_settings_apply():
    params = generation_with_overrides(
        BASE, {"reasoning_effort": "none", "max_reasoning_tokens": "0"}
    )
    assert (params.reasoning_effort, params.max_reasoning_tokens) == ("none", 0)


def test_speculative_method_off_reads_as_off_from_yaml(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("engine: LLAMACPP\nmodel:\n  speculative_method: off\n")
    assert load_config(str(recipe)).model.speculative_method == "off"
    assert (
        load_config(overrides={"model.speculative_method": "off"}).model.speculative_method == "off"
    )
    with pytest.raises(
        ConfigError, match="speculative_method: 'True' must be off or ngram or draft_model"
    ):
        load_config(overrides={"model.speculative_method": "on"})
