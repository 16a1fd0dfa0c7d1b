"""The pooling tasks: embeddings, scores and reranking, classes and rewards, beside text
generation (and the likelihood tasks, which score text on a generating model:
vocabulary/likelihood.py).

A run's `task` (`RunConfig.task`) says which one it does; the model loads for it (NATIVE loads
an encoder and its pooling for `embed`, a cross-encoder for `score` and `rerank`, a
sequence-classification model for `classify` and `reward`), so one run does one task. `rerank`
is `score` with the documents sorted by their scores (and cut to `top_n`), which the fronts
do; engines answer `score`. `classify` and `reward` are answered by `embed`: an engine loaded
for either gives each input its classification head's values, with their labels
(`EmbedResult.labels`): for `classify` its labels' probabilities (the activation transformers'
text-classification pipeline applies: a softmax, or a sigmoid for one label or several that
may all hold), for `reward` the head's raw values (a reward model's score).

Vectors come back as the model gives them, its own pooling and normalisation (a
sentence-transformers `Normalize` module) applied; `normalize` adds an L2 normalisation,
`dimensions` keeps the first N values (Matryoshka), refused where the model does not say it
was trained for that. A local engine hands back float32 numpy arrays, a remote one lists of
floats: `Embedding.vector` is either, and writers take either.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, get_args

from lmpress.vocabulary.types import ErrorInfo, Usage

Task = Literal[
    "generate", "embed", "score", "rerank", "classify", "reward", "loglikelihood", "perplexity"
]
TASKS: tuple[Task, ...] = get_args(Task)
# The tasks an engine answers with `score` rather than `generate` or `embed`.
SCORING_TASKS: tuple[Task, ...] = ("score", "rerank")
# The tasks an engine answers with `embed` on a sequence-classification model: each input's
# head values, labelled.
CLASSIFYING_TASKS: tuple[Task, ...] = ("classify", "reward")
# The tasks a generating model answers by scoring text it is given (vocabulary/likelihood.py):
# the model loads as for `generate`, and nothing is generated.
LIKELIHOOD_TASKS: tuple[Task, ...] = ("loglikelihood", "perplexity")


def loads_for(task: str) -> str:
    """The task a model is loaded for to answer `task`: a likelihood task's is generate."""
    return "generate" if task in LIKELIHOOD_TASKS else task


def tasks_like(task: str) -> frozenset[str]:
    """The tasks a model loaded for `task` answers as it is: that one, and score with rerank
    (a rerank is scores sorted)."""
    return frozenset(SCORING_TASKS) if task in SCORING_TASKS else frozenset({task})


@dataclass
class EmbedRequest:
    """Texts to turn into vectors, one vector each (OpenAI's `input`: a string, or a list of
    strings or of token-id lists)."""

    id: str
    inputs: list[str] | list[list[int]]
    dimensions: int | None = None  # keep the first N values; None: all of them
    normalize: bool = False  # L2-normalise after the model's own pooling and normalisation


@dataclass
class Embedding:
    vector: Sequence[float]  # float32 numpy array (local engines) or list of floats (remote)
    prompt_tokens: int = 0  # tokens the model read for this input
    truncated: bool = False  # the input was cut at the model's limit to fit


@dataclass
class EmbedResult:
    request_id: str
    embeddings: list[Embedding]  # one per input, in order; empty when `error` is set
    usage: Usage  # prompt_tokens: all inputs together
    model: str
    engine: str
    latency_s: float = 0.0
    error: ErrorInfo | None = None
    cost_usd: float | None = None  # what the tokens cost, where the config knows a price
    cached: bool = False  # answered from the response cache (lmpress/cache/), not generated
    # classify and reward: the name of each value of a vector (the model's labels, in order)
    labels: list[str] | None = None


@dataclass
class Classification:
    """A text's classes, as `classify` gives them: the likeliest label, and each label's
    probability in the model's label order."""

    label: str
    probs: dict[str, float]

    @classmethod
    def of(cls, values: Sequence[float], labels: Sequence[str]) -> Classification:
        probs = {name: float(value) for name, value in zip(labels, values, strict=True)}
        return cls(max(probs, key=probs.__getitem__), probs)


def reward_of(values: Sequence[float]) -> float | list[float]:
    """A text's reward as `reward` gives it: the head's value, or its values where it has
    several (a reward model that scores several attributes)."""
    floats = [float(value) for value in values]
    return floats[0] if len(floats) == 1 else floats


@dataclass
class ScoreRequest:
    """A query against documents, one relevance score each: vLLM's `/v1/score` (`text_1`,
    `text_2`) and `/v1/rerank` (`query`, `documents`) bodies. `query` a list is /v1/score's
    pairwise form: `query[i]` scored with `documents[i]`, the two lists of one length."""

    id: str
    query: str | list[str]
    documents: list[str]
    top_n: int | None = None  # rerank: keep the N best; None: all

    def queries(self) -> list[str]:
        """The first text of each pair, one a document: the query repeated, or as given."""
        if isinstance(self.query, str):
            return [self.query] * len(self.documents)
        return list(self.query)

    def texts(self) -> list[str]:
        """The query (once, where it is one text) or the pairwise queries, then the documents:
        what a model that scores by its vectors' cosine embeds."""
        firsts = [self.query] if isinstance(self.query, str) else list(self.query)
        return [*firsts, *self.documents]


@dataclass
class ScoreResult:
    request_id: str
    scores: list[float] = field(default_factory=list)  # one per document, in the given order
    usage: Usage = field(default_factory=Usage)
    model: str = ""
    engine: str = ""
    latency_s: float = 0.0
    error: ErrorInfo | None = None
    cost_usd: float | None = None
    cached: bool = False  # answered from the response cache (lmpress/cache/), not generated
