"""The typed config schema. Section and field names follow Oumi's inference config, so an Oumi
inference YAML loads unchanged."""

from __future__ import annotations

import ipaddress
import math
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from lmpress.vocabulary.errors import ConfigError
from lmpress.vocabulary.types import REASONING_EFFORTS, GenerationParams

# What `model.generation_defaults` does with the sampling defaults a checkpoint ships. The field
# stays a `str` (OmegaConf's structured configs take no Literal); RANGE_CHECKS holds it to these.
GenerationDefaults = Literal["ignore", "use"]
GENERATION_DEFAULTS: tuple[GenerationDefaults, ...] = get_args(GenerationDefaults)

# `remote_params.prompt_cache`, a `str` for the same reason, held to these by RANGE_CHECKS.
PromptCacheMode = Literal["auto", "off"]
PROMPT_CACHE_MODES: tuple[PromptCacheMode, ...] = get_args(PromptCacheMode)

# `model.speculative_method`, a `str` for the same reason: "off", "ngram" (prompt lookup), or
# "draft_model" (a smaller model's drafts): engines/local/speculation.py.
SpeculativeMethod = Literal["off", "ngram", "draft_model"]
SPECULATIVE_METHODS: tuple[SpeculativeMethod, ...] = get_args(SpeculativeMethod)


# model.kv_cache_dtype's values; each engine takes those in its `kv_cache_dtypes`.
KV_CACHE_DTYPES = ("auto", "int8", "int4", "fp8")


@dataclass
class ModelParams:
    model_name: str = ""  # a model directory, a .gguf file, a hub id, or a packaged/tiny name
    adapter_model: str | None = None  # a PEFT LoRA directory or hub id (NATIVE, VLLM)
    # LoRA adapters a row or request chooses by name (its `adapter` column, or the `model` of
    # an OpenAI Batch line or server request); a row that names none runs on the base model.
    # PEFT LoRA directories; for LLAMACPP also GGUF LoRA files (engines/adapters.py).
    adapters: dict[str, str] = field(default_factory=dict)
    tokenizer_name: str | None = None  # another tokenizer; remote engines count prompts with it
    tokenizer_pad_token: str | None = None  # the pad token, where the tokenizer has none
    # passed to the tokenizer when it loads
    tokenizer_kwargs: dict[str, Any] = field(default_factory=dict)
    processor_kwargs: dict[str, Any] = field(default_factory=dict)  # a multimodal model's processor
    model_max_length: int | None = None  # the context length; unset: the model's own
    load_pretrained_weights: bool = True  # false: random weights from the model's config
    compile: bool = False  # torch.compile the model (NATIVE)
    chat_template: str | None = None  # a Jinja string, a path to a template file, or "chatml"
    # variables the chat template reads, e.g. enable_thinking
    chat_template_kwargs: dict[str, Any] | None = None
    torch_dtype_str: str = "auto"  # auto: float32 on a CPU, bfloat16 on CUDA (NATIVE, VLLM)
    # The KV cache's precision: auto (the engine's own), int8 (NATIVE's, keys rotated; LLAMACPP's
    # q8_0), int4 (LLAMACPP's q4_0), fp8 (VLLM's); an engine refuses one it cannot hold.
    kv_cache_dtype: str = "auto"
    device_map: str | None = "auto"  # auto: cuda where present, else cpu (NATIVE)
    attn_implementation: str | None = None  # transformers' attention implementation (NATIVE)
    trust_remote_code: bool = False  # run a checkpoint's own modelling code
    model_revision: str | None = None  # a hub revision (branch, tag or commit)
    # the engine's own settings: `lmpress engines NAME`, and below
    model_kwargs: dict[str, Any] = field(default_factory=dict)
    tool_call_parser: str | None = None  # how a local model writes tool calls (tool_parsers.py)
    # How a local model writes its thinking (vocabulary/reasoning.py): vLLM's
    # --reasoning-parser names; unset, the chat template's marks choose, "none" turns it off.
    reasoning_parser: str | None = None
    # Oumi's training-only fields: accepted so a shared config loads, and named in a notice.
    enable_liger_kernel: bool = False
    shard_for_eval: bool = False
    freeze_layers: list[str] = field(default_factory=list)
    # The sampling defaults a checkpoint ships (generation_config.json): "ignore" them, so a
    # recipe means the same on every engine and model, or "use" them for the fields the user
    # did not set, as vLLM's --generation-config auto does.
    generation_defaults: str = "ignore"
    # Speculative decoding (engines/local/speculation.py), named as vLLM's speculative_config:
    # "ngram" drafts up to num_speculative_tokens a step from the row's own prompt and reply,
    # looking up its last prompt_lookup_max..prompt_lookup_min tokens. Greedy text is the same
    # as with "off"; it pays where replies copy their prompts. "draft_model" drafts with
    # draft_model, a smaller model sharing the model's tokenizer (setting draft_model alone
    # chooses it).
    speculative_method: str = "off"
    num_speculative_tokens: int = 4
    prompt_lookup_min: int = 2
    prompt_lookup_max: int = 4
    draft_model: str | None = None


@dataclass
class RemoteParams:
    api_url: str | None = None  # a base URL (http://host:8000/v1) or the full endpoint URL
    api_key: str | None = None  # a literal key (warns); prefer api_key_env_varname
    api_key_env_varname: str | None = None  # the variable holding the key; unset: the engine's own
    user_id: str | None = None  # sent where Oumi sends it: OPENAI's `user`, ANTHROPIC's metadata
    num_workers: int = 32  # requests in flight at most
    max_retries: int = 5  # retries of a 429, 5xx, timeout or dropped connection
    retry_backoff_base: float = 1.0  # seconds: exponential backoff with full jitter, from this
    retry_backoff_max: float = 30.0  # seconds, up to this (also the longest Retry-After honoured)
    connection_timeout: float = 300.0  # seconds without a byte before a request is retried
    politeness_policy: float = 0.0  # seconds a worker rests after each request
    requests_per_minute: int | None = None  # the provider's limits, kept ahead of time when given
    input_tokens_per_minute: int | None = None  # prompts estimated at ~4 characters a token
    output_tokens_per_minute: int | None = None  # max_new_tokens reserved, the unused refunded
    # USD per million tokens, for the dry run's estimate and the budget guardrails: over the
    # provider's price list (engines/remote/presets.py), or a price for any engine (a local
    # one has none otherwise), e.g. GPU hours spread over the tokens they make.
    input_price_per_million: float | None = None
    output_price_per_million: float | None = None
    # Input read from the provider's prompt cache, where it bills that apart (OpenAI, Anthropic,
    # Gemini); None: the price list's, else the input price.
    cached_input_price_per_million: float | None = None
    # Provider prompt caching (engines/remote/prompt_cache.py): "auto" marks a shared prefix
    # (tools, system prompt) for Anthropic to cache once it repeats and is long enough to be
    # cached; "off" never marks. OpenAI and Gemini cache by themselves either way.
    prompt_cache: str = "auto"
    # The provider's batch API (`lmpress batch` only): set (Oumi's field name, "24h") or
    # --provider-batch, and the job's rows go through OpenAI's Batch API, Anthropic's Message
    # Batches or Gemini's batch mode (24h or 48h there) at the batch price instead of live
    # requests (lmpress/batch/provider/).
    batch_completion_window: str | None = None
    # A batch's size limits; None: the provider's (engines/remote/presets.py).
    batch_max_requests: int | None = None
    batch_max_bytes: int | None = None
    batch_poll_max_s: float = 60.0  # polling backs off from 1 s to this
    # A batch not ended this long past its provider's expiry time is reported as stuck.
    batch_stuck_margin_s: float = 3600.0
    # Oumi's adaptive concurrency: on, a 429 halves the requests in flight and successes grow
    # them back; off, num_workers stay in flight (the Retry-After cooldown still holds).
    use_adaptive_concurrency: bool = True


@dataclass
class ServedModel:
    """One of several models behind `lmpress serve` (`serve.models`, or `--model NAME=RECIPE`):
    the name clients send, the recipe (a bundled name or a path, as `-c` takes) and overrides
    of its keys (`{"generation.max_new_tokens": 64}`)."""

    name: str = ""
    recipe: str = ""
    overrides: dict[str, Any] = field(default_factory=dict)


@dataclass
class ServeParams:
    """`lmpress serve`: where it listens and what it refuses. The API key is never config: it
    comes from --api-key or LMPRESS_API_KEY, so `config show` cannot print it."""

    host: str = "127.0.0.1"  # also --host
    port: int = 8000  # also --port; 0 picks a free port
    served_model_name: str | None = None  # the model id clients send; default model.model_name
    max_body_bytes: int = 4 * 1024 * 1024  # a larger body gets 413
    queue_limit: int = 256  # sequences held at once (generating or waiting); more get 503
    # What one request may ask for (serve/limits.py); over a cap is a 400 naming it. n as
    # OpenAI caps it; n x max_tokens (x prompts) in tokens; a prompt's UTF-8 bytes, checked
    # before tokenizing (1 MiB is ~250k tokens of English, past most models' context).
    max_n: int = 128
    max_new_tokens_per_request: int = 1024 * 1024
    max_prompts_per_request: int = 256  # /v1/completions prompts, pooling inputs
    max_prompt_bytes: int = 1024 * 1024
    log_content: bool = False  # log each request's messages and reply
    # Where /v1/files and /v1/batches keep files and batches across restarts; None: no Batch API.
    state_dir: str | None = None
    # The response cache (lmpress/cache/): off by default for a server, whose clients may ask
    # for fresh replies; on, all or refresh as `lmpress batch --cache` takes them.
    cache: str = "off"
    cache_dir: str | None = None  # None: $LMPRESS_RESPONSE_CACHE or lmpress's cache directory
    # Images a client names (serve/media.py): the server fetches an http(s) URL itself, only
    # from these hosts (exact names; empty: any public address), never from a loopback,
    # private, link-local or otherwise non-public address unless allow_private_media is set
    # (a trusted network) or the host is named here.
    allowed_media_domains: list[str] = field(default_factory=list)
    allow_private_media: bool = False
    media_fetch_timeout_s: float = 10.0  # connecting, every redirect and the whole body
    max_media_fetches: int = 16  # fetches in flight at once, all requests together
    max_image_bytes: int = 20 * 2**20  # OpenAI's limit per image too
    # Checked from the image's header, before it is decoded: 4096 x 4096, a 16 MP photo.
    max_image_pixels: int = 4096 * 4096
    max_images_per_request: int = 8
    # Several models behind one server (serve/router.py), each {name, recipe, overrides}
    # (docs/many-models.md): each loads on first use; past max_loaded_models (None: no limit)
    # the least recently used idle one is unloaded.
    models: list[ServedModel] = field(default_factory=list)
    max_loaded_models: int | None = None
    # /v1/load_lora_adapter and /v1/unload_lora_adapter read a path a client names from the
    # server's disk, so they are off unless this (or --allow-runtime-lora) turns them on.
    allow_runtime_lora: bool = False


@dataclass
class RayParams:
    """`lmpress batch --ray`: the cluster, and how the job is spread over it."""

    address: str | None = None  # a running cluster (else RAY_ADDRESS); none: start a local Ray
    replicas: int = 1  # engine replicas, one Ray actor each
    cpus_per_replica: float = 1.0  # CPUs Ray reserves for each replica
    gpus_per_replica: float = 0.0  # VLLM: tensor x pipeline parallel size; NATIVE on CUDA: 1
    batch_size: int = 32  # rows sent to a replica in one call
    calls_per_replica: int = 4  # calls in flight at a replica: the engine sees up to 4 x 32 rows
    # Once a replica has run, how long the job waits with none running (Ray restarting one
    # that died, or unable to) before it ends, leaving the rows not done to the next run.
    restart_timeout_s: float = 600.0


@dataclass
class RunConfig:
    name: str | None = None  # a label, as Oumi configs carry one
    engine: str = "NATIVE"  # NATIVE, LLAMACPP, VLLM or a remote engine (`lmpress engines`)
    # What the run does: generate text; embed, score, rerank, classify or reward
    # (vocabulary/embeddings.py);
    # or score given text by its log-likelihood or perplexity (vocabulary/likelihood.py).
    task: str = "generate"
    model: ModelParams = field(default_factory=ModelParams)
    generation: GenerationParams = field(default_factory=GenerationParams)
    remote_params: RemoteParams = field(default_factory=RemoteParams)
    serve: ServeParams = field(default_factory=ServeParams)
    ray: RayParams = field(default_factory=RayParams)
    input_path: str | None = None  # `lmpress batch` without -i reads this file
    output_path: str | None = None  # `lmpress batch` without -o writes this file
    progress_path: str | None = None  # accepted for Oumi configs; lmpress resumes from output

    def task_chosen(self) -> bool:
        """Whether a recipe or `--task` chose the task. False: it is `generate` by default,
        which a batch run replaces by the task its model is made for (`batch.tasks`)."""
        return getattr(self, "_task_chosen", True)

    def mark_task_chosen(self, chosen: bool) -> RunConfig:
        self._task_chosen = chosen
        return self


# Oumi fields that only training reads: a config that sets one loads, with one notice line
# naming them, since a user sharing one YAML between training and inference expects that.
TRAINING_ONLY = ("model.enable_liger_kernel", "model.shard_for_eval", "model.freeze_layers")

# Oumi's other engine names for lmpress engines (Oumi's enum member name and value differ).
ENGINE_ALIASES = {"GOOGLE_GEMINI": "GEMINI"}


# The largest seed every engine takes: torch's generators and vLLM read a seed as a signed
# 64-bit integer (a row's n samples use seed + index, which still fits in torch's unsigned 64).
MAX_SEED = 2**63 - 1


def speculative_method(model: ModelParams) -> str:
    """The speculative decoding a model asks for: its `speculative_method`, or draft_model
    where only `draft_model` is set (as vLLM infers it from a draft model's name)."""
    method = model.speculative_method
    if model.draft_model and method == "off":
        return "draft_model"
    if model.draft_model and method != "draft_model":
        raise ConfigError(
            f"model.draft_model: set, but model.speculative_method is {method}; "
            "set speculative_method: draft_model, or remove draft_model"
        )
    if method == "draft_model" and not model.draft_model:
        raise ConfigError(
            "model.speculative_method: draft_model needs model.draft_model, a smaller model "
            "sharing the model's tokenizer"
        )
    return method


def _bare_host(host: str) -> bool:
    """A host name or an IP address (an IPv6 one may be in brackets), nothing more."""
    host = host.strip().strip("[]")
    if not host or set("/@ ") & set(host):
        return False
    if ":" in host:  # an IPv6 address, or a port
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            return False
    return True


def _finite(v: float) -> bool:
    return not (math.isinf(v) or math.isnan(v))


# Impossible values, checked after loading and on every row's and request's own settings:
# dotted key -> (predicate, what is allowed). NaN fails every comparison, so a bounded check
# refuses it; an open-ended one says `_finite` too, or inf would pass.
RANGE_CHECKS: dict[str, tuple[Any, str]] = {
    "model.generation_defaults": (lambda v: v in GENERATION_DEFAULTS, "must be ignore or use"),
    "model.speculative_method": (
        lambda v: v in SPECULATIVE_METHODS,
        f"must be {' or '.join(SPECULATIVE_METHODS)}",
    ),
    "model.num_speculative_tokens": (lambda v: 1 <= v <= 32, "must be in [1, 32]"),
    "model.prompt_lookup_min": (lambda v: v >= 1, "must be at least 1"),
    "model.prompt_lookup_max": (lambda v: 1 <= v <= 16, "must be in [1, 16]"),
    # 0 generates nothing: a request that only scores its prompt (generation.prompt_logprobs).
    "generation.max_new_tokens": (lambda v: v >= 0, "must be 0 or more"),
    "generation.temperature": (
        lambda v: v >= 0 and _finite(v),
        "must be 0 (greedy) or more, and finite",
    ),
    "generation.top_p": (lambda v: 0 < v <= 1, "must be in (0, 1]"),
    "generation.top_k": (lambda v: v is None or v >= 1, "must be at least 1, or null for no limit"),
    "generation.prompt_logprobs": (
        lambda v: v is None or 0 <= v <= 20,
        "must be in [0, 20], or null for none",
    ),
    "generation.min_p": (lambda v: 0 <= v <= 1, "must be in [0, 1]"),
    "generation.repetition_penalty": (
        lambda v: v > 0 and _finite(v),
        "must be a finite number greater than 0",
    ),
    "generation.presence_penalty": (lambda v: -2 <= v <= 2, "must be in [-2, 2]"),
    "generation.frequency_penalty": (lambda v: -2 <= v <= 2, "must be in [-2, 2]"),
    "generation.min_tokens": (lambda v: v >= 0, "must be 0 or more"),
    "generation.seed": (
        lambda v: v is None or 0 <= v <= MAX_SEED,
        f"must be in [0, {MAX_SEED}] (2**63 - 1), or null for a random seed",
    ),
    "generation.stop_strings": (
        lambda v: all(v),
        "holds an empty stop string, which would stop at once; remove it",
    ),
    "generation.bad_words": (
        lambda v: all(w.strip() for w in v),
        "holds an empty word, which bans nothing; remove it",
    ),
    "generation.stop_token_ids": (
        lambda v: all(t >= 0 for t in v),
        "must be token ids (0 or more)",
    ),
    "generation.logit_bias": (
        lambda v: all(-100 <= b <= 100 for b in v.values()),
        "values must be in [-100, 100], as in OpenAI's API",
    ),
    "generation.n": (lambda v: v >= 1, "must be at least 1"),
    "model.kv_cache_dtype": (
        lambda v: v in KV_CACHE_DTYPES,
        f"must be one of {', '.join(KV_CACHE_DTYPES)}",
    ),
    "generation.reasoning_effort": (
        lambda v: v is None or v in REASONING_EFFORTS,
        f"must be one of {', '.join(REASONING_EFFORTS)}, or null for the model's own",
    ),
    "generation.max_reasoning_tokens": (
        lambda v: v is None or v >= 0,
        "must be 0 or more, or null for no limit of its own",
    ),
    "generation.top_logprobs": (lambda v: 0 <= v <= 20, "must be in [0, 20]"),
    "generation.num_beams": (lambda v: v >= 1, "must be at least 1"),
    # A beam's length to this power divides its score: beyond these it overflows a float.
    "generation.length_penalty": (lambda v: -10 <= v <= 10, "must be between -10 and 10"),
    "generation.early_stopping": (
        lambda v: v in (True, False, "never"),
        'must be true, false or "never"',
    ),
    "generation.batch_size": (lambda v: v >= 1, "must be at least 1"),
    "remote_params.num_workers": (lambda v: v >= 1, "must be at least 1"),
    "remote_params.max_retries": (lambda v: v >= 0, "must be 0 or more"),
    "remote_params.retry_backoff_base": (lambda v: v >= 0, "must be 0 or more"),
    "remote_params.retry_backoff_max": (lambda v: v >= 0, "must be 0 or more"),
    "remote_params.connection_timeout": (lambda v: v > 0, "must be greater than 0"),
    "remote_params.politeness_policy": (lambda v: v >= 0, "must be 0 or more"),
    "remote_params.requests_per_minute": (lambda v: v is None or v >= 1, "must be at least 1"),
    "remote_params.input_tokens_per_minute": (lambda v: v is None or v >= 1, "must be at least 1"),
    "remote_params.output_tokens_per_minute": (lambda v: v is None or v >= 1, "must be at least 1"),
    "remote_params.input_price_per_million": (
        lambda v: v is None or (v >= 0 and _finite(v)),
        "must be 0 or more (USD per million tokens), or null for the price list's",
    ),
    "remote_params.output_price_per_million": (
        lambda v: v is None or (v >= 0 and _finite(v)),
        "must be 0 or more (USD per million tokens), or null for the price list's",
    ),
    "remote_params.cached_input_price_per_million": (
        lambda v: v is None or (v >= 0 and _finite(v)),
        "must be 0 or more (USD per million tokens), or null for the price list's",
    ),
    "remote_params.prompt_cache": (
        lambda v: v in PROMPT_CACHE_MODES,
        f"must be {' or '.join(PROMPT_CACHE_MODES)}",
    ),
    "serve.port": (lambda v: 0 <= v <= 65535, "must be in [0, 65535] (0 picks a free port)"),
    "serve.max_body_bytes": (lambda v: v >= 1, "must be at least 1"),
    "serve.queue_limit": (lambda v: v >= 1, "must be at least 1"),
    "serve.max_n": (lambda v: v >= 1, "must be at least 1"),
    "serve.max_loaded_models": (
        lambda v: v is None or v >= 1,
        "must be at least 1, or null for no limit",
    ),
    "serve.max_new_tokens_per_request": (lambda v: v >= 1, "must be at least 1"),
    "serve.max_prompts_per_request": (lambda v: v >= 1, "must be at least 1"),
    "serve.max_prompt_bytes": (lambda v: v >= 1, "must be at least 1"),
    "serve.allowed_media_domains": (
        lambda v: all(_bare_host(h) for h in v),
        "must be host names (cdn.example.com), without a scheme, port or path",
    ),
    "serve.media_fetch_timeout_s": (lambda v: v > 0, "must be greater than 0"),
    "serve.max_media_fetches": (lambda v: v >= 1, "must be at least 1"),
    "serve.max_image_bytes": (lambda v: v >= 1, "must be at least 1"),
    "serve.max_image_pixels": (lambda v: v >= 1, "must be at least 1"),
    "serve.max_images_per_request": (lambda v: v >= 0, "must be 0 or more (0: no images)"),
    "serve.cache": (
        lambda v: v in ("on", "all", "refresh", "off"),
        "must be on, all, refresh or off",
    ),
    "ray.replicas": (lambda v: v >= 1, "must be at least 1"),
    "ray.cpus_per_replica": (lambda v: v >= 0, "must be 0 or more"),
    "ray.gpus_per_replica": (lambda v: v >= 0, "must be 0 or more"),
    "ray.batch_size": (lambda v: v >= 1, "must be at least 1"),
    "ray.calls_per_replica": (lambda v: v >= 1, "must be at least 1"),
    "ray.restart_timeout_s": (lambda v: v > 0, "must be more than 0"),
}


def check_range(section_value: Any, dotted: str, source: str | None = None) -> None:
    """Refuse a value outside its field's range, naming the dotted key (and where the value
    came from, unless that is the section itself)."""
    check = RANGE_CHECKS.get(dotted)
    if check is None:
        return
    ok, allowed = check
    section, name = dotted.split(".")
    value = getattr(section_value, name)
    if not ok(value):
        where = f"{source}: " if source and source != section else ""
        shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
        raise ConfigError(f"{where}{dotted}: {shown} {allowed}")
