"""lmpress's VLLM engine started for `task: classify` on `tiny:classifier` (BERT, three labels) and
for `task: reward` on `tiny:reward` (Llama, one value on the last token), against transformers'
own text-classification pipeline: classify's probabilities are the pipeline's default (a softmax
over the labels), reward's values its `function_to_apply="none"` (the head's raw logit).

vLLM pools a Llama head at the literal last token, where transformers skips trailing pad tokens:
the reward texts here end in none (a text that ends in the pad token would differ). One engine
start per task: vLLM takes tens of seconds to start here."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from lmpress.builtin_models.tiny import CLASSES, tiny_model
from lmpress.configs import load_config
from lmpress.engines.registry import create_engine
from lmpress.vocabulary.embeddings import EmbedRequest, ScoreRequest
from lmpress.vocabulary.errors import ErrorKind
from tests.engines.local.vllm_real.conftest import worker_in_the_engine_core

TEXTS = ["I loved this film", "why is the sky blue", "a small dog", "Ünïcode café, once more"]


def pipeline_values(directory: str, function_to_apply: str | None) -> tuple[np.ndarray, list]:
    """transformers' pipeline("text-classification", top_k=None) on TEXTS: each text's values
    in label-id order, and the labels."""
    from transformers import AutoConfig, pipeline

    id2label = AutoConfig.from_pretrained(directory).id2label
    labels = [id2label[i] for i in range(len(id2label))]
    classify = pipeline("text-classification", model=directory, top_k=None, device="cpu")
    extra = {"function_to_apply": function_to_apply} if function_to_apply else {}
    answers = classify(TEXTS, **extra)
    by_label = [{a["label"]: a["score"] for a in answer} for answer in answers]
    return np.array([[scores[label] for label in labels] for scores in by_label]), labels


@pytest.mark.parametrize(
    ("name", "task", "function_to_apply", "labels"),
    [
        ("classifier", "classify", None, list(CLASSES)),
        ("reward", "reward", "none", ["LABEL_0"]),
    ],
)
def test_head_values_equal_transformers_pipeline(name, task, function_to_apply, labels):
    directory = str(tiny_model(name))
    expected, expected_labels = pipeline_values(directory, function_to_apply)
    overrides = {"engine": "VLLM", "task": task, "model.model_name": directory,
                 "model.model_kwargs": {"enforce_eager": True}}  # fmt: skip
    with worker_in_the_engine_core():
        engine = create_engine(load_config(overrides=overrides))
    try:

        async def ask():
            return await asyncio.gather(
                engine.embed(EmbedRequest("c", TEXTS)),
                engine.embed(EmbedRequest("d", TEXTS[:1], dimensions=2)),
                engine.score(ScoreRequest("s", TEXTS[0], TEXTS[1:])),
            )

        result, cut, scored = asyncio.run(ask())
    finally:
        asyncio.run(engine.aclose())
    assert result.error is None, result.error
    assert result.labels == expected_labels == labels
    got = np.stack([np.asarray(e.vector) for e in result.embeddings])
    assert all(np.asarray(e.vector).dtype == np.float32 for e in result.embeddings)
    diff = float(np.abs(got - expected).max())
    print(f"{task}: max |VLLM - pipeline| = {diff:.3g}")
    assert diff < 1e-4
    if task == "classify":
        assert got.sum(axis=1) == pytest.approx(1.0, abs=1e-6)
    tokenizer = engine.scheduler.tokenizer
    assert [e.prompt_tokens for e in result.embeddings] == [
        len(tokenizer(text)["input_ids"]) for text in TEXTS
    ]
    assert result.usage.prompt_tokens == sum(e.prompt_tokens for e in result.embeddings)
    # A head's values cannot be cut, and a classify or reward run scores no pairs.
    assert cut.error is not None and cut.error.kind == ErrorKind.UNSUPPORTED_PARAM
    assert scored.error is not None and scored.error.kind == ErrorKind.UNSUPPORTED_PARAM
    assert f"was started for {task}" in scored.error.message
