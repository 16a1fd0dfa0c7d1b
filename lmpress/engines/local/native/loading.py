"""Loading for NATIVE: the device and dtype, the model's weights (from where
`common/checkpoints.py` says transformers loads the checkpoint, which also gives the tokenizer,
config and context), its processor for images, and what the engine reads from them: the
checkpoint's generation defaults, its end-of-sequence ids, and the KV cache's batching budget.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
from typing import Any

from lmpress.configs.schema import GenerationDefaults, ModelParams, RunConfig
from lmpress.engines.common.checkpoints import load_model_config, model_source
from lmpress.engines.common.models import DTYPE_CHOICES, auto_dtype, dtype_name
from lmpress.engines.common.prompts import HfPrompts
from lmpress.engines.local.native.options import NativeOptions, from_pretrained_kwargs
from lmpress.vocabulary.errors import ConfigError, ModelLoadError, first_line


def switch(model: ModelParams, name: str) -> bool:
    """The on/off `model.model_kwargs` setting `name` that NATIVE reads itself (options.py)."""
    return getattr(NativeOptions.of(model.model_kwargs), name)


def batching_settings(model: ModelParams, model_config: Any, dtype: Any) -> tuple[int | None, bool]:
    """`model_kwargs.kv_cache_gb` as the tokens the KV cache may hold (None: no budget, only
    generation.batch_size bounds it), and `model_kwargs.prefix_reuse` (default true)."""
    options = NativeOptions.of(model.model_kwargs)
    budget, reuse = options.kv_cache_gb, options.prefix_reuse
    if budget is None:
        return None, reuse
    per_token = kv_bytes_per_token(model_config, dtype, int8=model.kv_cache_dtype == "int8")
    return int(budget * 2**30 // per_token), reuse


def kv_bytes_per_token(model_config: Any, dtype: Any, int8: bool = False) -> int:
    """What one token of one row takes in the KV cache: keys and values in every layer. With
    `int8` (model.kv_cache_dtype), a byte an element and a scale in `dtype` a head, and one
    layer's keys and values in `dtype` besides, the buffers attention reads them from
    (int8_slots.py)."""
    text = model_config.get_text_config()
    heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    if not int8:
        return 2 * text.num_hidden_layers * kv_heads * head_dim * dtype.itemsize
    read = 2 * kv_heads * head_dim * dtype.itemsize
    return 2 * text.num_hidden_layers * kv_heads * (head_dim + dtype.itemsize) + read


def pick_device_and_dtype(model: ModelParams, torch: Any) -> tuple[str, Any]:
    device = model.device_map
    if device in (None, "auto"):
        device = "cuda" if torch.cuda.is_available() else "cpu"
    name = model.torch_dtype_str
    if name == "auto":
        cuda = device.startswith("cuda")
        bf16 = cuda and torch.cuda.is_bf16_supported()
        return device, getattr(torch, auto_dtype(cuda=cuda, bf16_supported=bf16))
    dtype = getattr(torch, dtype_name(name), None)
    if not isinstance(dtype, torch.dtype):
        raise ModelLoadError(f"model.torch_dtype_str: unknown dtype '{name}' (use {DTYPE_CHOICES})")
    return device, dtype


def native_prompts(
    config: RunConfig, tokenizer: Any, parser: str | None, processor: Any = None
) -> HfPrompts:
    """How NATIVE turns a request into prompt ids (and, with a vision-language model's
    processor, image inputs), for the engine and for the dry run's count alike
    (load_tokenizer has put model.chat_template on the tokenizer)."""
    return HfPrompts(
        tokenizer,
        "NATIVE",
        config.model.model_name,
        parser=parser,
        template_kwargs=config.model.chat_template_kwargs,
        processor=processor,
    )


def reads_images(model_config: Any) -> bool:
    """Whether the model is a vision-language model: its config has a vision tower's."""
    return getattr(model_config, "vision_config", None) is not None


def model_class(model_config: Any) -> Any:
    """The Auto class that loads the model: image-text-to-text for a vision-language model
    (LLaVA, Idefics3, Qwen2-VL, ...), else causal LM."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    return AutoModelForImageTextToText if reads_images(model_config) else AutoModelForCausalLM


def load_processor(model: ModelParams, model_config: Any, tokenizer: Any) -> Any:
    """A vision-language model's processor (AutoProcessor: its image processor and the chat
    template that places image tokens), sharing the engine's tokenizer so that the recipe's
    chat template and pad token hold for image rows too; None for a text model. With no
    torchvision installed, transformers picks its Pillow image processors."""
    if not reads_images(model_config):
        return None
    from transformers import AutoProcessor

    name, _ = model_source(model)
    try:
        processor = AutoProcessor.from_pretrained(
            name, trust_remote_code=model.trust_remote_code, revision=model.model_revision
        )
    except Exception as exc:
        raise ModelLoadError(
            f"cannot load the image processor of '{name}': {first_line(exc)}"
        ) from exc
    # The recipe's template (load_tokenizer put it on the tokenizer), else the processor's,
    # which is the one that places the image tokens.
    if not model.chat_template and getattr(processor, "chat_template", None):
        tokenizer.chat_template = processor.chat_template
    processor.tokenizer = tokenizer
    return processor


def load_model(
    model: ModelParams, device: str, dtype: Any, model_config: Any = None, auto: Any = None
) -> Any:
    """The model's weights, on `device` in eval mode, through `auto` (an Auto class; by
    default the one `model_class` picks for generation)."""
    model_config = model_config or load_model_config(model)
    # Checked against what from_pretrained takes before model_source makes any copy.
    kwargs = from_pretrained_kwargs(model.model_kwargs, model_config)
    name, gguf_file = model_source(model, make_copy=model.load_pretrained_weights)
    if gguf_file:
        kwargs["gguf_file"] = gguf_file
    if model.attn_implementation:
        kwargs["attn_implementation"] = model.attn_implementation
    # transformers draws a progress bar while it dequantizes GGUF tensors, with no switch.
    quiet = contextlib.redirect_stderr(io.StringIO()) if gguf_file else contextlib.nullcontext()
    auto = auto or model_class(model_config)
    try:
        with quiet:
            if model.load_pretrained_weights:
                loaded = auto.from_pretrained(
                    name,
                    dtype=dtype,
                    trust_remote_code=model.trust_remote_code,
                    revision=model.model_revision,
                    **kwargs,
                )
            else:
                loaded = _random_model(model, name, dtype, kwargs, auto)
    except Exception as exc:
        raise ModelLoadError(f"cannot load model '{model.model_name}': {first_line(exc)}") from exc
    if model.adapter_model:
        try:
            from peft import PeftModel
        except ImportError as exc:
            raise ModelLoadError("model.adapter_model needs peft: pip install peft") from exc
        loaded = PeftModel.from_pretrained(loaded, model.adapter_model)
    return loaded.to(device).eval()


def load_draft_model(model: ModelParams, target: Any, device: str, dtype: Any) -> Any:
    """`model.draft_model`, loaded as the model is (its weights packed the same way), after
    checking that it shares the model's vocabulary: a draft is a list of token ids, which
    mean the same to both only if their tokenizers do."""
    from lmpress.engines.local.native.packing import pack_linears
    from lmpress.engines.local.native.row_attention import use_row_attention

    params = dataclasses.replace(
        model,
        model_name=model.draft_model,
        tokenizer_name=None,
        adapter_model=None,
        model_revision=None,
        draft_model=None,
        speculative_method="off",
    )
    try:
        draft = load_model(params, device, dtype)
    except ModelLoadError as exc:
        raise ModelLoadError(f"model.draft_model: {exc}") from exc
    ours = target.config.get_text_config().vocab_size
    theirs = draft.config.get_text_config().vocab_size
    if theirs != ours:
        raise ConfigError(
            f"model.draft_model: '{model.draft_model}' has a vocabulary of {theirs} tokens and "
            f"'{model.model_name}' one of {ours}; a draft model must share the model's "
            "tokenizer (a smaller model of the same family)"
        )
    use_row_attention(draft)
    if switch(model, "pack_weights"):
        pack_linears(draft)
    return draft


def compiled_decode(model: Any) -> Any:
    """`model.compile`: the model's forward under `torch.compile`, for the decoding steps only
    (a prompt's prefill stays eager: its shapes differ every time, and its matmuls are large
    enough to gain little). Every size is symbolic (the rows, the tokens a row carries, the
    cache's slots and columns) and two sizes that happen to be equal stay two symbols, so one
    graph serves every step of several rows rather than one a shape (torch compiles a size of
    1 apart: the scheduler steps a lone row eagerly). Freezing lets inductor treat the weights
    as constants and prepack them for its CPU matmul kernels."""
    import torch
    from torch.fx.experimental import _config as shapes

    compiled = torch.compile(model.forward, dynamic=True, options={"freezing": True})

    def decode(**kwargs: Any) -> Any:
        # Read when a step compiles, which may be any step whose guards fail.
        with shapes.patch(use_duck_shape=False):
            return compiled(**kwargs)

    return decode


def _random_model(
    model: ModelParams, name: str, dtype: Any, kwargs: dict[str, Any], auto: Any
) -> Any:
    """`model.load_pretrained_weights: false`: the architecture from the model's config, with
    freshly initialised weights (no weight file is read), as Oumi does; handy to benchmark."""
    from transformers import AutoConfig

    gguf = {"gguf_file": kwargs.pop("gguf_file")} if "gguf_file" in kwargs else {}
    config = AutoConfig.from_pretrained(
        name, trust_remote_code=model.trust_remote_code, revision=model.model_revision, **gguf
    )
    return auto.from_config(
        config, trust_remote_code=model.trust_remote_code, dtype=dtype, **kwargs
    )


# The checkpoint's generation_config.json fields that lmpress has fields for. The sampling
# ones count only where the checkpoint samples (do_sample), as transformers reads them.
DEFAULTS_ALWAYS = ("max_new_tokens", "repetition_penalty")
DEFAULTS_WHEN_SAMPLING = ("temperature", "top_p", "top_k", "min_p")


def checkpoint_defaults(model: Any, policy: GenerationDefaults) -> dict[str, Any]:
    """What `model.generation_defaults` takes from the checkpoint's generation config.

    "ignore" leaves it only its token ids (EOS still ends a reply), since transformers fills
    every field lmpress leaves unset from it: a shipped repetition_penalty or
    no_repeat_ngram_size would otherwise change even greedy decoding. "use" keeps it, so
    `checkpoint_processors` applies the fields lmpress has no name for, and returns the ones
    lmpress has, to fill each request's unset fields.
    """
    from transformers import GenerationConfig

    shipped = model.generation_config
    if policy != "use":
        ids = ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id")
        model.generation_config = GenerationConfig(**{k: getattr(shipped, k, None) for k in ids})
        return {}
    given = {k: v for k, v in shipped.to_diff_dict().items() if v is not None}
    names = DEFAULTS_ALWAYS + (DEFAULTS_WHEN_SAMPLING if given.get("do_sample") else ())
    defaults = {k: given[k] for k in names if k in given}
    if given.get("do_sample"):
        defaults.setdefault("temperature", 1.0)
    return defaults


def checkpoint_processors(model: Any, policy: GenerationDefaults, device: str) -> Any:
    """With "use": the logits processors transformers' generate would build from the
    checkpoint's fields that lmpress has no name for (no_repeat_ngram_size, bad_words_ids,
    suppress_tokens, ...), for NATIVE to apply to each row as generate would; else None."""
    if policy != "use":
        return None
    import copy

    config = copy.deepcopy(model.generation_config)
    # lmpress's own fields: each row applies the request's value (filled from the checkpoint).
    config.do_sample, config.repetition_penalty = False, 1.0
    config.temperature = config.top_p = config.top_k = config.min_p = None
    processors = model._get_logits_processor(generation_config=config, device=device)
    return processors or None


def eos_ids(model: Any, tokenizer: Any) -> set[int]:
    ids = model.generation_config.eos_token_id
    found = set(ids if isinstance(ids, list) else [ids] if ids is not None else [])
    if tokenizer.eos_token_id is not None:
        found.add(tokenizer.eos_token_id)
    return found
