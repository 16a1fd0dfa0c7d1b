"""What `classify` and `reward` make of a sequence-classification head's values, on every local
engine alike, and the names of its labels, which the GGUF converter (builtin_models/bert_gguf.py)
writes by the same rule the engines read them by: hence here, below both.

A classifier's labels are its config's `id2label`, in label-id order (transformers names a label
without one `LABEL_i`, and so does this). `classify` turns the head's logits into probabilities
with the activation transformers' text-classification pipeline applies by default: none where
the model says it regresses (`problem_type: regression`), a sigmoid where it has one label or
says its labels may all hold (`problem_type: multi_label_classification`), a softmax over the
labels otherwise. `reward`
keeps the raw values: a reward model's score is its head's logit, as transformers gives it and
as reward-model users read it.
"""

from __future__ import annotations

from typing import Any

MULTI_LABEL = "multi_label_classification"
REGRESSION = "regression"


def labels_of(id2label: dict[Any, str] | None, count: int) -> list[str]:
    """The names of a head's `count` values: `id2label`'s (its keys ints or their text, as a
    config read from JSON has them), else transformers' `LABEL_i`."""
    names = {int(k): str(v) for k, v in (id2label or {}).items()}
    return [names.get(i, f"LABEL_{i}") for i in range(count)]


def activation_of(count: int, problem_type: str | None) -> str:
    """What `classify` applies to a head of `count` values: "none", "sigmoid" (to each value)
    or "softmax" (over them), in the order transformers' pipeline decides it."""
    if problem_type == REGRESSION:
        return "none"
    if count == 1 or problem_type == MULTI_LABEL:
        return "sigmoid"
    return "softmax"


def activated(logits: Any, task: str, activation: str) -> Any:
    """A (rows, labels) array of a head's values as `task` gives them, float32: `classify`'s
    probabilities (computed in float64: a softmax of float32 logits loses the small ones), or
    `reward`'s raw values."""
    import numpy as np

    values = np.asarray(logits, dtype=np.float64)
    if task == "classify":
        if activation == "sigmoid":
            values = 1.0 / (1.0 + np.exp(-values))
        elif activation == "softmax":
            values = np.exp(values - values.max(axis=-1, keepdims=True))
            values /= values.sum(axis=-1, keepdims=True)
    return values.astype(np.float32)
