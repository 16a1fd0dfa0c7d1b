"""The hosted providers and remote servers lmpress speaks to, one row each.

A row says everything a provider needs: its engine name, the class that speaks its protocol,
its base URL and key variable, the generation parameters it accepts and how it spells them
(`Dialect`). The registry lists engines from this table and `engine_class` binds a row onto
its protocol class, so adding an OpenAI-compatible provider is adding one row.

Nothing here imports an SDK: `lmpress --help` and `lmpress engines` read this table.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from lmpress.openai_wire.client import OPEN_MODEL_PARAMS, OPENAI_PARAMS, VLLM_PARAMS, Dialect

OPENAI_COMPAT = "lmpress.engines.remote.openai_compat:OpenAICompatEngine"

GOOGLE_PARAMS = frozenset({
    "max_new_tokens", "temperature", "top_p", "n", "stop_strings", "seed", "presence_penalty",
    "frequency_penalty", "guided_decoding",
})  # fmt: skip
# Hosts of open models take their extra sampling fields, and no logit_bias (token ids differ).
OPEN_MODEL_HOST_PARAMS = (OPENAI_PARAMS - {"logit_bias"}) | OPEN_MODEL_PARAMS
OPEN_MODEL_HOST = Dialect(extra_fields=OPEN_MODEL_PARAMS)


@dataclass(frozen=True)
class Provider:
    """One remote engine: what it is called and everything that sets it apart."""

    name: str
    summary: str  # a line for `lmpress engines`
    url: str | None = None  # the default base URL; None: remote_params.api_url (or the class's)
    key_env: str | None = None  # the default variable holding the API key
    params: frozenset[str] = OPENAI_PARAMS  # the GenerationParams fields it honours
    dialect: Dialect = field(default_factory=Dialect)
    key_required: bool = True  # False: a keyless local server is fine
    model_required: bool = True  # False: asked of the server (GET /models)
    user_field: bool = False  # send remote_params.user_id as OpenAI's `user`
    engine: str = OPENAI_COMPAT  # "module:Class" speaking its protocol, bound to this row
    extra: str = "remote"  # the lmpress extra that installs its SDK
    requires: tuple[str, ...] = ("openai",)  # importable modules it needs


PROVIDERS: tuple[Provider, ...] = (
    Provider("OPENAI", "OpenAI chat completions API", "https://api.openai.com/v1",
             "OPENAI_API_KEY", dialect=Dialect(max_tokens_field="max_completion_tokens"),
             user_field=True),
    Provider("ANTHROPIC", "Anthropic Messages API", "https://api.anthropic.com",
             "ANTHROPIC_API_KEY", frozenset({"max_new_tokens", "stop_strings", "guided_decoding"}),
             engine="lmpress.engines.remote.anthropic:AnthropicEngine", requires=("anthropic",)),
    Provider("REMOTE", "any OpenAI-compatible server", key_required=False, model_required=False),
    Provider("REMOTE_VLLM", "a remote vLLM server", params=OPENAI_PARAMS | VLLM_PARAMS,
             dialect=Dialect(extra_fields=VLLM_PARAMS, structured_outputs=True),
             key_required=False, model_required=False),
    Provider("GEMINI", "Google Gemini (OpenAI-compatible)",
             "https://generativelanguage.googleapis.com/v1beta/openai/", "GEMINI_API_KEY",
             GOOGLE_PARAMS),
    Provider("GOOGLE_VERTEX", "Google Vertex AI", params=GOOGLE_PARAMS, key_required=False,
             engine="lmpress.engines.remote.vertex:GoogleVertexEngine", extra="vertex",
             requires=("openai", "google.auth")),
    Provider("TOGETHER", "Together AI", "https://api.together.xyz/v1", "TOGETHER_API_KEY",
             OPEN_MODEL_HOST_PARAMS, OPEN_MODEL_HOST),
    Provider("PARASAIL", "Parasail", "https://api.parasail.io/v1", "PARASAIL_API_KEY",
             OPEN_MODEL_HOST_PARAMS, OPEN_MODEL_HOST),
    Provider("DEEPSEEK", "DeepSeek", "https://api.deepseek.com/v1", "DEEPSEEK_API_KEY",
             frozenset({"max_new_tokens", "temperature", "top_p", "presence_penalty",
                        "frequency_penalty", "stop_strings", "logprobs", "top_logprobs"})),
    Provider("OPENROUTER", "OpenRouter", "https://openrouter.ai/api/v1", "OPENROUTER_API_KEY",
             OPENAI_PARAMS | OPEN_MODEL_PARAMS, OPEN_MODEL_HOST),
    Provider("FIREWORKS", "Fireworks AI", "https://api.fireworks.ai/inference/v1",
             "FIREWORKS_API_KEY", OPEN_MODEL_HOST_PARAMS, OPEN_MODEL_HOST),
    # SGLang's OpenAI-compatible API: guided_decoding.json goes as response_format.
    Provider("SGLANG", "a running SGLang server (OpenAI-compatible API)",
             params=OPENAI_PARAMS | VLLM_PARAMS, dialect=Dialect(extra_fields=VLLM_PARAMS),
             key_required=False, model_required=False,
             engine="lmpress.engines.remote.openai_compat:SGLangEngine"),
    Provider("SAMBANOVA", "SambaNova Cloud", "https://api.sambanova.ai/v1", "SAMBANOVA_API_KEY",
             frozenset({"max_new_tokens", "temperature", "top_p", "top_k", "stop_strings"}),
             Dialect(extra_fields=frozenset({"top_k"}))),
    Provider("CEREBRAS", "Cerebras Inference", "https://api.cerebras.ai/v1", "CEREBRAS_API_KEY",
             frozenset({"max_new_tokens", "temperature", "top_p", "stop_strings", "seed",
                        "logprobs", "top_logprobs", "guided_decoding"})),
    Provider("HUGGING_FACE_ROUTER", "Hugging Face Inference Providers (router)",
             "https://router.huggingface.co/v1", "HF_TOKEN", OPENAI_PARAMS - {"logit_bias"}),
    # The region's URL comes from AWS_REGION, as in Oumi (BedrockEngine).
    Provider("BEDROCK", "Amazon Bedrock (OpenAI-compatible Chat Completions)",
             key_env="AWS_BEARER_TOKEN_BEDROCK",
             params=frozenset({"max_new_tokens", "temperature", "top_p", "stop_strings"}),
             engine="lmpress.engines.remote.openai_compat:BedrockEngine"),
)  # fmt: skip

BY_NAME = {provider.name: provider for provider in PROVIDERS}


@cache
def engine_class(name: str) -> type[Any]:
    """The engine class for a provider: its protocol class with the row's settings bound."""
    provider = BY_NAME[name]
    module_name, _, class_name = provider.engine.partition(":")
    base = getattr(importlib.import_module(module_name), class_name)
    settings = {
        "name": provider.name,
        "supported_params": provider.params,
        "default_api_url": provider.url,
        "default_key_env": provider.key_env,
        "key_required": provider.key_required,
        "model_required": provider.model_required,
        "user_field": provider.user_field,
        "dialect": provider.dialect,
        "__doc__": f"{provider.summary}: {base.__name__} with the {provider.name} row.",
        "__module__": base.__module__,
    }
    return type(f"{provider.name.title().replace('_', '')}Engine", (base,), settings)
