"""Guided decoding: one typed value, accepted identically by every engine that supports its
form and refused, in one line naming the engine and the form, by every engine that does not.

Remote engines are built from recipes and send one request through their real SDK to the
loopback test server, which records the body; VLLM translates through the stand-in's
StructuredOutputsParams. What each engine sent is read back: REMOTE_VLLM's structured_outputs
must be exactly what VLLM hands vLLM, and a response_format must read back (as serve reads
it) into the same GuidedDecoding.
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from lmpress.configs import load_config
from lmpress.engines.base import check_params
from lmpress.engines.registry import create_engine, load_engine_class
from lmpress.vocabulary.errors import ConfigError, UnsupportedParamError
from lmpress.vocabulary.guided import GuidedDecoding
from lmpress.vocabulary.types import GenerationParams, Message, Request
from lmpress.wire.openai.requests import guided_decoding as read_response_format
from tests.engines.local.vllm.contract_support import standin  # noqa: F401 (a fixture)
from tests.servers.llm_server import LLMServer
from tests.servers.request_types import VLLM_EXTENSIONS

pytestmark = pytest.mark.timeout(120)

SCHEMA = {"type": "object", "properties": {"answer": {"type": "integer"}}}
TAG = {"type": "structural_tag", "format": {"type": "const_string", "value": "hi"}}
FORMS = {
    "json": {"json": SCHEMA},
    "json-text": {"json": '{"type": "object", "properties": {"answer": {"type": "integer"}}}'},
    "json_object": {"json_object": True},
    "regex": {"regex": "[0-9]+"},
    "choice": {"choice": ["yes", "no"]},
    "grammar": {"grammar": 'root ::= "yes" | "no"'},
    "structural_tag": {"structural_tag": TAG},
    "json-compact": {"json": SCHEMA, "disable_any_whitespace": True},
    "json-whitespace": {"json_object": True, "whitespace_pattern": r"[ ]?"},
}
VLLM_ALL = set(FORMS)
RESPONSE_FORMAT = {"json", "json-text", "json_object"}
# Engine -> the forms it accepts. An engine without guided_decoding refuses every form.
ACCEPTS = {
    "VLLM": VLLM_ALL,
    "REMOTE_VLLM": VLLM_ALL,
    "REMOTE": RESPONSE_FORMAT,
    "OPENAI": RESPONSE_FORMAT,
    "GEMINI": RESPONSE_FORMAT,
    "TOGETHER": RESPONSE_FORMAT,
    "SGLANG": RESPONSE_FORMAT,
    "CEREBRAS": RESPONSE_FORMAT,
    "ANTHROPIC": RESPONSE_FORMAT,
    "NATIVE": VLLM_ALL - {"structural_tag"},
    "LLAMACPP": VLLM_ALL - {"structural_tag"},
    "DEEPSEEK": set(),
    "SAMBANOVA": set(),
    "BEDROCK": set(),
}
KEYS = {"OPENAI": "OPENAI_API_KEY", "GEMINI": "GEMINI_API_KEY", "TOGETHER": "TOGETHER_API_KEY",
        "CEREBRAS": "CEREBRAS_API_KEY", "ANTHROPIC": "ANTHROPIC_API_KEY",
        "DEEPSEEK": "DEEPSEEK_API_KEY", "SAMBANOVA": "SAMBANOVA_API_KEY",
        "BEDROCK": "AWS_BEARER_TOKEN_BEDROCK"}  # fmt: skip


@pytest.fixture(scope="module")
def server():
    with LLMServer() as s:
        yield s


def guided(form: str) -> GuidedDecoding:
    value = GenerationParams(guided_decoding=FORMS[form]).guided_decoding
    assert value is not None
    return value


def vllm_fields(form: str) -> dict:
    """What VLLM hands vLLM for this form, as StructuredOutputsParams' fields."""
    from vllm.sampling_params import StructuredOutputsParams

    from lmpress.engines.local.vllm.engine import VllmApi
    from lmpress.engines.local.vllm.translate import sampling_params

    params = GenerationParams(temperature=0.5, guided_decoding=FORMS[form])
    structured = sampling_params(VllmApi.load(), params, stream=False).structured_outputs
    assert isinstance(structured, StructuredOutputsParams)
    defaults = StructuredOutputsParams.__dataclass_fields__
    return {k: v for k, v in dataclasses.asdict(structured).items() if v != defaults[k].default}


def sent_body(server: LLMServer, engine_name: str, form: str, monkeypatch) -> dict:
    """Build the engine from a recipe with this form and send one request; the body sent."""
    if engine_name in KEYS:
        monkeypatch.setenv(KEYS[engine_name], "sk-test-key")
    url = server.anthropic_url if engine_name == "ANTHROPIC" else server.openai_url
    # vLLM takes `structured_outputs`, a field OpenAI does not declare: the fake plays vLLM.
    server.faults.extensions = VLLM_EXTENSIONS if engine_name == "REMOTE_VLLM" else frozenset()
    config = load_config(None, {
        "engine": engine_name, "model.model_name": "test-model", "remote_params.api_url": url,
        "remote_params.max_retries": 0, "generation.guided_decoding": FORMS[form],
    })  # fmt: skip
    engine = create_engine(config)

    async def run():
        try:
            return await engine.complete(Request("r", [Message("user", "hi")], config.generation))
        finally:
            await engine.aclose()

    assert asyncio.run(run()).ok
    return server.stats.bodies[-1][1]


@pytest.mark.usefixtures("standin")
@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("engine_name", sorted(ACCEPTS))
def test_each_form_is_taken_alike_or_refused_in_one_line(
    engine_name,
    form,
    server,
    monkeypatch,
):
    accepted = form in ACCEPTS[engine_name]
    cls = load_engine_class(engine_name) if engine_name != "VLLM" else None
    params = GenerationParams(guided_decoding=FORMS[form])
    if not ACCEPTS[engine_name]:
        with pytest.raises(UnsupportedParamError) as refused:
            check_params(cls, params)
        assert str(refused.value).startswith(
            f"engine {engine_name} does not support generation.guided_decoding;"
        )
        return
    if engine_name == "VLLM":
        assert vllm_fields(form) == guided(form).vllm_fields()
        return
    if engine_name in LOCAL_MODELS:
        local_engine_takes(engine_name, form, accepted)
        return
    if not accepted:
        with pytest.raises(UnsupportedParamError) as refused:
            sent_body(server, engine_name, form, monkeypatch)
        message = str(refused.value)
        assert "\n" not in message
        if guided(form).form in ("json", "json_object"):  # the form is fine, an option is not
            assert message == (
                f"engine {engine_name} does not take generation.guided_decoding."
                f"{next(iter(guided(form).options()))} (vLLM's whitespace options)"
            )
        else:
            assert message == (
                f"engine {engine_name} takes generation.guided_decoding json, json_object "
                f"only, not {guided(form).form}"
            )
        return
    body = sent_body(server, engine_name, form, monkeypatch)
    if engine_name == "REMOTE_VLLM":
        assert body["structured_outputs"] == vllm_fields(form)  # what VLLM takes, as is
    elif engine_name == "ANTHROPIC":
        expected = SCHEMA if guided(form).form == "json" else {"type": "object"}
        assert body["output_config"] == {"format": {"type": "json_schema", "schema": expected}}
    else:  # read back as lmpress serve reads a response_format: the same value
        assert read_response_format(body["response_format"]) == guided(form)


LOCAL_MODELS = {"NATIVE": "tiny-gguf:gpt2-q8", "LLAMACPP": "tiny-gguf:gpt2-q8"}  # byte-level BPE


def local_engine_takes(engine_name: str, form: str, accepted: bool) -> None:
    """A local engine compiles the recipe's form when it loads, or refuses it in one line; a
    row then decodes under it (random weights: the reply follows the grammar, cut or not)."""
    config = load_config(None, {
        "engine": engine_name, "model.model_name": LOCAL_MODELS[engine_name],
        "generation.max_new_tokens": 8, "generation.guided_decoding": FORMS[form],
    })  # fmt: skip
    if not accepted:
        with pytest.raises(ConfigError) as refused:
            create_engine(config)
        assert str(refused.value) == (
            f"engine {engine_name} takes generation.guided_decoding json, json_object, regex, "
            f"choice, grammar only, not {guided(form).form}"
        )
        return
    engine = create_engine(config)
    try:
        result = engine.generate([Request("r", [Message("user", "hi")], config.generation)])[0]
    finally:
        asyncio.run(engine.aclose())
    assert result.ok, result.error
    assert result.finish_reason in ("stop", "length")


def test_a_recipe_is_checked_once_when_loaded():
    with pytest.raises(ConfigError, match=r"give exactly one of .* \(got json, regex\)"):
        load_config(None, {"generation.guided_decoding": {"json": SCHEMA, "regex": "a"}})
    with pytest.raises(ConfigError, match=r"guided_decoding\.jsn'.*did you mean"):
        load_config(None, {"generation.guided_decoding": {"jsn": SCHEMA}})
    with pytest.raises(ConfigError, match=r"guided_decoding\.json: not valid JSON"):
        GenerationParams(guided_decoding={"json": "{not json"})
    # Oumi writes every field, the unused ones null: that is no constraint at all.
    empty = {"json": None, "regex": None, "choice": None, "strict": False}
    assert (
        load_config(None, {"generation.guided_decoding": empty}).generation.guided_decoding is None
    )
