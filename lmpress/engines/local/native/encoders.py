"""NATIVE's pooling tasks: the model a run of `embed`, `score`, `rerank`, `classify` or `reward`
loads, how its inputs become token rows, and the forward pass that turns a batch of rows into
vectors, scores or a classification head's values.

`embed` loads `transformers.AutoModel` and the pooling the directory declares
(common/pooling.py). `score` and `rerank` load a cross-encoder
(`AutoModelForSequenceClassification` with one label) where the checkpoint is one: each
(query, document) pair is read together and its score is the model's raw logit, with no
activation, as transformers gives it and as sentence-transformers' CrossEncoder does with its
default activation on a one-label model since v4 (Identity). On any other model the score is
the cosine of the query's and the document's embeddings, as vLLM does. `classify` and
`reward` load any sequence-classification model, an encoder's (BERT's: its [CLS] vector) or a
decoder's (Llama's: its last token's, which transformers finds by the config's pad token), and
give each input the head's values (vocabulary/classifier.py makes them probabilities or keeps
them).

Inputs are cut at the model's limit: `model.model_max_length`, else sentence-transformers'
`max_seq_length`, else the tokenizer's or the position embeddings'. A cut row says so
(`Embedding.truncated`), as sentence-transformers would cut it silently.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lmpress.configs.schema import RunConfig
from lmpress.engines.common.checkpoints import load_model_config, load_tokenizer, model_source
from lmpress.engines.common.pooling import Pooling, pool, read_pooling
from lmpress.engines.local.native.loading import load_model
from lmpress.engines.local.native.options import NativeOptions
from lmpress.vocabulary.classifier import activated, activation_of, labels_of
from lmpress.vocabulary.embeddings import CLASSIFYING_TASKS
from lmpress.vocabulary.errors import ErrorKind, ModelLoadError, RequestError, UnsupportedParamError

# A tokenizer's model_max_length when it has none: transformers' VERY_LARGE_INTEGER.
_NO_LIMIT = 10**12
# The heads of an architecture that predicts the next token, so generates text.
_GENERATING_HEADS = ("ForCausalLM", "ForConditionalGeneration", "LMHeadModel")


def is_classifier(model_config: Any) -> bool:
    """Whether the checkpoint is a sequence-classification model (a cross-encoder is one)."""
    architectures = getattr(model_config, "architectures", None) or []
    return any(a.endswith("ForSequenceClassification") for a in architectures)


def made_for(model_config: Any) -> str:
    """The task a checkpoint is made for, by its architectures: for a sequence-classification
    model, classify where it has several labels, score where it has one on an encoder (a
    cross-encoder), reward where it has one on a decoder (a reward model's shape); embed for a
    bare encoder with no head at all (`BertModel`, as sentence-transformers models ship),
    generate for anything else."""
    architectures = getattr(model_config, "architectures", None) or []
    if is_classifier(model_config):
        if model_config.num_labels != 1:
            return "classify"
        return "score" if is_encoder(model_config) else "reward"
    bare = all(a.endswith("Model") and not a.endswith(_GENERATING_HEADS) for a in architectures)
    return "embed" if architectures and bare else "generate"


def is_encoder(model_config: Any) -> bool:
    """Whether the model reads its input both ways (BERT's family: those transformers can
    load for masked-language modelling), not as a decoder reads it."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING_NAMES

    return getattr(model_config, "model_type", None) in MODEL_FOR_MASKED_LM_MAPPING_NAMES


@dataclass
class EncoderRow:
    """One input as the model reads it."""

    ids: list[int]
    type_ids: (
        list[int] | None
    )  # segment ids (BERT's token_type_ids), where the tokenizer gives them
    truncated: bool


class Encoder:
    """The model of a pooling run, and what it needs to read inputs and pool them."""

    def __init__(self, config: RunConfig, device: str, dtype: Any):
        from transformers import AutoModel, AutoModelForSequenceClassification

        model = config.model
        model_config = load_model_config(model)
        architectures = getattr(model_config, "architectures", None) or ["none declared"]
        classifier = is_classifier(model_config)
        self.task = config.task
        self.classifies = config.task in CLASSIFYING_TASKS
        self.cross_encoder = classifier and not self.classifies
        label = f"model '{model.model_name}'"
        if classifier and config.task == "embed":
            task = made_for(model_config)
            kind = "cross-encoder" if task == "score" else "sequence classifier"
            raise UnsupportedParamError(
                f"task: embed: {label} is a {kind} ({architectures[0]}): it has no vectors to "
                f"give; use task {task}, or an embedding model"
            )
        if self.cross_encoder and model_config.num_labels != 1:
            raise UnsupportedParamError(
                f"task: {config.task}: {label} is a classifier with {model_config.num_labels} "
                f"labels; a cross-encoder for scoring has one. Use task classify"
            )
        if self.classifies and not classifier:
            raise UnsupportedParamError(
                f"task: {config.task}: {label} has no classification head ({architectures[0]}); "
                f"use a sequence-classification model (…ForSequenceClassification)"
            )
        count = model_config.num_labels
        self.labels = labels_of(model_config.id2label, count) if self.classifies else None
        self.activation = activation_of(count, getattr(model_config, "problem_type", None))
        directory, gguf_file = model_source(model)
        self.pooling = Pooling() if classifier or gguf_file else read_pooling(directory)
        if self.pooling.subfolder:
            raise ModelLoadError(
                f"{label}: its Transformer module is in '{self.pooling.subfolder}'; lmpress "
                f"loads one at the top of the model's directory only"
            )
        self.tokenizer = load_tokenizer(model)
        auto = AutoModelForSequenceClassification if classifier else AutoModel
        self.model = load_model(model, device, dtype, model_config, auto=auto)
        self.device = device
        self.max_length = max_length(config, self.tokenizer, model_config, self.pooling)
        self.n_vocab = model_config.vocab_size
        self.pad_id = self.tokenizer.pad_token_id or 0
        # A decoder's head reads the last token that is not the config's pad token: rows are
        # padded with that token, and a model without one reads each row alone, unpadded (as
        # transformers' pipeline reads it).
        self.one_by_one = False
        if classifier and not is_encoder(model_config):
            pad = getattr(model_config, "pad_token_id", None)
            self.pad_id, self.one_by_one = (pad, False) if pad is not None else (0, True)
        self.width = model_config.hidden_size
        self.matryoshka = matryoshka_widths(config, model_config, self.pooling)

    def cut_width(self, dimensions: int | None) -> int | None:
        """The width a request's vectors are cut to (None: the model's whole width); a
        RequestError where the model was not trained to be cut there."""
        if dimensions is None:
            return self.pooling.truncate_dim  # sentence-transformers' encode cuts there too
        if dimensions == self.width:
            return None
        allowed = self.matryoshka
        if allowed is None:
            raise RequestError(
                f"dimensions: {dimensions}: this model was not trained Matryoshka-style, so its "
                f"vectors cannot be cut (it gives {self.width}); leave dimensions out, or set "
                f"model.model_kwargs.matryoshka_dims for a model that was",
                kind=ErrorKind.UNSUPPORTED_PARAM,
            )
        if not 1 <= dimensions <= self.width or (allowed != "any" and dimensions not in allowed):
            widths = f"1 to {self.width}" if allowed == "any" else ", ".join(map(str, allowed))
            raise RequestError(
                f"dimensions: {dimensions}: this model's vectors can be cut to {widths}",
                kind=ErrorKind.INVALID_REQUEST,
            )
        return dimensions

    def text_rows(self, first: list[str], second: list[str] | None = None) -> list[EncoderRow]:
        """Texts (or text pairs, read together) as rows, each cut at the model's limit."""
        if self.pooling.lower_case:
            first = [t.lower() for t in first]
            second = None if second is None else [t.lower() for t in second]
        pairs = (first,) if second is None else (first, second)
        whole = self.tokenizer(*pairs, truncation=False)
        rows = []
        for i, ids in enumerate(whole["input_ids"]):
            encoding = {k: v[i] for k, v in whole.items()}
            truncated = len(ids) > self.max_length
            if truncated:  # the tokenizer cuts it, keeping its special tokens
                one = (first[i],) if second is None else (first[i], second[i])
                encoding = self.tokenizer(*one, truncation=True, max_length=self.max_length)
            rows.append(
                EncoderRow(encoding["input_ids"], encoding.get("token_type_ids"), truncated)
            )
        return rows

    def id_rows(self, inputs: list[list[int]]) -> list[EncoderRow]:
        """Token-id inputs as rows, taken as given (no special tokens added), cut at the
        model's limit."""
        rows = []
        for i, ids in enumerate(inputs):
            if not isinstance(ids, list) or not all(
                isinstance(t, int) and not isinstance(t, bool) for t in ids
            ):
                raise RequestError(
                    f"input {i}: neither a text nor a list of token ids; inputs are all texts "
                    f"or all token-id lists",
                    kind=ErrorKind.INVALID_REQUEST,
                )
            if not ids:
                raise RequestError(
                    f"input {i}: an empty list of token ids; give at least one",
                    kind=ErrorKind.INVALID_REQUEST,
                )
            bad = next((t for t in ids if not 0 <= t < self.n_vocab), None)
            if bad is not None:
                raise RequestError(
                    f"input {i}: {bad} is not a token id of this model (0 to {self.n_vocab - 1})",
                    kind=ErrorKind.INVALID_REQUEST,
                )
            rows.append(EncoderRow(list(ids[: self.max_length]), None, len(ids) > self.max_length))
        return rows

    def forward(self, rows: list[EncoderRow]) -> Any:
        """One right-padded batch through the model: a (rows, dim) float32 array of pooled
        vectors, for a cross-encoder a (rows,) array of its logits, for classify and reward a
        (rows, labels) array of the head's values as the task gives them."""
        import numpy as np
        import torch

        if self.one_by_one and len(rows) > 1:
            return np.concatenate([self.forward([row]) for row in rows])

        width = max(len(row.ids) for row in rows)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        types = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, : len(row.ids)] = torch.tensor(row.ids)
            mask[i, : len(row.ids)] = 1
            if row.type_ids is not None:
                types[i, : len(row.ids)] = torch.tensor(row.type_ids)
        inputs = {"input_ids": ids, "attention_mask": mask}
        if any(row.type_ids is not None for row in rows):
            inputs["token_type_ids"] = types
        inputs = {k: v.to(self.device) for k, v in inputs.items()}
        with torch.inference_mode():
            out = self.model(**inputs)
            if self.classifies:
                return activated(out.logits.float().cpu().numpy(), self.task, self.activation)
            if self.cross_encoder:
                return out.logits[:, 0].float().cpu().numpy()
            vectors = pool(out[0], inputs["attention_mask"], self.pooling.mode).float()
            if self.pooling.normalize:
                vectors = torch.nn.functional.normalize(vectors, p=2, dim=-1)
        return vectors.cpu().numpy()


def matryoshka_widths(
    config: RunConfig, model_config: Any, pooling: Pooling
) -> tuple[int, ...] | str | None:
    """The widths the model's vectors may be cut to: "any", a list, or None where it was not
    trained for it. `model.model_kwargs.matryoshka_dims` (true, or the widths) says so, else
    the checkpoint does: a sentence-transformers `truncate_dim`, or the config's
    `matryoshka_dimensions` or `is_matryoshka` (as vLLM reads them)."""
    given = NativeOptions.of(config.model.model_kwargs).matryoshka_dims
    if given is None:
        given = getattr(model_config, "matryoshka_dimensions", None) or (
            getattr(model_config, "is_matryoshka", False) or pooling.truncate_dim is not None
        )
    if given is True:
        return "any"
    if given is False:
        return None
    if (
        isinstance(given, list)
        and given
        and all(isinstance(w, int) and not isinstance(w, bool) and w > 0 for w in given)
    ):
        return tuple(given)
    raise ModelLoadError(
        f"model.model_kwargs.matryoshka_dims: '{given}' is not true, false or a list of widths"
    )


def max_length(config: RunConfig, tokenizer: Any, model_config: Any, pooling: Pooling) -> int:
    """The most tokens an input keeps: model.model_max_length, else what the model declares."""
    if config.model.model_max_length:
        return config.model.model_max_length
    limits = [pooling.max_length, getattr(model_config, "max_position_embeddings", None)]
    if tokenizer.model_max_length and tokenizer.model_max_length < _NO_LIMIT:
        limits.append(tokenizer.model_max_length)
    known = [limit for limit in limits if limit]
    if not known:
        raise ModelLoadError(
            f"model '{config.model.model_name}' declares no input limit; set model.model_max_length"
        )
    return min(known)
