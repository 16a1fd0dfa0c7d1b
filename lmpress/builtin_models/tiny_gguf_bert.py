"""Tiny BERT GGUFs for llama.cpp's embedding and rank pooling, written offline like the others.

`bert` is an encoder with mean pooling (`bert.pooling_type`), what a sentence-transformers model
such as MiniLM becomes when llama.cpp's converter writes it; `bert-rerank` is the same encoder
with rank pooling and a classification head (`cls`: BERT's pooler, a dense layer and tanh over
the [CLS] token; `cls.output`: the one-logit classifier), which llama.cpp reads as a
cross-encoder reranker. The vocabulary is WordPiece in llama.cpp's form: a piece that starts a
word carries "▁" (where the Hugging Face vocab.txt has none), a continuation drops the "##".

`hf_state_dict` gives the same weights under transformers' `BertForSequenceClassification`
names, so a test can run the model through transformers as an independent reference.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmpress.builtin_models.tiny import WORDS

# llama.cpp's POOLING_TYPE values, as `{arch}.pooling_type` stores them.
POOLING_MEAN, POOLING_RANK = 1, 4
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
PAD, UNK, CLS, SEP, MASK = range(len(SPECIALS))
LAYER_NORM_EPS = 1e-12


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


BERTS = {spec.name: spec for spec in (BertSpec("bert", POOLING_MEAN),
                                      BertSpec("bert-rerank", POOLING_RANK))}  # fmt: skip


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


def gguf_token(token: str) -> str:
    if token in SPECIALS:
        return token
    return token[2:] if token.startswith("##") else "\u2581" + token


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


# Hugging Face's names to llama.cpp's, per layer and for the rest.
_LAYER_NAMES = {
    "attention.self.query": "attn_q", "attention.self.key": "attn_k",
    "attention.self.value": "attn_v", "attention.output.dense": "attn_output",
    "attention.output.LayerNorm": "attn_output_norm", "intermediate.dense": "ffn_up",
    "output.dense": "ffn_down", "output.LayerNorm": "layer_output_norm",
}  # fmt: skip
_NAMES = {
    "bert.embeddings.word_embeddings": "token_embd",
    "bert.embeddings.position_embeddings": "position_embd",
    "bert.embeddings.token_type_embeddings": "token_types",
    "bert.embeddings.LayerNorm": "token_embd_norm",
    "bert.pooler.dense": "cls",
    "classifier": "cls.output",
}


def gguf_name(hf_name: str) -> str | None:
    """The tensor's name in a BERT GGUF (None: not one llama.cpp reads)."""
    stem, _, kind = hf_name.rpartition(".")
    if stem in _NAMES:
        return f"{_NAMES[stem]}.{kind}"
    if stem.startswith("bert.encoder.layer."):
        index, _, part = stem[len("bert.encoder.layer.") :].partition(".")
        return f"blk.{index}.{_LAYER_NAMES[part]}.{kind}"
    return None


def write_bert(spec: BertSpec, out: Path) -> None:
    import gguf

    writer = gguf.GGUFWriter(str(out), "bert")
    writer.add_name(f"lmpress tiny {spec.name}")
    writer.add_context_length(spec.context)
    writer.add_embedding_length(spec.hidden)
    writer.add_block_count(spec.layers)
    writer.add_feed_forward_length(spec.intermediate)
    writer.add_head_count(spec.heads)
    writer.add_layer_norm_eps(LAYER_NORM_EPS)
    writer.add_causal_attention(False)
    writer.add_pooling_type(gguf.PoolingType(spec.pooling))
    writer.add_tokenizer_model("bert")
    tokens = [gguf_token(token) for token in wordpiece_vocab()]
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in SPECIALS else 1 for t in tokens])  # CONTROL, NORMAL
    writer.add_token_type_count(2)
    writer.add_bos_token_id(CLS)
    writer.add_sep_token_id(SEP)
    writer.add_unk_token_id(UNK)
    writer.add_pad_token_id(PAD)
    writer.add_mask_token_id(MASK)
    writer.add_add_bos_token(True)
    writer.add_add_sep_token(True)
    rank = spec.pooling == POOLING_RANK
    for hf_name, values in hf_state_dict(spec).items():
        name = gguf_name(hf_name)
        if name is not None and (rank or not name.startswith("cls")):
            writer.add_tensor(name, values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
