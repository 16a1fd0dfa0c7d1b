"""Oumi-shaped remote configs run unchanged through the real command, once the URL and key
point at the loopback test server. The configs are written here from Oumi's field names."""

from __future__ import annotations

import pytest

from tests.conftest import run_lmpress
from tests.servers.llm_server import LLMServer, reply_text

# engine -> its key variable; every config names the full chat-completions endpoint, as
# Oumi's do, and sets the fields Oumi's remote configs carry.
ENGINES = {
    "REMOTE_VLLM": None, "REMOTE": None, "SGLANG": None, "OPENAI": "OPENAI_API_KEY",
    "GOOGLE_GEMINI": "GEMINI_API_KEY", "TOGETHER": "TOGETHER_API_KEY",
    "HUGGING_FACE_ROUTER": "HF_TOKEN",
}  # fmt: skip

CONFIG = """\
engine: {engine}
model:
  model_name: some-model
  tool_call_parser: hermes
remote_params:
  api_url: "{url}/v1/chat/completions"
  num_workers: 4
  politeness_policy: 0.0
  batch_completion_window: 24h
  use_adaptive_concurrency: true
generation:
  max_new_tokens: 32
  temperature: 0.0
  use_sampling: false
  tool_choice: none
  parallel_tool_calls: true
"""


@pytest.fixture(scope="module")
def server():
    with LLMServer() as s:
        yield s


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_an_oumi_remote_config_runs_unchanged(engine, server, tmp_path):
    recipe = tmp_path / "oumi_infer.yaml"
    recipe.write_text(CONFIG.format(engine=engine, url=f"http://127.0.0.1:{server.port}"))
    env = {ENGINES[engine]: "k-test"} if ENGINES[engine] else {}
    run = run_lmpress("infer", "-c", str(recipe), "Why is the sky blue?", env=env)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == reply_text("Why is the sky blue?")
    sent = server.stats.bodies[-1][1]
    assert "tool_choice" not in sent and "tools" not in sent  # no tools are sent
