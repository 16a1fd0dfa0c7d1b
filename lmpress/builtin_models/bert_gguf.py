"""BERT encoders as GGUF files for llama.cpp's embedding and rank pooling, written offline.

`write_bert_gguf` writes weights named as transformers names a BERT (`BertModel`, with or
without the `bert.` prefix of `BertForSequenceClassification`) under llama.cpp's `bert`
tensor names, with a WordPiece vocabulary in llama.cpp's form (a piece that starts a word
carries "▁", a continuation drops its "##"). The pooler and classifier become llama.cpp's
reranker head (`cls`: a dense layer and tanh over the [CLS] token; `cls.output`: the
classifier) when the pooling is rank. A classifier of more than one label needs its labels
written too (`{arch}.classifier.output_labels`, in label-id order): llama.cpp takes the head's
width from their count, and refuses a `cls.output` of several rows without them. A one-label
head's label is written where it is given, as llama.cpp's own convert_hf_to_gguf.py writes a
one-label config's `id2label`, so that LLAMACPP names the value as NATIVE and VLLM do (a GGUF
without it: `LABEL_0`). The tiny BERTs (tiny_gguf_bert.py) are written by it, and
`convert_directory` writes a Hugging Face BERT directory with it: a sentence-transformers one,
such as all-MiniLM-L6-v2, or a `BertForSequenceClassification` (a cross-encoder, or a
classifier with its config's `id2label` and `problem_type`):

    python -m lmpress.builtin_models.bert_gguf MODEL_DIR OUT.gguf

The context written is the directory's `max_seq_length` (sentence-transformers cuts inputs
there) when it has one. A `Normalize` module has no GGUF key of llama.cpp's own (its
convert_hf_to_gguf.py reads only the Pooling module, and llama.cpp hands vectors back as
pooled), so the converter records it under lmpress's own key, `NORMALIZE_KEY`, which llama.cpp
ignores and the LLAMACPP engine honours: one model gives the same unit vectors on NATIVE, VLLM
and LLAMACPP. A classifier's `problem_type` likewise has no key of llama.cpp's (its converter
writes the labels only), and it decides classify's activation (a sigmoid a label where the
labels may all hold, `multi_label_classification`; vocabulary/classifier.py): the converter
records the config's under `PROBLEM_TYPE_KEY`, which LLAMACPP reads, so one multi-label model
gives the same probabilities on the three engines.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmpress.vocabulary.classifier import labels_of

# llama.cpp's POOLING_TYPE values, as `{arch}.pooling_type` stores them.
POOLING_MEAN, POOLING_CLS, POOLING_LAST, POOLING_RANK = 1, 2, 3, 4
# sentence-transformers' 1_Pooling/config.json modes, as llama.cpp's pooling types.
_POOLING_MODES = {
    "pooling_mode_mean_tokens": POOLING_MEAN,
    "pooling_mode_cls_token": POOLING_CLS,
    "pooling_mode_lasttoken": POOLING_LAST,
}
NORMAL, CONTROL = 1, 3  # gguf.TokenType values
# true: the model ends in sentence-transformers' Normalize module (an L2 norm after pooling).
NORMALIZE_KEY = "lmpress.pooling.normalize"
# The classifier's `problem_type`, as its Hugging Face config says it (absent: it says none).
PROBLEM_TYPE_KEY = "lmpress.classifier.problem_type"


@dataclass(frozen=True)
class BertShape:
    hidden: int
    layers: int
    heads: int
    intermediate: int
    context: int
    layer_norm_eps: float = 1e-12


@dataclass(frozen=True)
class WordPiece:
    """A vocabulary in Hugging Face's vocab.txt form, and the ids of its special tokens."""

    tokens: list[str]
    cls: int
    sep: int
    unk: int
    pad: int
    mask: int

    def gguf_tokens(self) -> list[str]:
        specials = {self.cls, self.sep, self.unk, self.pad, self.mask}
        return [
            token if i in specials else token[2:] if token.startswith("##") else "\u2581" + token
            for i, token in enumerate(self.tokens)
        ]


# transformers' names to llama.cpp's, per layer and for the rest.
_LAYER_NAMES = {
    "attention.self.query": "attn_q", "attention.self.key": "attn_k",
    "attention.self.value": "attn_v", "attention.output.dense": "attn_output",
    "attention.output.LayerNorm": "attn_output_norm", "intermediate.dense": "ffn_up",
    "output.dense": "ffn_down", "output.LayerNorm": "layer_output_norm",
}  # fmt: skip
_NAMES = {
    "embeddings.word_embeddings": "token_embd",
    "embeddings.position_embeddings": "position_embd",
    "embeddings.token_type_embeddings": "token_types",
    "embeddings.LayerNorm": "token_embd_norm",
    "pooler.dense": "cls",
    "classifier": "cls.output",
}


def gguf_name(hf_name: str) -> str | None:
    """The tensor's name in a BERT GGUF (None: not one llama.cpp reads)."""
    stem, _, kind = hf_name.removeprefix("bert.").rpartition(".")
    if stem in _NAMES:
        return f"{_NAMES[stem]}.{kind}"
    if stem.startswith("encoder.layer."):
        index, _, part = stem[len("encoder.layer.") :].partition(".")
        return f"blk.{index}.{_LAYER_NAMES[part]}.{kind}" if part in _LAYER_NAMES else None
    return None


def write_bert_gguf(
    weights: dict[str, Any],
    vocab: WordPiece,
    shape: BertShape,
    pooling: int,
    out: Path,
    name: str,
    normalize: bool = False,
    labels: list[str] | None = None,
    problem_type: str | None = None,
) -> None:
    """Write a BERT GGUF from `weights` (float32 numpy arrays under transformers' names);
    `normalize`: the model's vectors are L2-normalised after pooling (NORMALIZE_KEY); `labels`:
    the classifier's, in label-id order, written where given (transformers' `LABEL_i` where its
    head has several and they are not); `problem_type`: the classifier's config's
    (PROBLEM_TYPE_KEY)."""
    import gguf

    head = next((v for k, v in weights.items() if gguf_name(k) == "cls.output.weight"), None)
    count = len(head) if head is not None and pooling == POOLING_RANK else 0
    if labels is not None and count and len(labels) != count:
        raise ValueError(f"the classifier has {count} labels, {len(labels)} names given")

    writer = gguf.GGUFWriter(str(out), "bert")
    writer.add_name(name)
    writer.add_context_length(shape.context)
    writer.add_embedding_length(shape.hidden)
    writer.add_block_count(shape.layers)
    writer.add_feed_forward_length(shape.intermediate)
    writer.add_head_count(shape.heads)
    writer.add_layer_norm_eps(shape.layer_norm_eps)
    writer.add_causal_attention(False)
    writer.add_pooling_type(gguf.PoolingType(pooling))
    if normalize:
        writer.add_bool(NORMALIZE_KEY, True)
    if count and (labels or count > 1):
        writer.add_classifier_output_labels(labels or labels_of(None, count))
    if count and problem_type is not None:
        writer.add_string(PROBLEM_TYPE_KEY, problem_type)
    writer.add_tokenizer_model("bert")
    writer.add_token_list(vocab.gguf_tokens())
    specials = {vocab.cls, vocab.sep, vocab.unk, vocab.pad, vocab.mask}
    writer.add_token_types([CONTROL if i in specials else NORMAL for i in range(len(vocab.tokens))])
    writer.add_token_type_count(2)
    writer.add_bos_token_id(vocab.cls)
    writer.add_sep_token_id(vocab.sep)
    writer.add_unk_token_id(vocab.unk)
    writer.add_pad_token_id(vocab.pad)
    writer.add_mask_token_id(vocab.mask)
    writer.add_add_bos_token(True)
    writer.add_add_sep_token(True)
    for hf_name, values in weights.items():
        tensor = gguf_name(hf_name)
        if tensor is not None and (pooling == POOLING_RANK or not tensor.startswith("cls")):
            writer.add_tensor(tensor, values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def convert_directory(directory: Path, out: Path) -> Path:
    """A BERT directory (config.json, model.safetensors, tokenizer.json; a sentence-transformers
    one's 1_Pooling/config.json and modules.json) as a GGUF at `out`: a
    `…ForSequenceClassification` one with rank pooling, its head, its labels and its
    `problem_type`."""
    from safetensors.numpy import load_file

    config = json.loads((directory / "config.json").read_text())
    st_config = directory / "sentence_bert_config.json"
    context = config["max_position_embeddings"]
    if st_config.exists():
        context = json.loads(st_config.read_text()).get("max_seq_length") or context
    shape = BertShape(
        config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"],
        config["intermediate_size"], context, config.get("layer_norm_eps", 1e-12),
    )  # fmt: skip
    pooling_file = directory / "1_Pooling" / "config.json"
    modes = json.loads(pooling_file.read_text()) if pooling_file.exists() else {}
    pooling = next((p for mode, p in _POOLING_MODES.items() if modes.get(mode)), POOLING_CLS)
    if any(a.endswith("ForSequenceClassification") for a in config.get("architectures") or []):
        pooling = POOLING_RANK  # a cross-encoder's or a classifier's head, over its [CLS] token
    modules_file = directory / "modules.json"
    modules = json.loads(modules_file.read_text()) if modules_file.exists() else []
    normalize = any(str(m.get("type", "")).endswith(".Normalize") for m in modules)
    tokenizer = json.loads((directory / "tokenizer.json").read_text())
    ids = tokenizer["model"]["vocab"]
    tokens = sorted(ids, key=ids.__getitem__)
    vocab = WordPiece(tokens, ids["[CLS]"], ids["[SEP]"], ids["[UNK]"], ids["[PAD]"], ids["[MASK]"])
    weights = {
        k: v.astype("float32") for k, v in load_file(directory / "model.safetensors").items()
    }
    # llama.cpp takes one position embedding a position of the context, no more.
    for key in [k for k in weights if k.endswith("embeddings.position_embeddings.weight")]:
        weights[key] = weights[key][:context]
    head = weights.get("classifier.weight")
    labels = labels_of(config.get("id2label"), len(head)) if head is not None else None
    write_bert_gguf(
        weights, vocab, shape, pooling, out, directory.name, normalize, labels,
        config.get("problem_type") if head is not None else None,
    )  # fmt: skip
    return out


if __name__ == "__main__":
    print(convert_directory(Path(sys.argv[1]), Path(sys.argv[2])))
