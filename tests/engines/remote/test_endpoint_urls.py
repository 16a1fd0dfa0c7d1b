"""Every remote engine takes a base URL or the full endpoint URL Oumi's configs name."""

from __future__ import annotations

import asyncio

import pytest

from lmpress.configs import load_config
from lmpress.engines.registry import create_engine
from lmpress.vocabulary.errors import ConfigError
from lmpress.vocabulary.types import GenerationParams, Message, Request, Result
from tests.servers.llm_server import LLMServer, reply_text

pytestmark = pytest.mark.timeout(120)

# engine -> the key variable it needs (None: a keyless local server is fine)
OPENAI_FAMILY = {
    "REMOTE": None, "REMOTE_VLLM": None, "SGLANG": None, "OPENAI": "OPENAI_API_KEY",
    "GEMINI": "GEMINI_API_KEY", "TOGETHER": "TOGETHER_API_KEY", "PARASAIL": "PARASAIL_API_KEY",
    "DEEPSEEK": "DEEPSEEK_API_KEY", "OPENROUTER": "OPENROUTER_API_KEY",
    "FIREWORKS": "FIREWORKS_API_KEY", "SAMBANOVA": "SAMBANOVA_API_KEY",
    "CEREBRAS": "CEREBRAS_API_KEY", "HUGGING_FACE_ROUTER": "HF_TOKEN",
    "BEDROCK": "AWS_BEARER_TOKEN_BEDROCK",
}  # fmt: skip


@pytest.fixture(scope="module")
def server():
    with LLMServer() as s:
        yield s


def answer(engine: str, url: str, monkeypatch, variable: str | None) -> str:
    if variable:
        monkeypatch.setenv(variable, "k-test")
    config = load_config(
        None,
        {"engine": engine, "model.model_name": "m", "remote_params.api_url": url},
    )
    (result,) = create_engine(config).generate(["hello"])
    assert result.ok, result.error
    return result.text


@pytest.mark.parametrize("engine", sorted(OPENAI_FAMILY))
@pytest.mark.parametrize("suffix", ["", "/", "/chat/completions"])
def test_openai_family_takes_base_or_endpoint_url(engine, suffix, server, monkeypatch):
    url = server.openai_url + suffix
    assert answer(engine, url, monkeypatch, OPENAI_FAMILY[engine]) == reply_text("hello")


def test_sglang_takes_the_native_generate_url_oumi_configs_name(server, monkeypatch):
    url = f"http://127.0.0.1:{server.port}/generate"
    assert answer("SGLANG", url, monkeypatch, None) == reply_text("hello")


@pytest.mark.parametrize("suffix", ["", "/v1", "/v1/messages"])
def test_anthropic_takes_base_or_endpoint_url(suffix, server, monkeypatch):
    url = f"http://127.0.0.1:{server.port}{suffix}"
    assert answer("ANTHROPIC", url, monkeypatch, "ANTHROPIC_API_KEY") == reply_text("hello")


def test_bedrock_builds_its_url_from_the_region(monkeypatch):
    monkeypatch.setenv("AWS_BEARER_TOKEN_BEDROCK", "k-test")
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    monkeypatch.delenv("AWS_REGION", raising=False)
    config = load_config(None, {"engine": "BEDROCK", "model.model_name": "m"})
    with pytest.raises(ConfigError, match="engine BEDROCK needs a region: export AWS_REGION"):
        create_engine(config)
    monkeypatch.setenv("AWS_REGION", "us-west-2")
    engine = create_engine(config)
    assert engine.api_url == "https://bedrock-runtime.us-west-2.amazonaws.com/openai/v1"


def stream_once(engine) -> None:
    async def run() -> None:
        request = Request("s", [Message("user", "hello")], GenerationParams())
        items = [item async for item in engine.stream(request)]
        await engine.aclose()
        assert isinstance(items[-1], Result) and items[-1].ok

    asyncio.run(run())


@pytest.mark.parametrize(
    "engine, variable, expected",
    [
        ("OPENAI", "OPENAI_API_KEY", ("user", "u-42")),
        ("ANTHROPIC", "ANTHROPIC_API_KEY", ("metadata", {"user_id": "u-42"})),
        ("REMOTE", None, None),  # only where Oumi sends it
    ],
)
@pytest.mark.parametrize("streamed", [False, True])
def test_user_id_is_sent_as_oumi_sends_it(
    engine, variable, expected, streamed, server, monkeypatch
):
    if variable:
        monkeypatch.setenv(variable, "k-test")
    suffix = "" if engine == "ANTHROPIC" else "/v1"
    overrides = {
        "engine": engine,
        "model.model_name": "m",
        "remote_params.api_url": f"http://127.0.0.1:{server.port}{suffix}",
        "remote_params.user_id": "u-42",
    }
    created = create_engine(load_config(None, overrides))
    if streamed:
        stream_once(created)
    else:
        (result,) = created.generate(["hello"])
        assert result.ok, result.error
    body = server.stats.bodies[-1][1]
    if expected is None:
        assert "user" not in body and "metadata" not in body
    else:
        assert body[expected[0]] == expected[1]
