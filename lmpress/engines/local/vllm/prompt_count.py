"""How VLLM's prompts are counted without vLLM: the model's tokenizer through transformers,
from local files or the Hugging Face cache (vLLM may not be installed here to ask); the context
is vLLM's max_model_len where it is known."""

from __future__ import annotations

from lmpress.configs.schema import RunConfig
from lmpress.engines.common.checkpoints import context_length, load_model_config, load_tokenizer
from lmpress.engines.common.prompts import HfPrompts
from lmpress.engines.local.reasoning import SwitchedPrompts
from lmpress.engines.prompt_count import PromptCounter, estimate_counter
from lmpress.vocabulary.errors import ModelLoadError


def prompt_counter(config: RunConfig) -> PromptCounter:
    model = config.model
    try:
        tokenizer = load_tokenizer(model, local_only=True)
    except ModelLoadError as exc:
        return estimate_counter(f"the tokenizer is not on this machine: {exc}")
    # vLLM takes no tools (its engine refuses them) and tokenizes as transformers does,
    # unless told to use another tokenizer mode (mistral's own, say).
    prompts = HfPrompts(
        tokenizer,
        "VLLM",
        model.model_name,
        template_kwargs=model.chat_template_kwargs,
        takes_tools=False,
    )
    exact = model.model_kwargs.get("tokenizer_mode", "auto") in ("auto", "hf")
    label = f"{model.tokenizer_name or model.model_name} (transformers, as VLLM)"
    # With each row's reasoning_effort switches, as the engine renders it.
    counted = SwitchedPrompts(prompts, getattr(tokenizer, "chat_template", None), model.model_name)
    return PromptCounter(counted, exact, _context(config), label)


def _context(config: RunConfig) -> int | None:
    model = config.model
    given = model.model_kwargs.get("max_model_len") or model.model_max_length
    if given:
        return int(given)
    try:
        return context_length(load_model_config(model, local_only=True))
    except ModelLoadError:
        return None
