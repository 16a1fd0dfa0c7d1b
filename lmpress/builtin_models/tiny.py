"""Tiny real models built offline and deterministically, for tests, the demo and benchmarks.

Nothing is downloaded: the tokenizer is trained here on generated text and the weights are
random with a fixed seed. Each model is saved as an ordinary Hugging Face model directory, so
lmpress loads it through the same code as any real model.

    python -m lmpress.builtin_models.tiny llama            # prints the cached model's directory
    python -m lmpress.builtin_models.tiny smollm2-135m-shape

In a recipe or override, `model.model_name: tiny:llama` names one.
"""

from __future__ import annotations

import os
import random
import shutil
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmpress.vocabulary.chat_templates import CHATML_TEMPLATE

# Bump when a builder changes, so cached models are rebuilt.
BUILDER_VERSION = 3

WORDS = (
    "the a one every small large quick slow red blue green bright dark happy quiet loud cat dog "
    "bird fish tree river mountain city house road sky sun moon star cloud rain wind model data "
    "file line token batch engine answer question reply why how what when where who is are was "
    "were runs jumps flies swims grows shines falls reads writes thinks says sees makes takes "
    "over under near far into from with without and or but because so then today tomorrow "
    "yesterday always never sometimes very really quite blue café naïve über 東京 ☀"
).split()

# Llama-2 style: the system prompt folds into the first user turn. The template emits BOS
# itself, as llama-cpp-python's Jinja2ChatFormatter expects (it tokenizes the rendered prompt
# without adding BOS).
INST_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'system' %}<<SYS>>{{ message['content'] }}<</SYS>> "
    "{% elif message['role'] == 'user' %}[INST] {{ message['content'] }} [/INST]"
    "{% else %} {{ message['content'] }}{{ eos_token }}{% endif %}{% endfor %}"
)

# ChatML whose content may be a list of parts, images first where they were given: what a
# vision-language processor's template looks like. The processor expands each <image> into
# the image's tokens.
IMAGE_TOKEN = "<image>"
VLM_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}<image>\n"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
VISION = {"image_size": 32, "patch_size": 8, "hidden": 32}

# A reasoning model's template, in the form of Qwen3's, SmolLM3's and the DeepSeek-R1
# distills': ChatML, earlier turns' thinking dropped, and the assistant's turn opened inside a
# `<think>` block, which the model closes with `</think>` before its answer. With
# `enable_thinking: false` the template writes an empty block itself, so the model answers
# straight away (Qwen3's switch).
THINK_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% set content = message['content'] %}"
    "{% if message['role'] == 'assistant' and '</think>' in content %}"
    "{% set content = content.split('</think>')[-1].lstrip('\n') %}{% endif %}"
    "{{ content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{% else %}<think>\n{% endif %}{% endif %}"
)
THINK_TOKENS = ["<think>", "</think>"]


@dataclass(frozen=True)
class TinySpec:
    name: str
    # "llama" | "gpt2" | "llava" (a llama text model that reads images) | "cross-encoder" (BERT
    # with a one-label classifier head: a reranker's shape) | "classifier" (BERT with a head of
    # CLASSES) | "reward" (llama with a one-value head on its last token: a reward model's shape)
    architecture: str
    # "bpe" (byte-level BPE, GPT-2 family) | "unigram" (SentencePiece family) | "wordpiece"
    # (BERT's: [CLS] a [SEP] b [SEP], with segment ids)
    tokenizer: str
    vocab_size: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    context: int = 512
    # Wider than the usual 0.02 so that a random model's greedy reply depends on its prompt.
    init_std: float = 0.25
    # A reasoning model: `<think>` and `</think>` are tokens of their own (added, not special,
    # so they stay in the decoded text, as Qwen3's do) and the chat template is THINK_TEMPLATE.
    thinks: bool = False


SPECS = {
    spec.name: spec
    for spec in (
        TinySpec("llama", "llama", "bpe", 512, 64, 2, 4, 2, 128),
        # LLaVA-style: a CLIP vision tower (32x32 images, 8x8 patches: 16 image tokens each)
        # and a projector before the llama text model; an image processor that needs Pillow only.
        TinySpec("llava", "llava", "bpe", 512, 64, 2, 4, 2, 128),
        TinySpec("gpt2", "gpt2", "unigram", 400, 64, 2, 4, 4, 256),
        # llama with 32-wide attention heads: vLLM's CPU attention takes head sizes of 32 and
        # up, and the models above have 16.
        TinySpec("llama-head32", "llama", "bpe", 512, 64, 2, 2, 1, 128),
        # SmolLM2-135M's shape with random weights, for throughput benchmarks.
        TinySpec("smollm2-135m-shape", "llama", "bpe", 49152, 576, 30, 9, 3, 1536, 8192, 0.02),
        # Scores (query, document) pairs as its logit, for score and rerank.
        TinySpec("cross-encoder", "cross-encoder", "wordpiece", 512, 64, 2, 4, 4, 128),
        # The same with 32-wide heads, which vLLM's CPU attention takes (not 16).
        TinySpec("cross-encoder-head32", "cross-encoder", "wordpiece", 512, 64, 2, 2, 2, 128),
        # A reasoning model's tokens and template (THINK_TEMPLATE), 32-wide heads for vLLM.
        TinySpec("think", "llama", "bpe", 512, 64, 2, 2, 1, 128, thinks=True),
        # Sorts a text into CLASSES, for classify; 32-wide heads for vLLM.
        TinySpec("classifier", "classifier", "wordpiece", 512, 64, 2, 2, 2, 128),
        # A reward model's shape (a decoder's last token through a one-value head), for reward;
        # 32-wide heads for vLLM.
        TinySpec("reward", "reward", "bpe", 512, 64, 2, 2, 1, 128),
    )
}
# The labels of the tiny classifier, in label-id order.
CLASSES = ("negative", "neutral", "positive")


TINY_PREFIX = "tiny:"


def resolve_model_name(name: str) -> str:
    """`tiny:NAME` names a bundled tiny model (built on first use); anything else is as given."""
    if name.startswith(TINY_PREFIX):
        tiny = name[len(TINY_PREFIX) :]
        if tiny not in SPECS:
            from lmpress.vocabulary.errors import ModelLoadError

            raise ModelLoadError(
                f"model.model_name: unknown tiny model '{tiny}' (choose from {', '.join(SPECS)})"
            )
        return str(tiny_model(tiny))
    return name


def cache_root() -> Path:
    return Path(os.environ.get("LMPRESS_CACHE", Path.home() / ".cache" / "lmpress"))


def tiny_model(name: str = "llama", cache_dir: Path | None = None) -> Path:
    """The directory of a tiny model, built on first use and cached."""
    spec = SPECS[name]
    root = (cache_dir or cache_root()) / "tiny-models"
    target = root / f"{spec.name}-v{BUILDER_VERSION}"
    return built_once(target, lambda out: build(spec, out))


def built_once(
    target: Path, build_into: Callable[[Path], None], marker: str = "config.json"
) -> Path:
    """The model directory `target` (one holding `marker`), made by `build_into` on first use.
    Processes that make it at once each build a scratch directory of their own and rename it
    into place, so a reader never sees half of one."""
    if (target / marker).exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}-"))
    try:
        build_into(scratch)
        try:
            scratch.rename(target)
        except OSError:  # made by another process meanwhile
            if not (target / marker).exists():
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target


def build(spec: TinySpec, out: Path) -> None:
    import torch

    tokenizer = train_tokenizer(spec)
    if spec.architecture == "llava":
        tokenizer.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN]})
        tokenizer.chat_template = VLM_TEMPLATE
        _llava_processor(tokenizer).save_pretrained(out)
    else:
        if spec.thinks:
            tokenizer.add_tokens(THINK_TOKENS)
            tokenizer.chat_template = THINK_TEMPLATE
        tokenizer.save_pretrained(out)
    torch.manual_seed(0)
    model = _make_model(spec, tokenizer)
    if model.can_generate():
        model.generation_config.eos_token_id = tokenizer.eos_token_id
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out)


def _llava_processor(tokenizer: Any) -> Any:
    from transformers import CLIPImageProcessorPil, LlavaProcessor

    size = VISION["image_size"]
    images = CLIPImageProcessorPil(
        size={"shortest_edge": size}, crop_size={"height": size, "width": size}
    )
    # "default" drops the vision tower's CLS feature, which the count of image tokens
    # (patches, plus num_additional_image_tokens, minus one) takes into account.
    return LlavaProcessor(
        image_processor=images,
        tokenizer=tokenizer,
        patch_size=VISION["patch_size"],
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
        chat_template=VLM_TEMPLATE,
    )


def corpus(size: int, seed: int = 0) -> list[str]:
    """Sentences of common words with some made-up ones, so BPE has merges to learn."""
    rng = random.Random(seed)
    letters = "etaoinshrdlucmfwypvbgkqjxz"
    made_up = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 9))) for _ in range(size)]
    vocabulary = WORDS + made_up
    return [
        " ".join(rng.choice(vocabulary) for _ in range(rng.randint(4, 14))).capitalize() + "."
        for _ in range(size)
    ]


def train_tokenizer(spec: TinySpec) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    # A large vocabulary needs enough distinct words to learn that many merges.
    sentences = corpus(max(4000, spec.vocab_size * 2))
    if spec.tokenizer == "wordpiece":
        return _wordpiece_tokenizer(sentences, spec)
    if spec.tokenizer == "bpe":
        special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=spec.vocab_size,
            special_tokens=special,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tok.train_from_iterator(sentences, trainer)
        wrapped = PreTrainedTokenizerFast(
            tokenizer_object=tok,
            bos_token="<|endoftext|>",
            eos_token="<|im_end|>",
            pad_token="<|endoftext|>",
            chat_template=CHATML_TEMPLATE,
        )
    else:
        special = ["<unk>", "<s>", "</s>", "<pad>"]
        tok = Tokenizer(models.Unigram())
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Metaspace()
        trainer = trainers.UnigramTrainer(
            vocab_size=spec.vocab_size,
            special_tokens=special,
            unk_token="<unk>",
            show_progress=False,
        )
        tok.train_from_iterator(sentences, trainer)
        wrapped = PreTrainedTokenizerFast(
            tokenizer_object=tok,
            bos_token="<s>",
            eos_token="</s>",
            pad_token="<pad>",
            unk_token="<unk>",
            chat_template=INST_TEMPLATE,
        )
    return wrapped


def _wordpiece_tokenizer(sentences: list[str], spec: TinySpec) -> Any:
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    normalizer = normalizers.BertNormalizer(lowercase=True)
    pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    # The vocabulary is chosen here rather than by tokenizers' WordPiece trainer, which breaks
    # ties between equally frequent pieces differently on every run (a model built twice
    # would read text as different ids): the special tokens, every character alone and as a
    # word's continuation, then the most frequent words, ties in alphabetical order.
    counts = Counter(
        word
        for sentence in sentences
        for word, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(sentence))
    )
    chars = sorted({char for word in counts for char in word})
    words = sorted((w for w in counts if len(w) > 1), key=lambda w: (-counts[w], w))
    pieces = [*special, *chars, *(f"##{char}" for char in chars)]
    pieces += words[: max(0, spec.vocab_size - len(pieces))]
    vocab = {piece: i for i, piece in enumerate(pieces)}
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.WordPiece()
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        cls_token="[CLS]",
        sep_token="[SEP]",
        pad_token="[PAD]",
        unk_token="[UNK]",
        mask_token="[MASK]",
        model_max_length=spec.context,
        model_input_names=["input_ids", "token_type_ids", "attention_mask"],
    )


def _make_model(spec: TinySpec, tokenizer: Any) -> Any:
    vocab = max(spec.vocab_size, len(tokenizer))
    ids = {
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    if spec.architecture in ("cross-encoder", "classifier"):
        from transformers import BertConfig, BertForSequenceClassification

        labels = ["LABEL_0"] if spec.architecture == "cross-encoder" else list(CLASSES)
        config = BertConfig(
            vocab_size=vocab,
            hidden_size=spec.hidden,
            num_hidden_layers=spec.layers,
            num_attention_heads=spec.heads,
            intermediate_size=spec.intermediate,
            max_position_embeddings=spec.context,
            initializer_range=spec.init_std,
            id2label=dict(enumerate(labels)),
            label2id={label: i for i, label in enumerate(labels)},
            pad_token_id=tokenizer.pad_token_id,
        )
        return BertForSequenceClassification(config)
    if spec.architecture in ("llama", "llava", "reward"):
        from transformers import LlamaConfig, LlamaForCausalLM, LlamaForSequenceClassification

        config = LlamaConfig(
            vocab_size=vocab,
            hidden_size=spec.hidden,
            intermediate_size=spec.intermediate,
            num_hidden_layers=spec.layers,
            num_attention_heads=spec.heads,
            num_key_value_heads=spec.kv_heads,
            max_position_embeddings=spec.context,
            rms_norm_eps=1e-5,
            tie_word_embeddings=True,
            initializer_range=spec.init_std,
            **ids,
        )
        if spec.architecture == "reward":
            config.num_labels = 1
            return LlamaForSequenceClassification(config)
        return (
            _llava_model(config, tokenizer)
            if spec.architecture == "llava"
            else LlamaForCausalLM(config)
        )
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=vocab,
        n_positions=spec.context,
        n_embd=spec.hidden,
        n_layer=spec.layers,
        n_head=spec.heads,
        n_inner=spec.intermediate,
        initializer_range=spec.init_std,
        **ids,
    )
    return GPT2LMHeadModel(config)


def _llava_model(text: Any, tokenizer: Any) -> Any:
    from transformers import CLIPVisionConfig, LlavaConfig, LlavaForConditionalGeneration

    width = VISION["hidden"]
    vision = CLIPVisionConfig(
        hidden_size=width,
        intermediate_size=2 * width,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=VISION["image_size"],
        patch_size=VISION["patch_size"],
        projection_dim=width,
    )
    config = LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_id=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
        vision_feature_select_strategy="default",
        vision_feature_layer=-1,
        tie_word_embeddings=True,
        initializer_range=text.initializer_range,
    )
    return LlavaForConditionalGeneration(config)


def main(argv: list[str] | None = None) -> int:
    return builder_main(argv, "lmpress.builtin_models.tiny", "tiny models", SPECS, tiny_model)


def builder_main(argv: list[str] | None, module: str, what: str, names: Any, build: Any) -> int:
    """`python -m MODULE [NAME ...]`: build the named models (default: llama) and print where
    each is; argparse gives --help and names a model it does not know."""
    import argparse

    parser = argparse.ArgumentParser(
        prog=f"python -m {module}", description=f"Build {what} locally and print their paths."
    )
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"one of: {', '.join(names)}")
    chosen = parser.parse_args(argv).names or ["llama"]
    for name in chosen:
        if name not in names:
            parser.error(f"unknown model '{name}'; choose from {', '.join(names)}")
    for name in chosen:
        print(build(name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
