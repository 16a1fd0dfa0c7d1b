"""The hosted providers and remote servers lmpress speaks to, one row each.

A row says everything a provider needs: its engine name, the class that speaks its protocol,
its base URL and key variable, the generation parameters it accepts and how it spells them
(`Dialect`), and what a dry run needs to price a job: whether it has a batch API at a discount,
and a tokenizer that counts its prompts where one is published. The registry lists engines from
this table and `engine_class` binds a row onto its protocol class, so adding an
OpenAI-compatible provider is adding one row. `PRICES` below is the providers' price list.

Nothing here imports an SDK: `lmpress --help` and `lmpress engines` read this table.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from enum import Enum
from functools import cache
from typing import Any, Literal

from lmpress.engines.remote.reasoning import GOOGLE, OPENAI_EFFORT, ReasoningFields
from lmpress.wire.openai.client import (
    OPEN_MODEL_PARAMS,
    OPENAI_PARAMS,
    SCORING_PARAMS,
    VLLM_PARAMS,
    Dialect,
)

OPENAI_COMPAT = "lmpress.engines.remote.openai_compat:OpenAICompatEngine"
GENERATE = frozenset({"generate"})
EMBED = frozenset({"generate", "embed"})
# vLLM's server also scores pairs (/score) for a cross-encoder, and so reranks.
POOLING = EMBED | {"score", "rerank"}

GOOGLE_PARAMS = frozenset({
    "max_new_tokens", "temperature", "top_p", "n", "stop_strings", "seed", "presence_penalty",
    "frequency_penalty", "guided_decoding",
})  # fmt: skip
# Hosts of open models take their extra sampling fields, and no logit_bias (token ids differ).
OPEN_MODEL_HOST_PARAMS = (OPENAI_PARAMS - {"logit_bias"}) | OPEN_MODEL_PARAMS
OPEN_MODEL_HOST = Dialect(extra_fields=OPEN_MODEL_PARAMS)
SGLANG_PARAMS = VLLM_PARAMS - {"bad_words"}


PromptCaching = Literal["marked", "automatic"]


class BatchApi(str, Enum):
    """A provider's batch API, as lmpress drives it (`batch/provider/apis.py` has a class for
    each, in a table a test checks is whole)."""

    OPENAI = "openai"  # Files + Batches (OpenAI, and OpenAI-compatible servers that have them)
    ANTHROPIC = "anthropic"  # Message Batches
    GEMINI = "gemini"  # Gemini's batch mode, through the google-genai SDK

    def __str__(self) -> str:
        return self.value

    @property
    def title(self) -> str:
        return {BatchApi.OPENAI: "OpenAI's Batch API", BatchApi.ANTHROPIC: "Anthropic's Message "
                "Batches", BatchApi.GEMINI: "Gemini's batch mode"}[self]  # fmt: skip

    @property
    def tasks(self) -> frozenset[str]:
        """The tasks its batches take: OpenAI's takes /v1/embeddings lines beside chat and
        completion lines; neither has a /v1/score or /v1/rerank endpoint to batch, and
        Anthropic has no embeddings at all. A provider batches the tasks in both this and its
        own `Provider.tasks`. Gemini's batch mode has embeddings of its own
        (asyncBatchEmbedContent), which lmpress does not drive yet."""
        return EMBED if self is BatchApi.OPENAI else GENERATE


@dataclass(frozen=True)
class Provider:
    """One remote engine: what it is called and everything that sets it apart."""

    name: str
    summary: str  # a line for `lmpress engines`
    url: str | None = None  # the default base URL; None: remote_params.api_url (or the class's)
    key_env: str | None = None  # the default variable holding the API key
    params: frozenset[str] = OPENAI_PARAMS  # the GenerationParams fields it honours
    dialect: Dialect = field(default_factory=Dialect)
    # Which reasoning fields an OpenAI-compatible service takes (reasoning.py), whose
    # GenerationParams fields join `params`. ANTHROPIC's are in anthropic.py and its params.
    reasoning: ReasoningFields = field(default_factory=ReasoningFields)
    key_required: bool = True  # False: a keyless local server is fine
    model_required: bool = True  # False: asked of the server (GET /models)
    user_field: bool = False  # send remote_params.user_id as OpenAI's `user`
    engine: str = OPENAI_COMPAT  # "module:Class" speaking its protocol, bound to this row
    extra: str = "remote"  # the lmpress extra that installs its SDK
    requires: tuple[str, ...] = ("openai",)  # importable modules it needs
    # Its batch API's price as a share of the live price (0.5: half); None: it has none.
    batch_discount: float | None = None
    # How its prompt cache works (prompt_cache.py): "marked", only what a request marks
    # (Anthropic's cache_control); "automatic", any long enough prompt; None: none billed apart.
    prompt_caching: PromptCaching | None = None
    # What writing a prompt-cache entry costs as a share of the input price (Anthropic's
    # 5-minute cache: 1.25); None: writing costs what input costs (OpenAI, Gemini).
    cache_write_share: float | None = None
    # The batch API lmpress drives for it (None: none), and one batch's limits as the provider
    # documents them.
    batch_api: BatchApi | None = None
    batch_max_requests: int = 50_000
    batch_max_bytes: int = 200 * 1024 * 1024
    # Where it has no batch API lmpress drives: why, and what to do, for the refusal's line.
    batch_refusal: str | None = None
    # A Hugging Face tokenizer (a local path or a cached hub id) that counts its prompts
    # exactly; None where the provider publishes none (the dry run then estimates).
    tokenizer: str | None = None
    # The tasks it answers (vocabulary/embeddings.py): `embed` where its API has OpenAI's
    # /embeddings, `score` and `rerank` where it has vLLM's /score.
    tasks: frozenset[str] = GENERATE

    def __post_init__(self) -> None:
        # The reasoning fields it takes are parameters it honours; a row need not list them twice.
        object.__setattr__(self, "params", self.params | self.reasoning.params)


PROVIDERS: tuple[Provider, ...] = (
    # OpenAI's Batch API, Anthropic's Message Batches and Google's batch modes: half price.
    Provider("OPENAI", "OpenAI chat completions API", "https://api.openai.com/v1",
             "OPENAI_API_KEY", dialect=Dialect(max_tokens_field="max_completion_tokens"),
             reasoning=OPENAI_EFFORT, user_field=True, batch_discount=0.5,
             batch_api=BatchApi.OPENAI, tasks=EMBED, prompt_caching="automatic"),
    Provider("ANTHROPIC", "Anthropic Messages API", "https://api.anthropic.com",
             "ANTHROPIC_API_KEY", frozenset({"max_new_tokens", "stop_strings", "guided_decoding",
                                             "reasoning_effort", "max_reasoning_tokens"}),
             engine="lmpress.engines.remote.anthropic:AnthropicEngine", requires=("anthropic",),
             batch_discount=0.5, batch_api=BatchApi.ANTHROPIC, batch_max_requests=100_000,
             batch_max_bytes=256 * 1024 * 1024, prompt_caching="marked", cache_write_share=1.25),
    # A server of one's own may implement OpenAI's Files and Batches endpoints.
    # Servers of open models score prompts (echo with logprobs, vLLM's prompt_logprobs).
    Provider("REMOTE", "any OpenAI-compatible server", params=OPENAI_PARAMS | SCORING_PARAMS,
             key_required=False, model_required=False,
             reasoning=OPENAI_EFFORT, batch_api=BatchApi.OPENAI, tasks=EMBED),
    Provider("REMOTE_VLLM", "a remote vLLM server",
             params=OPENAI_PARAMS | VLLM_PARAMS | SCORING_PARAMS | {"num_beams", "length_penalty"},
             dialect=Dialect(extra_fields=VLLM_PARAMS, structured_outputs=True, beam_search=True),
             reasoning=OPENAI_EFFORT, key_required=False, model_required=False, tasks=POOLING),
    Provider("GEMINI", "Google Gemini (OpenAI-compatible)",
             "https://generativelanguage.googleapis.com/v1beta/openai/", "GEMINI_API_KEY",
             GOOGLE_PARAMS, reasoning=GOOGLE, batch_discount=0.5, batch_api=BatchApi.GEMINI,
             batch_max_bytes=2 * 1024**3, tasks=EMBED,  # its batch input files: up to 2 GB
             prompt_caching="automatic"),
    Provider("GOOGLE_VERTEX", "Google Vertex AI", params=GOOGLE_PARAMS, reasoning=GOOGLE,
             key_required=False, engine="lmpress.engines.remote.vertex:GoogleVertexEngine", extra="vertex",
             requires=("openai", "google.auth"), batch_discount=0.5, prompt_caching="automatic",
             batch_refusal="Vertex AI's batch prediction reads its requests from and writes its "
             "results to a Cloud Storage bucket or a BigQuery table, which lmpress does not "
             "manage; drop --provider-batch to run live, or run the job on --engine GEMINI "
             "(a Gemini API key) for Gemini's batch mode at the same half price"),
    Provider("TOGETHER", "Together AI", "https://api.together.xyz/v1", "TOGETHER_API_KEY",
             OPEN_MODEL_HOST_PARAMS, OPEN_MODEL_HOST, tasks=EMBED),
    Provider("PARASAIL", "Parasail", "https://api.parasail.io/v1", "PARASAIL_API_KEY",
             OPEN_MODEL_HOST_PARAMS, OPEN_MODEL_HOST),
    Provider("DEEPSEEK", "DeepSeek", "https://api.deepseek.com/v1", "DEEPSEEK_API_KEY",
             frozenset({"max_new_tokens", "temperature", "top_p", "presence_penalty",
                        "frequency_penalty", "stop_strings", "logprobs", "top_logprobs"})),
    Provider("OPENROUTER", "OpenRouter", "https://openrouter.ai/api/v1", "OPENROUTER_API_KEY",
             OPENAI_PARAMS | OPEN_MODEL_PARAMS, OPEN_MODEL_HOST),
    Provider("FIREWORKS", "Fireworks AI", "https://api.fireworks.ai/inference/v1",
             "FIREWORKS_API_KEY", OPEN_MODEL_HOST_PARAMS, OPEN_MODEL_HOST, OPENAI_EFFORT,
             tasks=EMBED),
    # SGLang's OpenAI-compatible API: guided_decoding.json goes as response_format.
    # Its sampling takes vLLM's names but has no bad_words.
    Provider("SGLANG", "a running SGLang server (OpenAI-compatible API)",
             params=OPENAI_PARAMS | SGLANG_PARAMS | SCORING_PARAMS,
             dialect=Dialect(extra_fields=SGLANG_PARAMS),
             reasoning=OPENAI_EFFORT, key_required=False, model_required=False, tasks=EMBED,
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

# Live prices in USD per million tokens, (input, output, cached input), for a few well-known
# models of the providers that publish one price list; cached input is input read from the
# provider's prompt cache (engines/remote/prompt_cache.py), and a row without it has no cache
# price (embeddings). Prices change: these were written down on 2026-11-23
# from the prices we knew, checked against third-party copies of the providers' pricing pages
# (dated 2026-03 to 2026-06; the providers' own pages could not be read from where this was
# written). The standard tier for prompts up to 200K tokens; longer prompts cost more on some
# models (Gemini 2.5 Pro, Claude Sonnet). remote_params.input_price_per_million,
# output_price_per_million and cached_input_price_per_million override a row, or price a model
# that has none (batch/pricing.py). Cached input, written down on 2026-11-24 from the same
# kind of copies: OpenAI's varies by generation (gpt-4o and o-series before o3 half the input
# price, gpt-4.1, o3 and o4-mini a quarter, the gpt-5 family a tenth); Anthropic's cache
# reads are a tenth of input (its writes, 1.25x input, are the provider row's
# cache_write_share); Gemini's 2.5 models a tenth, 2.0 Flash a quarter.
# A dated snapshot takes its model's row: gpt-4o-mini-2024-07-18 is gpt-4o-mini.
OPENAI_PRICES: dict[str, tuple[float, ...]] = {
    "gpt-4o": (2.50, 10.00, 1.25),
    "gpt-4o-mini": (0.15, 0.60, 0.075),
    "gpt-4.1": (2.00, 8.00, 0.50),
    "gpt-4.1-mini": (0.40, 1.60, 0.10),
    "gpt-4.1-nano": (0.10, 0.40, 0.025),
    "gpt-5": (1.25, 10.00, 0.125),
    "gpt-5-mini": (0.25, 2.00, 0.025),
    "gpt-5-nano": (0.05, 0.40, 0.005),
    "o3": (2.00, 8.00, 0.50),
    "o4-mini": (1.10, 4.40, 0.275),
    # Embeddings are priced on their input alone.
    "text-embedding-3-small": (0.02, 0.0),
    "text-embedding-3-large": (0.13, 0.0),
    "text-embedding-ada-002": (0.10, 0.0),
}
ANTHROPIC_PRICES: dict[str, tuple[float, ...]] = {
    "claude-opus-4-1": (15.00, 75.00, 1.50),
    "claude-opus-4-5": (5.00, 25.00, 0.50),
    "claude-opus-4-6": (5.00, 25.00, 0.50),
    "claude-sonnet-4": (3.00, 15.00, 0.30),
    "claude-sonnet-4-5": (3.00, 15.00, 0.30),
    "claude-sonnet-4-6": (3.00, 15.00, 0.30),
    "claude-haiku-4-5": (1.00, 5.00, 0.10),
    "claude-3-5-haiku": (0.80, 4.00, 0.08),
}
# Vertex AI lists Gemini at the Gemini API's prices; its model names carry a publisher
# ("google/gemini-2.5-flash"), which the lookup drops.
GEMINI_PRICES: dict[str, tuple[float, ...]] = {
    "gemini-2.5-pro": (1.25, 10.00, 0.125),
    "gemini-2.5-flash": (0.30, 2.50, 0.03),
    "gemini-2.5-flash-lite": (0.10, 0.40, 0.01),
    "gemini-2.0-flash": (0.10, 0.40, 0.025),
}
PRICES: dict[str, dict[str, tuple[float, ...]]] = {
    "OPENAI": OPENAI_PRICES,
    "ANTHROPIC": ANTHROPIC_PRICES,
    "GEMINI": GEMINI_PRICES,
    "GOOGLE_VERTEX": GEMINI_PRICES,
}


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
        "default_tokenizer": provider.tokenizer,
        "key_required": provider.key_required,
        "model_required": provider.model_required,
        "user_field": provider.user_field,
        "dialect": provider.dialect,
        "reasoning": provider.reasoning,
        "tasks": provider.tasks,
        "provider": provider,
        "__doc__": f"{provider.summary}: {base.__name__} with the {provider.name} row.",
        "__module__": base.__module__,
    }
    return type(f"{provider.name.title().replace('_', '')}Engine", (base,), settings)
