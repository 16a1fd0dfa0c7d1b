"""The Python front: `LLM`, one model on one engine, for scripts and notebooks.

    from lmpress import LLM

    with LLM("smollm2", temperature=0.2) as llm:
        print(llm.generate(["Why is the sky blue?"])[0].text)

    with LLM("minilm", task="embed") as llm:
        vectors = llm.embed(["a cat", "a kitten"])  # a float32 array, one row per text

    with LLM("tiny:classifier", task="classify") as llm:  # a sequence classifier
        print(llm.classify(["I loved it."])[0].label)

    with LLM("smollm2") as llm:  # a generating model scores text it is given
        scores = llm.loglikelihood("The capital of France is", [" Paris", " Rome"])
        ppl = llm.perplexity(["The cat sat on the mat."])

    with LLM("smollm2", adapters={"terse": "loras/terse"}) as llm:  # LoRA adapters by name
        replies = llm.generate(["Hi", "Hi"], adapter=["terse", None])  # None: the base model

It is the same path the commands take (a RunConfig, `create_engine`, the batch runner), so a
script gets what `lmpress infer` and `lmpress batch` give: the same recipes and checks, and
`batch` with resume, one writer per output and failed rows set aside.
"""

from __future__ import annotations

import asyncio
import atexit
import dataclasses
import weakref
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from lmpress.configs.loading import bundled_recipes, load_config
from lmpress.configs.overrides import dotted_key, generation_with_overrides
from lmpress.configs.schema import RunConfig
from lmpress.engines.adapters import adapter_for
from lmpress.vocabulary.embeddings import Classification, reward_of
from lmpress.vocabulary.errors import ConfigError, RequestError
from lmpress.vocabulary.likelihood import ContinuationScore, Perplexity, choice_pairs
from lmpress.vocabulary.types import Delta, GenerationParams, Message, Request, Result

# Texts per EmbedRequest that `LLM.embed` sends: the engine sorts the rows of every request
# waiting by length, so many small requests in flight batch as well as one big one.
EMBED_CHUNK = 256
# Engines whose owner forgot to close them; closed at interpreter exit, before the worker
# threads they hold are torn down under a running backend.
_open: weakref.WeakSet[LLM] = weakref.WeakSet()


class LLM:
    """A model on an engine, loaded on first use and closed by `close` or a `with` block.

    Args:
        model: a bundled recipe's name or a recipe file (`"smollm2"`, `"recipe.yaml"`), else
            a model name as `--model.model_name` takes it (a directory, a `.gguf` file, a
            packaged or tiny name, a hub id).
        engine: the engine (NATIVE, LLAMACPP, VLLM, OPENAI, ...); the recipe's otherwise.
        **settings: any config field by its own name (`temperature=0.2`,
            `max_new_tokens=64`, `api_url=...`) or its dotted key as a dict
            (`**{"remote_params.num_workers": 8}`), as checked as on the command line.
    """

    def __init__(self, model: str | None = None, *, engine: str | None = None, **settings: Any):
        recipe = model if model and _is_recipe(model) else None
        overrides = {dotted_key(key, "LLM()"): value for key, value in settings.items()}
        if model and recipe is None:
            overrides["model.model_name"] = model
        from lmpress.engines.registry import check_engine

        self.config: RunConfig = load_config(recipe, overrides, engine)
        check_engine(self.config)  # a typo fails here, not at the first call
        self._engine = None

    @property
    def engine(self):
        """The engine, created on first use (a model loads here, not in the constructor)."""
        if self._engine is None:
            from lmpress.engines.registry import create_engine

            self._engine = create_engine(self.config)
            _open.add(self)
        return self._engine

    def generate(
        self,
        prompts: str | Iterable[str],
        *,
        adapter: str | Sequence[str | None] | None = None,
        progress: bool = False,
        **settings: Any,
    ) -> list[Result]:
        """Complete each prompt (chat turns, the model's template applied), in order.

        Args:
            prompts: one prompt or many.
            adapter: the LoRA adapter (a name in `adapters=`) every prompt runs on, or one a
                prompt; None: the base model. Prompts on different adapters batch together.
            progress: draw a progress bar.
            **settings: generation settings for these prompts only (`temperature=0.7`).

        Returns:
            One Result per prompt: `.text`, `.samples` (with n > 1), `.usage`, `.error`;
            `.model` names the adapter that answered.

        Raises:
            ValueError: an adapter this model does not have, or a list of another length.
        """
        items = [prompts] if isinstance(prompts, str) else list(prompts)
        return self._generate(items, self._params(settings), adapter, progress)

    def chat(
        self,
        messages: Sequence[dict[str, Any]] | Sequence[Sequence[dict[str, Any]]],
        *,
        adapter: str | Sequence[str | None] | None = None,
        **settings: Any,
    ) -> Result | list[Result]:
        """The assistant's reply to one conversation, or the replies to many.

        Args:
            messages: one conversation (a list of OpenAI-style messages: `role`, `content`,
                and `tool_calls` where the engine takes tools), or a list of conversations.
            adapter: the LoRA adapter to reply with, for all or one a conversation (as
                `generate` takes it).
            **settings: generation settings for this call only.

        Returns:
            One Result for one conversation, else one Result per conversation, in order.
        """
        many = bool(messages) and not isinstance(messages[0], dict)
        conversations = list(messages) if many else [messages]
        results = self._generate(conversations, self._params(settings), adapter)
        return results if many else results[0]

    def _generate(
        self, items: list[Any], params: GenerationParams, adapter: Any, progress: bool = False
    ) -> list[Result]:
        """Each prompt or conversation on its adapter; a reply from one is named for it."""
        chosen = self._adapters(adapter, len(items))
        if not any(chosen):
            return self.engine.generate(items, params, progress=progress)
        requests = [
            Request(str(i), _messages(item), params, adapter=name)
            for i, (item, name) in enumerate(zip(items, chosen, strict=True))
        ]
        results = self.engine.generate(requests, progress=progress)
        for result, name in zip(results, chosen, strict=True):
            result.model = name or result.model
        return results

    def _adapters(self, adapter: Any, count: int) -> list[str | None]:
        """The adapter of each of `count` prompts: `adapter` for all, or one each."""
        names = [adapter] * count if adapter is None or isinstance(adapter, str) else list(adapter)
        if len(names) != count:
            raise ValueError(f"{len(names)} adapters for {count} prompts: give one, or one each")
        try:
            return [adapter_for(self.config, name, strict=True) for name in names]
        except RequestError as exc:  # an adapter is named on purpose: a typo is refused
            raise ValueError(f"adapter: {exc}") from None

    def stream(
        self, prompt: str | Sequence[dict[str, Any]], *, adapter: str | None = None, **settings: Any
    ) -> Iterator[str]:
        """The reply to one prompt or conversation as it is generated, a piece of text at a time.

        Args:
            prompt: a prompt, or one conversation as a list of OpenAI-style messages.
            adapter: the LoRA adapter to reply with (a name in `adapters=`); None: the base.
            **settings: generation settings for this call only.

        Yields:
            Pieces of the reply's text. Stopping early (a `break`, closing the iterator) cancels
            the request in the engine.

        Raises:
            RuntimeError: the request failed; the message is the engine's.
        """
        (chosen,) = self._adapters(adapter, 1)
        request = Request("stream", _messages(prompt), self._params(settings), adapter=chosen)
        loop = asyncio.new_event_loop()
        pieces = self.engine.stream(request)
        try:
            while True:
                try:
                    item = loop.run_until_complete(pieces.__anext__())
                except StopAsyncIteration:
                    return
                if isinstance(item, Delta) and item.index == 0:
                    yield item.text
                elif isinstance(item, Result) and item.error is not None:
                    raise RuntimeError(item.error.message)
        finally:
            loop.run_until_complete(pieces.aclose())  # a consumer that stops early cancels
            loop.close()

    def embed(
        self, texts: str | Iterable[str], *, dimensions: int | None = None, normalize: bool = False
    ) -> Any:
        """The texts as vectors, on a model loaded with `task="embed"`.

        Args:
            texts: one text or many.
            dimensions: keep each vector's first N values, where the model was trained for it
                (Matryoshka); refused otherwise.
            normalize: scale each vector to unit length (after the model's own pooling and
                normalisation, and after `dimensions`).

        Returns:
            A float32 numpy array, one row per text, in order.

        Raises:
            RuntimeError: a text failed; the message is the engine's.
        """
        return asyncio.run(self._vectors(self._chunks("embed", texts, dimensions, normalize)))

    def _chunks(self, task: str, texts: str | Iterable[str], *settings: Any) -> list[Any]:
        """The texts as EmbedRequests of EMBED_CHUNK, for a model loaded for `task` (an engine
        loaded for another answers embed with other values: a classifier's probabilities)."""
        from lmpress.vocabulary.embeddings import EmbedRequest

        # An engine loaded to classify or reward answers embed with its head's values: those
        # are no vectors, and one task's values are not the other's.
        loaded = self.config.task
        if loaded != task and (task != "embed" or loaded in ("classify", "reward")):
            raise ConfigError(f'LLM.{task}(): loaded for task {loaded}; load it with task="{task}"')
        items = [texts] if isinstance(texts, str) else list(texts)
        return [
            EmbedRequest(str(i), items[start : start + EMBED_CHUNK], *settings)
            for i, start in enumerate(range(0, len(items), EMBED_CHUNK))
        ]

    async def _vectors(self, requests: list[Any]) -> Any:
        """Every request's vectors as one array. Stacked here, inside the coroutine: at its end
        `asyncio.run` formats the repr of its main task, result included (the SIGINT handler
        it restores holds the task), and a list of results would print every vector: seconds
        a call at 10,000 texts."""
        import numpy as np

        results = await self._all(self.engine.embed, requests)
        for result in results:
            if result.error is not None:
                raise RuntimeError(result.error.message)
        vectors = [np.asarray(e.vector, dtype=np.float32) for r in results for e in r.embeddings]
        return np.stack(vectors) if vectors else np.zeros((0, 0), dtype=np.float32)

    def classify(self, texts: str | Iterable[str]) -> list[Classification]:
        """Each text's classes, on a sequence-classification model loaded with
        `task="classify"`.

        Returns:
            One `Classification` per text, in order: `label`, the likeliest, and `probs`, each
            label's probability (a softmax over the labels; a sigmoid each where the model has
            one label or its labels may all hold, as transformers' pipeline applies them).

        Raises:
            RuntimeError: a text failed; the message is the engine's.
        """
        return [Classification.of(v, labels) for v, labels in self._headed("classify", texts)]

    def reward(self, texts: str | Iterable[str]) -> list[float] | list[list[float]]:
        """Each text's reward, on a reward model (a sequence-classification head, often one
        value on a decoder's last token) loaded with `task="reward"`: the head's raw value,
        or its values where it has several. A conversation is scored as the model reads one:
        render it with the model's chat template first.

        Raises:
            RuntimeError: a text failed; the message is the engine's.
        """
        return [reward_of(v) for v, _ in self._headed("reward", texts)]  # type: ignore[misc]

    def _headed(self, task: str, texts: str | Iterable[str]) -> list[tuple[Any, list[str]]]:
        """Each text's head values, with their labels."""
        results = asyncio.run(self._all(self.engine.embed, self._chunks(task, texts)))
        headed = []
        for result in results:
            if result.error is not None:
                raise RuntimeError(result.error.message)
            labels = result.labels or []
            headed += [(embedding.vector, labels) for embedding in result.embeddings]
        return headed

    def score(self, query: str | Sequence[str], documents: Sequence[str]) -> list[float]:
        """How relevant each document is to the query, on a model loaded with `task="score"`
        (or `"rerank"`): a cross-encoder's logit, or an embedding model's cosine similarity.

        Args:
            query: the query; or one query a document, scored pairwise (as vLLM's `LLM.score`
                takes two lists of one length).
            documents: the documents to score against it.

        Returns:
            One score per document, in order (higher is more relevant).

        Raises:
            ValueError: `query` is a list of another length than `documents`.
            RuntimeError: the request failed; the message is the engine's.
        """
        from lmpress.vocabulary.embeddings import ScoreRequest

        queries = query if isinstance(query, str) else list(query)
        if isinstance(queries, list) and len(queries) != len(documents):
            raise ValueError(
                f"{len(queries)} queries for {len(documents)} documents: give one query, or "
                f"one a document to score them pairwise"
            )
        request = ScoreRequest("score", queries, list(documents))
        result = asyncio.run(self.engine.score(request))
        if result.error is not None:
            raise RuntimeError(result.error.message)
        return result.scores

    def loglikelihood(
        self,
        context: str | Sequence[tuple[str, str]],
        continuations: str | Sequence[str] | None = None,
    ) -> list[ContinuationScore]:
        """How likely the model finds each continuation after the context: the multiple-choice
        scoring of lm-eval's `loglikelihood`, on the same tokens (vocabulary/likelihood.py).

        Args:
            context: the text before; or a list of (context, continuation) pairs, with no
                `continuations`.
            continuations: the texts that may follow, each as written after the context (a
                new word carries its leading space: `" Paris"`).

        Returns:
            One ContinuationScore per continuation (or pair), in order: `.logprob` (summed
            over its tokens), `.is_greedy` (each token the model's likeliest), `.tokens`.
            The likeliest choice is `max(range(len(s)), key=lambda i: s[i].logprob)`.

        Raises:
            ValueError: pairs and `continuations` both given, or neither.
            RuntimeError: a continuation could not be scored; the message is the engine's.
        """
        from lmpress.vocabulary.likelihood import ChoicesRequest

        pairs = choice_pairs(context, continuations)
        groups: dict[str, list[int]] = {}  # choices of one context go in one request
        for i, (before, _) in enumerate(pairs):
            groups.setdefault(before, []).append(i)
        requests = [
            ChoicesRequest(str(n), before, [pairs[i][1] for i in members])
            for n, (before, members) in enumerate(groups.items())
        ]
        results = self._scored(self._score_choices, requests)
        scores: list[Any] = [None] * len(pairs)
        for members, result in zip(groups.values(), results, strict=True):
            for i, score in zip(members, result.scores, strict=True):
                scores[i] = score
        return scores

    def score_text(self, texts: str | Iterable[str]) -> list[Perplexity]:
        """Each text's log-likelihood as a whole, every token scored once, in windows of the
        model's context where it is longer (lm-eval's `loglikelihood_rolling`).

        Args:
            texts: one text or many.

        Returns:
            One Perplexity per text, in order: `.logprob` (summed), `.tokens`, `.perplexity`.

        Raises:
            RuntimeError: a text could not be scored; the message is the engine's.
        """
        from lmpress.vocabulary.likelihood import PerplexityRequest

        items = [texts] if isinstance(texts, str) else list(texts)
        requests = [PerplexityRequest(str(i), text) for i, text in enumerate(items)]
        results = self._scored(self._score_text, requests)
        return [Perplexity(r.logprob, r.tokens) for r in results]

    def perplexity(self, texts: str | Iterable[str]) -> list[float]:
        """Each text's perplexity: exp of its tokens' mean negative logprob (`score_text`).

        Args:
            texts: one text or many.

        Returns:
            One perplexity per text, in order (lower: the model finds it likelier).
        """
        return [score.perplexity for score in self.score_text(texts)]

    def _scored(self, call: Any, requests: list[Any]) -> list[Any]:
        results = asyncio.run(self._all(call, requests))
        for result in results:
            if result.error is not None:
                raise RuntimeError(result.error.message)
        return results

    async def _score_choices(self, request: Any) -> Any:
        from lmpress.engines.scoring import score_choices

        return await score_choices(self.engine, request)

    async def _score_text(self, request: Any) -> Any:
        from lmpress.engines.scoring import score_text

        return await score_text(self.engine, request)

    async def _all(self, call: Any, requests: list[Any]) -> list[Any]:
        """`call` on every request, up to the engine's max_in_flight at once, in order."""
        slots = asyncio.Semaphore(self.engine.max_in_flight)

        async def one(request: Any) -> Any:
            async with slots:
                return await call(request)

        return await asyncio.gather(*(one(request) for request in requests))

    def batch(self, input_path: str, output_path: str, **options: Any):
        """Run every row of a file as `lmpress batch -i input_path -o output_path` does:
        resumable, one job per output, failed rows set aside in OUTPUT.errors.jsonl.

        Args:
            input_path: a JSONL, Parquet or CSV file, or a dataset, as `-i` takes it.
            output_path: the JSONL or Parquet file to write, as `-o` takes it.
            **options: BatchOptions fields (`overwrite=True`, `ordered=True`, `limit=10`).

        Returns:
            The BatchSummary: rows_ok, rows_failed, rows_skipped, tokens, wall_s.
        """
        from lmpress.batch import BatchOptions, run_batch

        batch_options = BatchOptions(input_path, output_path, **options)
        return asyncio.run(run_batch(self.config, batch_options, engine=self.engine))

    def close(self) -> None:
        """Release the engine (a later call loads it again)."""
        engine, self._engine = self._engine, None
        _open.discard(self)
        if engine is not None:
            asyncio.run(engine.aclose())

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _params(self, settings: dict[str, Any]) -> GenerationParams:
        return generation_with_overrides(self.config.generation, settings, "LLM()")


def _messages(item: str | Sequence[Any]) -> list[Message]:
    """A prompt as one user turn, or a conversation's OpenAI-style messages, read."""
    from lmpress.data.messages import parse_messages

    return [Message("user", item)] if isinstance(item, str) else parse_messages(list(item))


@dataclasses.dataclass
class Compared:
    """`compare`'s answer: each model's replies, in prompt order, and the --compare report."""

    replies: dict[str, list[Result]]
    report: str  # markdown: agreement, length and refusal rates per model


def compare(prompts: str | Iterable[str], models: Sequence[str], **settings: Any) -> Compared:
    """Every prompt through every model, one model loaded at a time, and the report that
    `lmpress batch --models ... --compare` writes.

    Args:
        prompts: one prompt or many.
        models: recipes or model names, as `LLM` takes them.
        **settings: config fields for every model, as `LLM` takes them (`max_new_tokens=32`).
    """
    from lmpress.batch.compare import compare as comparison

    items = [prompts] if isinstance(prompts, str) else list(prompts)
    if len(set(models)) != len(models):
        raise ConfigError("compare(): name each model once")
    replies: dict[str, list[Result]] = {}
    for model in models:
        with LLM(model, **settings) as llm:
            replies[model] = llm.generate(items)
    rows = (
        (model, str(i), {"response": {"text": r.text, "finish_reason": r.finish_reason}})
        for model, results in replies.items()
        for i, r in enumerate(results)
        if r.error is None
    )
    return Compared(replies, comparison(list(models), rows).markdown())


def _is_recipe(name: str) -> bool:
    return name in bundled_recipes() or name.endswith((".yaml", ".yml"))


@atexit.register
def _close_forgotten() -> None:
    for llm in list(_open):
        try:
            llm.close()
        except Exception:  # exiting anyway: a backend that fails to close must not say so
            pass
