"""Tiny BERT GGUFs for llama.cpp's embedding and rank pooling, written offline like the others
(by bert_gguf.py, which converts a real sentence-transformers BERT the same way).

`bert` is an encoder with mean pooling (`bert.pooling_type`), what a sentence-transformers model
such as MiniLM becomes as a GGUF; `bert-rerank` is the same encoder with rank pooling and a
classification head (BERT's pooler and a one-logit classifier), which llama.cpp reads as a
cross-encoder reranker. The vocabulary is WordPiece: the word list's words and every character.

`hf_state_dict` gives the same weights under transformers' `BertForSequenceClassification`
names, so a test can run the model through transformers as an independent reference.

`classifier` is not written from weights of its own: it is tiny.py's `tiny:classifier` (a BERT
with a head of three labels) converted as any Hugging Face classifier is (bert_gguf.py), so one
model runs on NATIVE from its directory and on LLAMACPP from its GGUF.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmpress.builtin_models.bert_gguf import (
    POOLING_MEAN,
    POOLING_RANK,
    BertShape,
    WordPiece,
    convert_directory,
    write_bert_gguf,
)
from lmpress.builtin_models.tiny import BUILDER_VERSION as TINY_BUILDER_VERSION
from lmpress.builtin_models.tiny import SPECS as TINY_SPECS
from lmpress.builtin_models.tiny import WORDS, tiny_model

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
PAD, UNK, CLS, SEP, MASK = range(len(SPECIALS))


@dataclass(frozen=True)
class BertSpec:
    name: str
    pooling: int
    hidden: int = 64
    layers: int = 2
    heads: int = 4
    intermediate: int = 128
    # Small, so that a long row is cut at it: the engine says so in `Embedding.truncated`.
    context: int = 128
    init_std: float = 0.2
    # The tiny.py model converted, its weights, vocabulary and labels; None: written here.
    source: str | None = None


def converted(name: str) -> BertSpec:
    """tiny.py's BERT `name` as a tiny GGUF of its shape, named (and so cached) by the tiny.py
    build it is converted from: a rebuilt directory is converted anew."""
    tiny = TINY_SPECS[name]
    return BertSpec(
        f"{name}-tiny{TINY_BUILDER_VERSION}", POOLING_RANK, tiny.hidden, tiny.layers, tiny.heads,
        tiny.intermediate, tiny.context, tiny.init_std, source=name,
    )  # fmt: skip


# By the name `tiny-gguf:NAME` gives.
BERTS = {
    "bert": BertSpec("bert", POOLING_MEAN),
    "bert-rerank": BertSpec("bert-rerank", POOLING_RANK),
    "classifier": converted("classifier"),
}


def wordpiece_vocab() -> list[str]:
    """The vocabulary in Hugging Face's vocab.txt form: specials, every character alone and as
    a continuation, then the word list's words and their continuations."""
    chars = "abcdefghijklmnopqrstuvwxyz0123456789.,;:!?'\"()-"
    tokens = list(SPECIALS)
    tokens += list(chars) + [f"##{c}" for c in chars]
    for word in dict.fromkeys(WORDS):
        tokens += [word] if len(word) > 1 and word not in tokens else []
        tokens += [f"##{word}"] if f"##{word}" not in tokens else []
    return tokens


def hf_state_dict(spec: BertSpec) -> dict[str, Any]:
    """The model's weights (numpy float32) under `BertForSequenceClassification`'s names, one
    logit; a fixed seed, so the GGUF and this agree."""
    import numpy as np

    rng = np.random.default_rng(0)
    h, ff = spec.hidden, spec.intermediate
    weights: dict[str, Any] = {}

    def linear(name: str, rows: int, cols: int) -> None:
        weights[f"{name}.weight"] = rng.standard_normal((rows, cols), np.float32) * spec.init_std
        weights[f"{name}.bias"] = rng.standard_normal(rows, np.float32) * spec.init_std

    def norm(name: str) -> None:
        weights[f"{name}.weight"] = 1 + rng.standard_normal(h, np.float32) * 0.1
        weights[f"{name}.bias"] = rng.standard_normal(h, np.float32) * 0.1

    def table(name: str, rows: int) -> None:
        weights[name] = rng.standard_normal((rows, h), np.float32) * spec.init_std

    table("bert.embeddings.word_embeddings.weight", len(wordpiece_vocab()))
    table("bert.embeddings.position_embeddings.weight", spec.context)
    table("bert.embeddings.token_type_embeddings.weight", 2)
    norm("bert.embeddings.LayerNorm")
    for i in range(spec.layers):
        layer = f"bert.encoder.layer.{i}"
        for part in ("query", "key", "value"):
            linear(f"{layer}.attention.self.{part}", h, h)
        linear(f"{layer}.attention.output.dense", h, h)
        norm(f"{layer}.attention.output.LayerNorm")
        linear(f"{layer}.intermediate.dense", ff, h)
        linear(f"{layer}.output.dense", h, ff)
        norm(f"{layer}.output.LayerNorm")
    linear("bert.pooler.dense", h, h)
    linear("classifier", 1, h)
    return weights


def write_bert(spec: BertSpec, out: Path) -> None:
    if spec.source is not None:
        convert_directory(tiny_model(spec.source), out)
        return
    shape = BertShape(spec.hidden, spec.layers, spec.heads, spec.intermediate, spec.context)
    vocab = WordPiece(wordpiece_vocab(), CLS, SEP, UNK, PAD, MASK)
    write_bert_gguf(
        hf_state_dict(spec), vocab, shape, spec.pooling, out, f"lmpress tiny {spec.name}"
    )
