"""How NATIVE's prompts are counted without its weights: its tokenizer (`load_tokenizer`) and
`HfPrompts`, as the engine builds them (with a vision-language model's processor, which expands
each image into its tokens: the images are read to count them); the context from the model's
config (`model.model_max_length` caps it)."""

from __future__ import annotations

from lmpress.configs.schema import RunConfig
from lmpress.engines.common.checkpoints import context_length, load_model_config, load_tokenizer
from lmpress.engines.common.tool_parsers import check_parser
from lmpress.engines.local.native.loading import load_processor, native_prompts
from lmpress.engines.local.reasoning import SwitchedPrompts
from lmpress.engines.prompt_count import PromptCounter


def prompt_counter(config: RunConfig) -> PromptCounter:
    model = config.model
    tokenizer = load_tokenizer(model)
    model_config = load_model_config(model)
    processor = load_processor(model, model_config, tokenizer)  # a vision-language model's
    prompts = native_prompts(config, tokenizer, check_parser(model.tool_call_parser), processor)
    context = context_length(model_config, model.model_max_length)
    label = f"{model.tokenizer_name or model.model_name} (transformers, as NATIVE)"
    counted = SwitchedPrompts(prompts, getattr(tokenizer, "chat_template", None), model.model_name)
    return PromptCounter(counted, True, context, label)
