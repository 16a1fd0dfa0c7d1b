"""LLAMACPP's pooling tasks: embeddings (`embed`), and rank pooling for rerankers (`score`) and
classifiers (`classify`, `reward`).

With `task: embed` (or `score`, `rerank`, `classify`, `reward`) the engine loads the GGUF for
llama.cpp's embedding mode (`embedding=True`) with the pooling type the GGUF declares
(`{arch}.pooling_type`; `model.model_kwargs.pooling_type` overrides it, as llama-cpp-python
names it), and hands its context to a `PoolingScheduler` instead of the generation
scheduler. An encoder reads each input whole, in one micro-batch, so the context is made with
`n_batch` and `n_ubatch` equal to the longest input it takes (`limit`: the model's trained
context unless `n_ctx` says less); a longer input is cut there, keeping the end token its
tokenization added, as sentence-transformers cuts it, and its `Embedding.truncated` says so.

The worker packs whatever inputs are waiting, of every request, into one `llama_batch`, each
input its own sequence, until the batch is full (`limit` tokens or `n_seq_max` sequences),
decodes it, and reads each sequence's pooled vector with `llama_get_embeddings_seq`, which
the engine L2-normalises where the GGUF says the model ends in a Normalize module (the
converter's `lmpress.pooling.normalize`, builtin_models/bert_gguf.py). Rank
pooling gives the classifier head's values instead of a vector, as many as the GGUF has labels
(`llama_model_n_cls_out`): a reranker's one, its score for a query/document pair, formatted as
llama-server formats a rerank pair (`rerank_tokens`); a classifier's, each input tokenized as
`embed` tokenizes it ([CLS] text [SEP] for BERT) and the values made its labels' probabilities
or kept as rewards (`Head`, vocabulary/classifier.py), by the `problem_type` the converter
records (`lmpress.classifier.problem_type`, builtin_models/bert_gguf.py). Only BERT's family
ends its rank pooling in the head's own values (llama.cpp refuses a LLaMA GGUF with a head, and
softmaxes a Qwen3 one's itself, which leaves no raw values for `reward`), so `classify` and
`reward` take a GGUF of that family (`HEADED_ARCHITECTURES`) and refuse any other before its
weights load.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from lmpress.builtin_models.bert_gguf import NORMALIZE_KEY, PROBLEM_TYPE_KEY
from lmpress.engines.base import Engine
from lmpress.engines.local.llamacpp.loading import load_vocab, trained_context
from lmpress.engines.local.worker import CallerQueue, Scheduler, WorkQueue
from lmpress.vocabulary.classifier import activated, activation_of, labels_of
from lmpress.vocabulary.embeddings import (
    CLASSIFYING_TASKS,
    SCORING_TASKS,
    Embedding,
    EmbedRequest,
    EmbedResult,
    ScoreRequest,
    ScoreResult,
)
from lmpress.vocabulary.errors import ConfigError, ErrorKind, RequestError, exception_line
from lmpress.vocabulary.types import ErrorInfo, Usage

# llama.cpp's pooling types, by the names `model_kwargs.pooling_type` messages use.
POOLING_NAMES = {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}
RANK = 4
# The architectures whose rank pooling gives the classifier head's values as they are (the
# pooler and `cls.output` over the [CLS] token, with no activation of llama.cpp's own), as
# `general.architecture` names them.
HEADED_ARCHITECTURES = ("bert", "modern-bert", "neo-bert")


@dataclass(eq=False)  # compared and hashed by identity
class PooledSubmission:
    """One embed or score request on its way to the worker: each of its inputs as token ids,
    and the vectors (or scores) the worker has read so far."""

    request: EmbedRequest | ScoreRequest
    inputs: list[list[int]]
    truncated: list[bool]
    started: float
    replies: CallerQueue | None = None
    cancelled: bool = False
    answered: bool = False
    outputs: dict[int, Any] = field(default_factory=dict)

    def deliver(self, item: EmbedResult | ScoreResult) -> None:
        if self.answered:
            return
        self.answered = True
        if not self.replies.put(item):
            self.cancelled = True


def check_pooling(pooling: int, task: str, path: str, n_cls_out: int = 1) -> None:
    """Refuse, before any work, a model whose pooling does not give what the task needs
    (`n_cls_out`: the values its head gives under rank pooling)."""
    name = POOLING_NAMES.get(pooling, str(pooling))
    if task in SCORING_TASKS and pooling != RANK:
        raise ConfigError(
            f"task: {task} needs a reranker GGUF (rank pooling); '{path}' pools with {name}. "
            f"Use a reranker model, or task: embed"
        )
    if task in SCORING_TASKS and n_cls_out != 1:
        raise ConfigError(
            f"task: {task}: '{path}' is a classifier with {n_cls_out} labels; a reranker for "
            f"scoring has one. Use task: classify"
        )
    if task in CLASSIFYING_TASKS and pooling != RANK:
        raise ConfigError(
            f"task: {task} needs a classifier GGUF (rank pooling, the head as cls.output); "
            f"'{path}' pools with {name}. Convert a …ForSequenceClassification model, or use "
            f"task: embed"
        )
    if task == "embed" and pooling in (0, RANK):
        raise ConfigError(
            f"task: embed needs one vector per input; '{path}' pools with {name}. Set "
            f"model.model_kwargs.pooling_type (1 mean, 2 cls, 3 last), or use task: "
            f"{'classify' if n_cls_out > 1 else 'rerank'}"
        )


def check_architecture(task: str, metadata: dict[str, str], path: str) -> None:
    """Refuse, before the weights load, a classifier of an architecture whose head llama.cpp
    does not hand back as it is."""
    arch = metadata.get("general.architecture", "unknown")
    if task in CLASSIFYING_TASKS and arch not in HEADED_ARCHITECTURES:
        raise ConfigError(
            f"task: {task}: LLAMACPP reads a classification head only from a BERT-family GGUF "
            f"({', '.join(HEADED_ARCHITECTURES)}); '{path}' is {arch}; use NATIVE or VLLM for it"
        )


def rerank_tokens(vocab: Any, lc: Any, query: list[int], document: list[int]) -> list[int]:
    """A query/document pair as llama-server formats it for rerank: the vocabulary's
    beginning, end and separator tokens where it adds them (the end token falls back to the
    separator), around the two texts tokenized without their own specials."""
    eos = lc.llama_vocab_eos(vocab)
    if eos == lc.LLAMA_TOKEN_NULL:
        eos = lc.llama_vocab_sep(vocab)
    add_eos = lc.llama_vocab_get_add_eos(vocab)
    tokens = [lc.llama_vocab_bos(vocab)] if lc.llama_vocab_get_add_bos(vocab) else []
    tokens += query + ([eos] if add_eos else [])
    tokens += [lc.llama_vocab_sep(vocab)] if lc.llama_vocab_get_add_sep(vocab) else []
    return tokens + document + ([eos] if add_eos else [])


def pooling_kwargs(kwargs: dict[str, Any], path: str, task: str) -> None:
    """`Llama`'s keywords for embedding mode, with batches that take a whole input: `n_batch`
    and `n_ubatch` as large as the context (`n_ctx`, 0: the trained one) unless the recipe
    says otherwise; a model that cannot do `task` refused first."""
    metadata = load_vocab(path).metadata()
    check_architecture(task, metadata, path)
    kwargs["embedding"] = True
    context = kwargs["n_ctx"] or trained_context(metadata) or 512
    kwargs.setdefault("n_batch", context)
    kwargs.setdefault("n_ubatch", kwargs["n_batch"])


def pooled_width(lc: Any, ctx: Any) -> int:
    """The floats llama.cpp gives a sequence: its classifier's outputs under rank pooling (a
    reranker's one, its score), else the model's vector."""
    model = lc.llama_get_model(ctx)
    if lc.llama_pooling_type(ctx) == RANK:
        return lc.llama_model_n_cls_out(model)
    return lc.llama_model_n_embd(model)


@dataclass(frozen=True)
class Head:
    """A classifier's head as a GGUF gives it: its labels (`{arch}.classifier.output_labels`,
    else transformers' `LABEL_i`), and what `task` makes of its values: `activation`, by the
    `problem_type` lmpress's converter records (PROBLEM_TYPE_KEY); a GGUF without one, as
    llama.cpp's own converter writes it, gets a softmax over several labels, a sigmoid for one."""

    task: str
    labels: list[str]
    activation: str

    @classmethod
    def of(cls, lc: Any, model: Any, task: str, problem_type: str | None) -> Head:
        count = lc.llama_model_n_cls_out(model)
        names = {}
        for i in range(count):
            if label := lc.llama_model_cls_label(model, i):  # bytes, or None where unnamed
                names[i] = label.decode("utf-8", "replace")
        return cls(task, labels_of(names, count), activation_of(count, problem_type))

    def finish(self, result: EmbedResult) -> EmbedResult:
        """The result's values as the task gives them, labelled."""
        result.labels = self.labels
        if result.error is None and result.embeddings:
            values = activated([e.vector for e in result.embeddings], self.task, self.activation)
            for embedding, row in zip(result.embeddings, values, strict=True):
                embedding.vector = row
        return result


class PoolingInputs:
    """How an embed or score request becomes the token ids of its sequences, on a model
    loaded for `task`: checked and cut to the longest input one batch takes."""

    def __init__(self, llama: Any, path: str, task: str):
        import llama_cpp as lc

        self._lc, self._llama = lc, llama
        ctx, model = llama._ctx.ctx, llama._model.model
        pooling = lc.llama_pooling_type(ctx)
        check_pooling(pooling, task, path, lc.llama_model_n_cls_out(model))
        trained = llama._model.n_ctx_train() or lc.llama_n_ctx(ctx)
        self.limit = min(lc.llama_n_batch(ctx), lc.llama_n_ubatch(ctx), trained)
        self.n_seq = lc.llama_n_seq_max(ctx)
        self.width = pooled_width(lc, ctx)
        self.head = None
        if task in CLASSIFYING_TASKS:
            self.head = Head.of(lc, model, task, llama.metadata.get(PROBLEM_TYPE_KEY))
        # The model's Normalize module, which llama.cpp does not apply: lmpress's GGUF key.
        self.normalize = llama.metadata.get(NORMALIZE_KEY) == "true"
        self.n_vocab = llama.n_vocab()
        self._vocab = vocab = lc.llama_model_get_vocab(llama._model.model)
        # The token tokenization ends a text with ([SEP] for BERT), kept when a text is cut.
        self._end = (
            lc.llama_vocab_sep(vocab) if lc.llama_vocab_get_add_sep(vocab)
            else lc.llama_vocab_eos(vocab) if lc.llama_vocab_get_add_eos(vocab)
            else None
        )  # fmt: skip

    def embed_submission(self, request: EmbedRequest, started: float) -> PooledSubmission:
        if request.dimensions not in (None, self.width):
            raise RequestError(
                f"dimensions: {request.dimensions}: a GGUF does not say that its model was "
                f"trained for shortened (Matryoshka) vectors; leave dimensions unset for all "
                f"{self.width}",
                kind=ErrorKind.INVALID_REQUEST,
            )
        sequences = []
        for index, item in enumerate(request.inputs):
            if isinstance(item, str):
                sequences.append(self._cut(self._tokenize(item, add_special=True), self._end))
            else:
                sequences.append(self._cut(self._checked_ids(item, index), None))
        return self._submission(request, sequences, started)

    def score_submission(self, request: ScoreRequest, started: float) -> PooledSubmission:
        tokens = {q: self._tokenize(q, add_special=False) for q in set(request.queries())}
        sequences = [
            self._cut(
                rerank_tokens(self._vocab, self._lc, tokens[query], self._tokenize(document)),
                None,
            )
            for query, document in zip(request.queries(), request.documents, strict=True)
        ]
        return self._submission(request, sequences, started)

    def _submission(
        self,
        request: EmbedRequest | ScoreRequest,
        sequences: list[tuple[list[int], bool]],
        started: float,
    ) -> PooledSubmission:
        if any(not ids for ids, _ in sequences):
            raise RequestError(
                "an input is empty and the model adds no token of its own to it; give it text",
                kind=ErrorKind.INVALID_REQUEST,
            )
        inputs, truncated = [ids for ids, _ in sequences], [cut for _, cut in sequences]
        return PooledSubmission(request, inputs, truncated, started)

    def _cut(self, ids: list[int], end: int | None) -> tuple[list[int], bool]:
        """The ids cut to `limit` where they are longer, keeping `end` where they end with it
        (the end token a text's tokenization added: Hugging Face tokenizers, and
        sentence-transformers with them, cut a text so); whether they were cut."""
        if len(ids) <= self.limit:
            return ids, False
        if end is not None and ids[-1] == end:
            return [*ids[: self.limit - 1], end], True
        return ids[: self.limit], True

    def _checked_ids(self, ids: list[int], index: int) -> list[int]:
        bad = [token for token in ids if not 0 <= token < self.n_vocab]
        if bad:
            raise RequestError(
                f"input {index}: token {bad[0]} is not a token id of this model "
                f"(0 to {self.n_vocab - 1})",
                kind=ErrorKind.INVALID_REQUEST,
            )
        return list(ids)

    def _tokenize(self, text: str, *, add_special: bool = False) -> list[int]:
        """`text`'s ids, with the vocabulary's own begin/end tokens when `add_special` (as
        llama-cpp-python's `embed` tokenizes); special-token text is read as text."""
        return self._llama.tokenize(text.encode("utf-8"), add_bos=add_special, special=False)


class PoolingScheduler(Scheduler):
    """Packs waiting inputs into batches and reads back their pooled outputs (see above)."""

    def __init__(self, queue: WorkQueue, engine: Engine, *, ctx: Any, limit: int, n_seq: int):
        super().__init__(queue, engine)
        import llama_cpp

        self._lc = llama_cpp
        self._ctx = ctx  # the llama_context pointer
        self.limit, self.n_seq = limit, n_seq
        self._width = pooled_width(llama_cpp, ctx)
        self._batch = llama_cpp.llama_batch_init(limit, 0, n_seq)
        self._memory = llama_cpp.llama_get_memory(ctx)
        self._waiting: deque[tuple[PooledSubmission, int]] = deque()  # (submission, input)

    def close(self) -> None:
        self._lc.llama_batch_free(self._batch)

    def run(self) -> None:
        queue = self.queue
        while True:
            with queue.wakeup:
                while not (queue.pending or self._waiting or queue.closed):
                    queue.wakeup.wait()
                if queue.closed:
                    break
                while queue.pending:
                    submission = queue.pending.popleft()
                    self._waiting.extend((submission, i) for i in range(len(submission.inputs)))
                self._drop_cancelled()
            if self._waiting:
                self._step()
        with queue.wakeup:
            waiting = list(queue.pending)
            queue.pending.clear()
        held = list(dict.fromkeys(submission for submission, _ in self._waiting))
        self._waiting.clear()
        closed = ErrorInfo(ErrorKind.ENGINE_CLOSED, f"the {self.engine.name} engine was closed")
        self.fail(held + waiting, closed)

    def _drop_cancelled(self) -> None:
        if any(submission.cancelled for submission, _ in self._waiting):
            self._waiting = deque(item for item in self._waiting if not item[0].cancelled)

    def _step(self) -> None:
        """Decode as many waiting inputs as fit one batch, and answer the requests whose last
        input that was."""
        taken: list[tuple[PooledSubmission, int]] = []
        n_tokens = 0
        while self._waiting and len(taken) < self.n_seq:
            submission, index = self._waiting[0]
            ids = submission.inputs[index]
            if taken and n_tokens + len(ids) > self.limit:
                break
            self._waiting.popleft()
            for pos, token in enumerate(ids):
                self._put(n_tokens + pos, token, pos, len(taken))
            n_tokens += len(ids)
            taken.append((submission, index))
        try:
            self._decode(n_tokens)
            for seq, (submission, index) in enumerate(taken):
                submission.outputs[index] = self._pooled(seq)
        except Exception as exc:  # this batch's requests fail; the worker serves on
            failed = list(dict.fromkeys(submission for submission, _ in taken))
            self._waiting = deque(item for item in self._waiting if item[0] not in failed)
            self.fail(failed, ErrorInfo(ErrorKind.GENERATION_ERROR, exception_line(exc)))
            return
        for submission in dict.fromkeys(submission for submission, _ in taken):
            if len(submission.outputs) == len(submission.inputs):
                submission.deliver(self._answer(submission))

    def _put(self, i: int, token: int, pos: int, seq: int) -> None:
        batch = self._batch
        batch.token[i] = token
        batch.pos[i] = pos
        batch.n_seq_id[i] = 1
        batch.seq_id[i][0] = seq
        batch.logits[i] = True  # embedding mode reads every token's output

    def _decode(self, n_tokens: int) -> None:
        self._lc.llama_memory_clear(self._memory, True)
        self._batch.n_tokens = n_tokens
        code = self._lc.llama_decode(self._ctx, self._batch)
        if code != 0:
            raise RuntimeError(f"llama_decode returned {code}")

    def _pooled(self, seq: int) -> Any:
        import numpy as np

        pointer = self._lc.llama_get_embeddings_seq(self._ctx, seq)
        if not pointer:
            raise RuntimeError(f"llama.cpp gave no pooled output for sequence {seq}")
        return np.ctypeslib.as_array(pointer, shape=(self._width,)).astype(np.float32)

    def _answer(self, submission: PooledSubmission) -> EmbedResult | ScoreResult:
        request = submission.request
        outputs = [submission.outputs[i] for i in range(len(submission.inputs))]
        usage = Usage(sum(len(ids) for ids in submission.inputs), 0)
        latency = time.perf_counter() - submission.started
        engine, model = self.engine.name, self.engine.model_name
        if isinstance(request, ScoreRequest):
            scores = [float(output[0]) for output in outputs]
            return ScoreResult(request.id, scores, usage, model, engine, latency)
        embeddings = [
            Embedding(vector, len(ids), truncated)
            for vector, ids, truncated in zip(
                outputs, submission.inputs, submission.truncated, strict=True
            )
        ]
        return EmbedResult(request.id, embeddings, usage, model, engine, latency)

    def fail(self, submissions: list[Any], info: ErrorInfo) -> None:
        for submission in submissions:
            submission.deliver(error_answer(submission, self.engine, info))


def error_answer(
    submission: PooledSubmission, engine: Engine, info: ErrorInfo
) -> EmbedResult | ScoreResult:
    request = submission.request
    latency = time.perf_counter() - submission.started
    if isinstance(request, ScoreRequest):
        return ScoreResult(request.id, [], Usage(), engine.model_name, engine.name, latency, info)
    return EmbedResult(request.id, [], Usage(), engine.model_name, engine.name, latency, info)
