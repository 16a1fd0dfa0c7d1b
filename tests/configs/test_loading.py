"""Recipes, dotted overrides and validation, as a user meets them."""

from __future__ import annotations

import textwrap

import pytest

from lmpress.configs import load_config, parse_overrides
from lmpress.configs.loading import config_to_yaml
from lmpress.vocabulary.errors import ConfigError


def write(tmp_path, text: str, name: str = "recipe.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_defaults_without_recipe():
    cfg = load_config()
    assert cfg.engine == "NATIVE"
    assert cfg.generation.temperature == 0.0
    assert cfg.generation.max_new_tokens == 256


def test_recipe_then_overrides_in_both_syntaxes(tmp_path):
    recipe = write(
        tmp_path,
        """
        engine: native
        model: {model_name: some/model}
        generation: {temperature: 0.5, max_new_tokens: 64}
        """,
    )
    pairs, positional = parse_overrides(
        ["--generation.temperature", "0.7", "--generation.top_p=0.9", "hello", "world"]
    )
    assert positional == ["hello", "world"]
    cfg = load_config(recipe, pairs)
    assert cfg.engine == "NATIVE"  # names are case-insensitive
    assert cfg.generation.temperature == 0.7
    assert cfg.generation.top_p == 0.9
    assert cfg.generation.max_new_tokens == 64
    assert cfg.model.model_name == "some/model"


def test_engine_flag_sets_top_level_engine():
    assert load_config(engine="native").engine == "NATIVE"


def test_bundled_recipe_by_name():
    cfg = load_config("tiny-native")
    assert cfg.model.model_name == "tiny:llama"


def test_unknown_recipe_names_the_bundled_ones():
    with pytest.raises(
        ConfigError, match=r"recipe 'tiny-nativ'.*Did you mean the bundled recipe 'tiny-native'"
    ):
        load_config("tiny-nativ")


def test_unknown_key_in_recipe_names_file_and_closest_key(tmp_path):
    recipe = write(tmp_path, "generation:\n  temprature: 0.2\n")
    with pytest.raises(ConfigError) as info:
        load_config(recipe)
    message = str(info.value)
    assert recipe in message
    assert "generation.temprature" in message
    assert "did you mean 'generation.temperature'" in message


def test_unknown_override_suggests_the_right_section():
    with pytest.raises(
        ConfigError, match=r"--generation.api_url.*did you mean '--remote_params.api_url'"
    ):
        load_config(overrides=[("generation.api_url", "http://x")])


def test_unknown_option_word():
    with pytest.raises(ConfigError, match="unknown option '--temprature'"):
        parse_overrides(["--temprature", "1"])


def test_wrong_type_names_the_key():
    with pytest.raises(ConfigError, match=r"^--generation.max_new_tokens: Value 'many'"):
        load_config(overrides=[("generation.max_new_tokens", "many")])


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("generation.temperature", "-0.1", "generation.temperature"),
        ("generation.top_p", "1.5", "generation.top_p"),
        ("generation.n", "0", "generation.n"),
        ("generation.max_new_tokens", "-1", "generation.max_new_tokens"),
        ("remote_params.num_workers", "0", "remote_params.num_workers"),
        ("generation.length_penalty", "50", "generation.length_penalty: 50.0 must be between"),
        ("generation.early_stopping", "soon", "generation.early_stopping: 'soon' must be true"),
        ("task", "summarize", "task: unknown task 'summarize'; use one of generate, embed"),
        ("task", "embedd", r"task: unknown task 'embedd' \(did you mean 'embed'\?\); use one"),
    ],
)
def test_impossible_values(key, value, expected):
    with pytest.raises(ConfigError, match=expected):
        load_config(overrides=[(key, value)])


def test_single_stop_string_becomes_a_list():
    cfg = load_config(overrides=[("generation.stop_strings", "###")])
    assert cfg.generation.stop_strings == ["###"]


def test_model_kwargs_take_any_key():
    cfg = load_config(overrides=[("model.model_kwargs.n_ctx", "2048")])
    assert cfg.model.model_kwargs == {"n_ctx": 2048}


def test_bad_yaml_names_file_and_line(tmp_path):
    recipe = write(tmp_path, "generation:\n  temperature: [0.1\n")
    with pytest.raises(ConfigError, match=rf"{recipe}:\d+"):
        load_config(recipe)


def test_section_given_a_scalar(tmp_path):
    recipe = write(tmp_path, "generation: 3\n")
    with pytest.raises(ConfigError, match="'generation' is a section"):
        load_config(recipe)


def test_oumi_inference_yaml_loads_unchanged(tmp_path):
    # The shape of Oumi's inference configs (configs/recipes/*/inference/*.yaml).
    recipe = write(
        tmp_path,
        """
        model:
          model_name: "HuggingFaceTB/SmolLM2-135M-Instruct"
          model_max_length: 2048
          torch_dtype_str: "bfloat16"
          trust_remote_code: True
          attn_implementation: "sdpa"
          tokenizer_pad_token: "<|endoftext|>"
        generation:
          max_new_tokens: 128
          batch_size: 1
          temperature: 0.0
          stop_strings: ["<|im_end|>"]
        remote_params:
          api_url: "https://example.invalid/v1/chat/completions"
          api_key_env_varname: "OPENAI_API_KEY"
          num_workers: 4
          max_retries: 3
          connection_timeout: 120
          politeness_policy: 1.0
        engine: NATIVE
        input_path: "in.jsonl"
        output_path: "out.jsonl"
        """,
    )
    cfg = load_config(recipe)
    assert cfg.model.torch_dtype_str == "bfloat16"
    assert cfg.generation.stop_strings == ["<|im_end|>"]
    assert cfg.remote_params.num_workers == 4
    assert cfg.input_path == "in.jsonl"


def test_config_yaml_redacts_literal_key():
    cfg = load_config(overrides=[("remote_params.api_key", "sk-secret-123")])
    text = config_to_yaml(cfg)
    assert "sk-secret-123" not in text
    assert "redacted" in text
