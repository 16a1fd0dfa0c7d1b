"""Every field of Oumi's InferenceConfig loads; the ones inference means something by act.

The config below is written from the field names of Oumi's dataclasses (InferenceConfig,
ModelParams, GenerationParams, RemoteParams, GuidedDecodingParams), not copied from its files.
"""

from __future__ import annotations

import textwrap

import pytest

from lmpress.configs import load_config
from lmpress.vocabulary.errors import ConfigError
from lmpress.vocabulary.guided import GuidedDecoding

EVERY_OUMI_FIELD = """
name: every-field
engine: NATIVE
input_path: in.jsonl
output_path: out.jsonl
progress_path: progress.json
model:
  model_name: some/model
  adapter_model: null
  tokenizer_name: some/tokenizer
  tokenizer_pad_token: "<pad>"
  tokenizer_kwargs: {use_fast: true}
  processor_kwargs: {num_crops: 4}
  model_max_length: 2048
  load_pretrained_weights: false
  trust_remote_code: false
  torch_dtype_str: bfloat16
  compile: false
  chat_template: chatml
  chat_template_kwargs: {enable_thinking: false}
  attn_implementation: sdpa
  device_map: auto
  model_kwargs: {filename: model.gguf}
  enable_liger_kernel: true
  shard_for_eval: true
  freeze_layers: [embed_tokens]
  model_revision: main
  tool_call_parser: hermes
generation:
  max_new_tokens: 64
  batch_size: 4
  exclude_prompt_from_response: true
  seed: 7
  temperature: 0.7
  top_p: 0.9
  frequency_penalty: 0.1
  presence_penalty: 0.1
  stop_strings: ["END"]
  stop_token_ids: [2]
  logit_bias: {"5": 1.0}
  min_p: 0.05
  use_cache: true
  num_beams: 1
  use_sampling: true
  guided_decoding: {json: {type: object}, regex: null, choice: null, strict: false}
  skip_special_tokens: true
  tool_choice: auto
  parallel_tool_calls: true
remote_params:
  api_url: http://127.0.0.1:1/v1
  api_key: sk-test
  api_key_env_varname: MY_KEY
  user_id: someone
  max_retries: 3
  retry_backoff_base: 0.5
  retry_backoff_max: 10
  connection_timeout: 60
  num_workers: 4
  requests_per_minute: 100
  input_tokens_per_minute: 10000
  output_tokens_per_minute: 10000
  politeness_policy: 0.0
  batch_completion_window: 24h
  use_adaptive_concurrency: true
"""


def write(tmp_path, text: str) -> str:
    path = tmp_path / "oumi.yaml"
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_a_config_with_every_oumi_field_loads(tmp_path, capsys):
    cfg = load_config(write(tmp_path, EVERY_OUMI_FIELD))
    assert cfg.name == "every-field"
    assert cfg.model.load_pretrained_weights is False
    assert cfg.model.processor_kwargs == {"num_crops": 4}
    assert cfg.generation.use_sampling is True
    assert cfg.generation.temperature == 0.7
    assert cfg.generation.guided_decoding == GuidedDecoding(
        json={"type": "object"}
    )  # nulls dropped
    assert cfg.remote_params.batch_completion_window == "24h"
    notice = capsys.readouterr().err.strip().splitlines()
    assert notice == [
        "lmpress: note: ignoring training-only fields model.enable_liger_kernel, "
        "model.shard_for_eval, model.freeze_layers (inference does not read them)"
    ]


def test_the_config_shows_through_the_cli(tmp_path, lmpress_cli):
    result = lmpress_cli("config", "show", "-c", write(tmp_path, EVERY_OUMI_FIELD))
    assert result.returncode == 0, result.stderr
    assert "load_pretrained_weights: false" in result.stdout
    assert "ignoring training-only fields model.enable_liger_kernel" in result.stderr


def test_no_notice_when_no_training_field_is_set(capsys):
    load_config("tiny-native")
    assert capsys.readouterr().err == ""


def test_use_sampling_false_decodes_greedily_whatever_the_temperature(tmp_path):
    cfg = load_config(write(tmp_path, "generation: {temperature: 0.8, use_sampling: false}\n"))
    assert cfg.generation.temperature == 0.0
    assert cfg.generation.sampling_temperature() == 0.0


def test_use_sampling_unset_follows_the_temperature():
    cfg = load_config(overrides={"generation.temperature": 0.8})
    assert cfg.generation.sampling_temperature() == 0.8


@pytest.mark.parametrize("oumi_name, engine", [("GOOGLE_GEMINI", "GEMINI"), ("SGLANG", "SGLANG")])
def test_oumi_engine_names_load(oumi_name, engine):
    assert load_config(engine=oumi_name).engine == engine


def test_an_unknown_model_key_is_still_refused_with_a_suggestion(tmp_path):
    with pytest.raises(
        ConfigError, match=r"model.load_pretrained_weight'.*'model.load_pretrained_weights'"
    ):
        load_config(write(tmp_path, "model: {load_pretrained_weight: false}\n"))


def test_an_oumi_job_config_is_named_for_what_it_is(tmp_path):
    job = "name: bulk\nnum_nodes: 1\nresources: {cloud: gcp}\nrun: oumi infer -c x.yaml\n"
    with pytest.raises(ConfigError, match=r"an Oumi job config \(for `oumi launch`"):
        load_config(write(tmp_path, job))
