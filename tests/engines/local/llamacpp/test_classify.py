"""LLAMACPP's classify and reward on tiny:classifier converted to a GGUF (tiny-gguf:classifier,
a BERT with three labels), against transformers' text-classification pipeline on the model's
own directory; and on two classifiers made from it and converted as any is (bert_gguf.py), whose
activation or names a GGUF of llama.cpp's own converter does not carry: a multi-label one
(`problem_type: multi_label_classification`: a sigmoid a label, not a softmax) and a one-label
one whose label has a name (`id2label`), each given the pipeline's values and NATIVE's names.

llama.cpp's CPU backend does not compute BERT's GELU as transformers does: whatever the
config's `hidden_act` (tiny:classifier's is the exact, erf form), llama.cpp's BERT graph calls
`ggml_gelu`, the tanh form, and ggml-cpu evaluates it from a table of all 65,536 fp16 values
(GGML_GELU_FP16, ggml-cpu/vec.h): the input rounded to fp16 (11 significant bits, so by up to
2^-11 of itself) and the result stored as one. Over the inputs these weights give the FFN
(|x| up to 7.7, 4% of them past 4) the table is off the tanh form by up to 3.9e-3 (2.0e-3
below 4), four to eight times the tanh form's own distance from the erf one (4.7e-4, at
x = 2.7). Through two layers that moves the logits by
2.3e-3 to 3.9e-3 from transformers' (measured over eight builds of tiny:classifier, when its
WordPiece vocabulary still came out differently from build to build; logits up to 3.8 in
size), and about as much from transformers run with hidden_act gelu_pytorch_tanh (2.0e-3 on
one build): building the model with the tanh form would not bring it under 1e-4. Hence two
references, each text's values compared:
- the pipeline on the model as it is: within GELU_LOGITS on the logits, and half that on the
  probabilities (a softmax moves p_i by p_i * |dz_i - sum_j p_j dz_j| <= 2 p_i (1 - p_i) max|dz|
  <= max|dz| / 2); measured up to 3.9e-3 and 9.3e-4 over the eight builds. A sigmoid moves p by
  p (1 - p) |dz| <= |dz| / 4, so a quarter of it for the multi-label and one-label classifiers,
  whose logits are tiny:classifier's own (the same encoder; the one-label head is its first row);
- transformers with its GELU replaced by the table's (`ggml_gelu`), so that everything else
  (the converter, the pooler and head, the labels, the tokenization, the softmax) is compared:
  the median text within 1e-4 (measured at most 1.4e-5 on the logits, 3.6e-7 on the
  probabilities). Not every text: ggml's matmuls and torch's round their sums differently (by
  a few 1e-7 of a value), which now and then puts a GELU input on the other side of the
  midpoint between two fp16 values and moves its output by a whole fp16 step (up to 4e-3 at
  |x| < 8); such a step moved one text's logits by 1.4e-3 (measured), while the other texts
  of that build stayed within 1e-5.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from lmpress.builtin_models.bert_gguf import convert_directory
from lmpress.builtin_models.tiny import CLASSES, tiny_model
from lmpress.builtin_models.tiny_gguf import tiny_gguf
from lmpress.configs import load_config
from lmpress.engines.registry import create_engine
from lmpress.vocabulary.embeddings import EmbedRequest, ScoreRequest
from lmpress.vocabulary.errors import ConfigError, UnsupportedParamError

TEXTS = [
    "the quick cat",
    "a red fish!",
    "Blue, green; and dark?",
    "",
    "every small bird sings to the dog over the river today",
    "Why is the SKY blue",
    "naïve café",
]
# What llama.cpp's GELU table moves the logits by: 3.9e-3 at most over eight builds, with room.
GELU_LOGITS = 1e-2


def make(name: str, task: str, engine: str = "LLAMACPP"):
    overrides = {"engine": engine, "model.model_name": name, "task": task}
    return create_engine(load_config(overrides=overrides))


@pytest.fixture(scope="module")
def classifier():
    engine = make("tiny-gguf:classifier", "classify")
    yield engine
    asyncio.run(engine.aclose())


@pytest.fixture(scope="module")
def rewarder():
    engine = make("tiny-gguf:classifier", "reward")
    yield engine
    asyncio.run(engine.aclose())


def ggml_gelu(x):
    """ggml-cpu's GELU: the tanh form of the input rounded to fp16, looked up as an fp16."""
    import torch

    h = x.to(torch.float16).to(torch.float32)
    y = 0.5 * h * (1 + torch.tanh(0.7978845608028654 * h * (1 + 0.044715 * h * h)))
    y = y.to(torch.float16).to(torch.float32)
    return torch.where(x <= -10, torch.zeros_like(x), torch.where(x >= 10, x, y))


def pipeline_rows(
    ggml: bool,
    function_to_apply: str | None = None,
    directory: Path | None = None,
    labels: tuple[str, ...] = CLASSES,
) -> np.ndarray:
    """transformers' text-classification pipeline on a classifier's directory (tiny:classifier's
    unless given), each text's scores in label-id order; `ggml`: its GELU replaced by
    ggml_gelu."""
    import torch
    from transformers import pipeline

    kwargs = {"function_to_apply": function_to_apply} if function_to_apply else {}
    model = str(directory or tiny_model("classifier"))
    classify = pipeline("text-classification", model=model, top_k=None, device="cpu")
    if ggml:
        for layer in classify.model.bert.encoder.layer:
            layer.intermediate.intermediate_act_fn = torch.nn.Module()
            layer.intermediate.intermediate_act_fn.forward = ggml_gelu
    with torch.no_grad():
        rows = classify(TEXTS, **kwargs)
    return np.array([[{r["label"]: r["score"] for r in row}[c] for c in labels] for row in rows])


@pytest.fixture(scope="module")
def expected() -> dict[str, np.ndarray]:
    return {
        "probs": pipeline_rows(ggml=False),
        "probs ggml": pipeline_rows(ggml=True),
        "logits": pipeline_rows(ggml=False, function_to_apply="none"),
        "logits ggml": pipeline_rows(ggml=True, function_to_apply="none"),
    }


def values(result, labels: tuple[str, ...] = CLASSES) -> np.ndarray:
    assert result.error is None, result.error
    assert result.labels == list(labels)  # the GGUF's classifier.output_labels, in id order
    assert all(e.vector.dtype == np.float32 for e in result.embeddings)
    return np.stack([np.asarray(e.vector, dtype=np.float64) for e in result.embeddings])


def test_classify_equals_transformers_pipeline(classifier, expected):
    async def both():  # two requests at once: their texts share the worker's batches
        return await asyncio.gather(
            classifier.embed(EmbedRequest("a", TEXTS[:4])),
            classifier.embed(EmbedRequest("b", TEXTS[4:])),
        )

    first, second = asyncio.run(both())
    got = np.concatenate([values(first), values(second)])
    assert got.shape == (len(TEXTS), len(CLASSES))
    assert np.allclose(got.sum(axis=1), 1, atol=1e-6)  # a softmax over the labels
    assert np.abs(got - expected["probs"]).max() <= GELU_LOGITS / 2
    assert np.median(np.abs(got - expected["probs ggml"]).max(axis=1)) <= 1e-4

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model("classifier"))
    counts = [len(tokenizer(text)["input_ids"]) for text in TEXTS]  # [CLS] text [SEP]
    assert [e.prompt_tokens for e in first.embeddings + second.embeddings] == counts
    assert first.usage.prompt_tokens == sum(counts[:4])


def test_reward_equals_the_pipelines_raw_logits(rewarder, expected):
    got = values(asyncio.run(rewarder.embed(EmbedRequest("r", TEXTS))))
    assert got.shape == (len(TEXTS), len(CLASSES))
    assert np.abs(got - expected["logits"]).max() <= GELU_LOGITS
    assert np.median(np.abs(got - expected["logits ggml"]).max(axis=1)) <= 1e-4


def test_one_label_without_labels_is_a_sigmoid_named_label_0():
    """tiny-gguf:bert-rerank's head has one value and no labels key: classify names it as
    transformers does and gives its sigmoid, reward its raw value."""
    engine = make("tiny-gguf:bert-rerank", "classify")
    try:
        result = asyncio.run(engine.embed(EmbedRequest("s", TEXTS[:3])))
    finally:
        asyncio.run(engine.aclose())
    reward = make("tiny-gguf:bert-rerank", "reward")
    try:
        raw = asyncio.run(reward.embed(EmbedRequest("s", TEXTS[:3])))
    finally:
        asyncio.run(reward.aclose())
    assert result.labels == raw.labels == ["LABEL_0"]
    logits = np.array([float(e.vector[0]) for e in raw.embeddings])
    probs = np.array([float(e.vector[0]) for e in result.embeddings])
    assert np.allclose(probs, 1 / (1 + np.exp(-logits)), atol=1e-6)
    assert len(set(np.round(logits, 4))) == 3


# tiny:classifier's one-label variant: its head's first row, named.
ONE_LABEL = ("toxic",)


def variant(root: Path, name: str, config: dict, head_rows: int | None = None) -> Path:
    """tiny:classifier's directory copied under `root`, its config updated with `config` and
    its head cut to its first `head_rows`."""
    from safetensors.numpy import load_file, save_file

    directory = root / name
    shutil.copytree(tiny_model("classifier"), directory)
    config_file = directory / "config.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), **config}))
    if head_rows is not None:
        weights = load_file(directory / "model.safetensors")
        for key in ("classifier.weight", "classifier.bias"):
            weights[key] = weights[key][:head_rows]
        save_file(weights, directory / "model.safetensors", metadata={"format": "pt"})
    return directory


@pytest.fixture(scope="module")
def variants(tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    """Each variant's directory, and the GGUF lmpress's converter writes of it."""
    root = tmp_path_factory.mktemp("classifiers")
    one_label = {"id2label": {"0": ONE_LABEL[0]}, "label2id": {ONE_LABEL[0]: 0}}
    directories = {
        "multi-label": variant(root, "multi-label", {"problem_type": "multi_label_classification"}),
        "one-label": variant(root, "one-label", one_label, head_rows=1),
        "regression": variant(root, "regression", {"problem_type": "regression"}),
    }
    return {
        name: (directory, convert_directory(directory, root / f"{name}.gguf"))
        for name, directory in directories.items()
    }


def classified(engine: str, model: Path, labels: tuple[str, ...]) -> np.ndarray:
    made = make(str(model), "classify", engine)
    try:
        return values(asyncio.run(made.embed(EmbedRequest("v", TEXTS))), labels)
    finally:
        asyncio.run(made.aclose())


@pytest.mark.parametrize(
    ("name", "labels"),
    [("multi-label", CLASSES), ("one-label", ONE_LABEL), ("regression", CLASSES)],
)
def test_a_converted_classifier_gets_the_activation_and_names_native_gives(variants, name, labels):
    """A sigmoid a label, as the pipeline (and NATIVE, within float32 rounding) gives them: for
    the multi-label classifier by the `problem_type` the converter records, for the one-label
    one by its count; and the one label named as id2label names it, not `LABEL_0`. A softmax
    over the multi-label classifier's labels would be off by far more than the bound. A
    regression head's values are given raw, as the pipeline gives them (bound: the logits')."""
    directory, gguf = variants[name]
    got = classified("LLAMACPP", gguf, labels)  # `values` checks the names
    native = classified("NATIVE", directory, labels)
    want = pipeline_rows(ggml=False, directory=directory, labels=labels)
    want_ggml = pipeline_rows(ggml=True, directory=directory, labels=labels)
    assert np.abs(native - want).max() <= 1e-4
    raw = name == "regression"
    assert np.abs(got - want).max() <= (GELU_LOGITS if raw else GELU_LOGITS / 4)
    if raw:
        np.testing.assert_allclose(
            want, pipeline_rows(ggml=False, function_to_apply="none", directory=directory)
        )
    assert np.median(np.abs(got - want_ggml).max(axis=1)) <= 1e-4
    if name == "multi-label":
        logits = pipeline_rows(ggml=False, function_to_apply="none", directory=directory)
        np.testing.assert_allclose(want, 1 / (1 + np.exp(-logits)), atol=1e-6)
        softmax = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
        assert np.abs(softmax - want).max() > 10 * GELU_LOGITS


@pytest.mark.parametrize(
    ("name", "task", "message"),
    [
        # a decoder: refused before its weights load
        ("tiny-gguf:llama", "classify", "task: classify: LLAMACPP reads a classification "
         "head only from a BERT-family GGUF (bert, modern-bert, neo-bert); '{path}' is llama; "
         "use NATIVE or VLLM for it"),
        ("tiny-gguf:bert", "reward", "task: reward needs a classifier GGUF (rank pooling"),
        ("tiny-gguf:classifier", "score", "is a classifier with 3 labels; a reranker for "
         "scoring has one. Use task: classify"),
        ("tiny-gguf:classifier", "embed", "pools with rank. Set model.model_kwargs.pooling_type "
         "(1 mean, 2 cls, 3 last), or use task: classify"),
    ],
)  # fmt: skip
def test_a_model_that_cannot_do_the_task_is_refused_in_one_line(name, task, message):
    path = str(tiny_gguf(name.removeprefix("tiny-gguf:")))
    with pytest.raises(ConfigError) as refused:
        make(name, task)
    assert message.format(path=path) in str(refused.value)
    assert "\n" not in str(refused.value)


def test_calls_outside_the_task_are_refused(classifier):
    with pytest.raises(UnsupportedParamError, match="started for task classify: score needs"):
        asyncio.run(classifier.score(ScoreRequest("s", "q", ["d"])))
    reranker = make("tiny-gguf:bert-rerank", "score")
    try:
        with pytest.raises(UnsupportedParamError, match="started for task score: embed needs"):
            asyncio.run(reranker.embed(EmbedRequest("e", ["the cat"])))
    finally:
        asyncio.run(reranker.aclose())
