"""How LLAMACPP's prompts are counted without its weights: the GGUF file opened with
`vocab_only` and `GgufPrompts`; the context is the one the engine will make
(`model_kwargs.n_ctx`: a sequence's equal part of it, or all of it with `kv_unified`)."""

from __future__ import annotations

from lmpress.configs.schema import RunConfig
from lmpress.engines.common.tool_parsers import check_parser
from lmpress.engines.local.llamacpp.loading import (
    Vocab,
    chat_template,
    gguf_path,
    load_vocab,
    oumi_gguf_file,
    parallel_sequences,
    planned_context,
    trained_context,
)
from lmpress.engines.local.llamacpp.prompts import GgufPrompts
from lmpress.engines.local.reasoning import SwitchedPrompts
from lmpress.engines.prompt_count import PromptCounter


def prompt_counter(config: RunConfig) -> PromptCounter:
    model = config.model
    path = gguf_path(oumi_gguf_file(model) or model.model_name)
    vocab_model = load_vocab(path)
    metadata = vocab_model.metadata()
    parser = check_parser(model.tool_call_parser)
    template = chat_template(config, metadata)
    prompts = GgufPrompts(
        vocab_model, Vocab(vocab_model), template, model.model_name, parser,
        template_kwargs=model.chat_template_kwargs,
    )  # fmt: skip
    shared = model.model_kwargs.get("kv_unified") and not model.speculative_method
    split = 1 if shared else parallel_sequences(config.generation.batch_size)
    context = planned_context(
        int(model.model_kwargs.get("n_ctx") or 0), trained_context(metadata), split
    )
    label = f"{model.model_name} (the GGUF file's vocabulary, as LLAMACPP)"
    counted = SwitchedPrompts(prompts, template, model.model_name)
    return PromptCounter(counted, True, context, label)
