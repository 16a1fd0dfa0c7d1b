"""lm-eval's model API (`lm_eval.api.model.LM`) over any lmpress engine that scores prompts.

lm-eval hands a model all of a task's requests at once and takes the answers back in order.
Its own `hf` backend pads them into fixed batches; this class submits them all to the engine
at once, bounded by the engine's `max_in_flight`, so they run in its continuous batch:

- `loglikelihood`: each (context, continuation) split into token ids as lm-eval's backends
  split it (vocabulary/likelihood.encode_pair), and the continuations of one context sent as
  one `LoglikelihoodRequest`, so an engine that reuses prefixes reads a question once for all
  of its choices;
- `loglikelihood_rolling`: a text's logprob in lm-eval's rolling windows
  (engines/scoring.perplexity);
- `generate_until`: a raw completion of the context, cut at the task's stop strings.

Each answer goes to lm-eval's cache hook as it arrives, so a run under lm-eval's response
database (`lmpress eval` keeps one beside its results) resumes where it was stopped.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

# lm-eval's own models (hf, local-completions, ...), as lazy entries: its registry fills itself
# only when empty, so registering "lmpress" into an empty one hid every other model from
# `get_model` (lm-eval's `hf` failed once lmpress's class was imported first).
import lm_eval.models  # noqa: F401
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model

from lmpress.progress import ProgressBar
from lmpress.vocabulary.errors import ConfigError, LmpressError
from lmpress.vocabulary.likelihood import LoglikelihoodRequest, encode_pair
from lmpress.vocabulary.types import GenerationParams, Request

if TYPE_CHECKING:
    from lmpress.configs.schema import RunConfig
    from lmpress.engines.base import Engine

T = TypeVar("T")
# lm-eval passes these to every model it builds from its command line; the engine's own batch
# (generation.batch_size) decides how much runs at once, and the config where it runs.
LM_EVAL_ONLY = ("batch_size", "max_batch_size", "device")


class EvalRequestError(LmpressError):
    """A request the engine failed: lm-eval has no per-request failure, so the run stops."""

    exit_code = 1


@register_model("lmpress")
class LmpressLM(LM):
    """lm-eval's model over an lmpress engine.

    Args:
        engine: an engine to use (the Python API); else one is built from `config`, else
            from `recipe` and `overrides`, and closed by `close()`. A string names the
            engine of the recipe's run (`engine=NATIVE` in lm-eval's model_args).
        config: a RunConfig.
        recipe: a recipe's name or path, as `lmpress batch -c` takes it (from lm-eval's
            model_args string: `recipe=smollm2,engine=NATIVE`, through
            `LmpressLM.create_from_arg_string`).
        max_length: the most tokens a window or a request reads (default: the model's
            context); lm-eval's `max_length`, which its `hf` backend takes too.
        overrides: dotted config keys (`model.model_name=PATH`), as `--section.key` sets them.
    """

    def __init__(
        self,
        engine: Engine | str | None = None,
        config: RunConfig | None = None,
        recipe: str | None = None,
        max_length: int | str | None = None,
        **overrides: Any,
    ) -> None:
        super().__init__()
        for name in LM_EVAL_ONLY:
            overrides.pop(name, None)
        if isinstance(engine, str):
            overrides["engine"], engine = engine, None
        self._owned = engine is None
        self.engine = engine or _build_engine(config, recipe, overrides)
        self.tokenizer = self.engine.tokenizer()
        self.max_length = int(max_length or self.tokenizer.context_length or 2048)
        self.answered = 0  # requests the engine answered (lm-eval's answers database kept the rest)
        # What an empty context and a text's first window are scored after, as in lm-eval.
        bos = self.tokenizer.bos_id
        self.prefix_id = bos if bos is not None else self.tokenizer.eos_id
        if self.prefix_id is None:
            raise ConfigError(f"model {self.engine.model_name} has neither a BOS nor an EOS token")

    def loglikelihood(self, requests: list[Any]) -> list[tuple[float, bool]]:
        """Each (context, continuation)'s summed logprob and greedy flag, in order."""
        pairs = [self._pair(*r.args) for r in requests]
        groups: dict[tuple[int, ...], list[int]] = {}
        for i, (context, _) in enumerate(pairs):
            groups.setdefault(tuple(context), []).append(i)
        answers: list[tuple[float, bool]] = [(0.0, False)] * len(requests)

        async def score(n: int, context: tuple[int, ...], members: list[int]) -> int:
            asked = LoglikelihoodRequest(f"ll-{n}", list(context), [pairs[i][1] for i in members])
            result = await self.engine.loglikelihood(asked)
            if result.error is not None:
                raise EvalRequestError(f"a log-likelihood request failed: {result.error.message}")
            for i, s in zip(members, result.scores, strict=True):
                answers[i] = (s.logprob, s.is_greedy)
                self.cache_hook.add_partial("loglikelihood", requests[i].args, answers[i])
            return len(members)

        jobs = [lambda n=n, c=c, m=m: score(n, c, m) for n, (c, m) in enumerate(groups.items())]
        self._run("loglikelihood", jobs, len(requests))
        return answers

    def loglikelihood_rolling(self, requests: list[Any]) -> list[float]:
        """Each text's whole logprob, scored in windows of `max_length` tokens."""
        from lmpress.engines.scoring import perplexity

        answers = [0.0] * len(requests)

        async def score(i: int) -> int:
            (text,) = requests[i].args
            tokens = self.tokenizer.encode(text, special=True)
            whole, result = await perplexity(
                self.engine, f"ppl-{i}", tokens, self.prefix_id, self.max_length
            )
            if whole is None:
                message = result.error.message if result.error else "no score"
                raise EvalRequestError(f"a perplexity request failed: {message}")
            answers[i] = whole.logprob
            self.cache_hook.add_partial("loglikelihood_rolling", requests[i].args, whole.logprob)
            return 1

        self._run("perplexity", [lambda i=i: score(i) for i in range(len(requests))], len(requests))
        return answers

    def generate_until(self, requests: list[Any]) -> list[str]:
        """Each context continued as raw text until one of its stop strings (or EOS)."""
        answers = [""] * len(requests)

        async def generate(i: int) -> int:
            context, settings = requests[i].args
            params = generation_params(settings)
            result = await self.engine.complete(Request(f"gen-{i}", [], params, prompt=context))
            if result.error is not None:
                raise EvalRequestError(f"a generation request failed: {result.error.message}")
            answers[i] = result.text
            self.cache_hook.add_partial("generate_until", requests[i].args, result.text)
            return 1

        jobs = [lambda i=i: generate(i) for i in range(len(requests))]
        self._run("generate", jobs, len(requests))
        return answers

    def get_model_info(self) -> dict[str, Any]:
        """What lm-eval records of the model in its results' config."""
        return {"model": self.engine.model_name, "engine": self.engine.name}

    def close(self) -> None:
        """Release the engine this model built (one it was given stays its owner's)."""
        if self._owned:
            asyncio.run(self.engine.aclose())

    def _pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """The pair's ids, the context cut from the left to fit `max_length`, as `hf` cuts it."""
        encode = lambda text: self.tokenizer.encode(text, special=True)  # noqa: E731
        context_ids, continuation_ids = encode_pair(encode, context, continuation, self.prefix_id)
        room = max(1, self.max_length + 1 - len(continuation_ids))
        return context_ids[-room:], continuation_ids

    def _run(self, label: str, jobs: list[Callable[[], Awaitable[int]]], total: int) -> None:
        """Run the jobs concurrently, `max_in_flight` at a time, with a progress bar of
        `total` requests; the first failure stops the rest."""
        if jobs:
            asyncio.run(_bounded(jobs, self.engine.max_in_flight, ProgressBar(label), total))
        self.answered += total


def generation_params(settings: dict[str, Any] | None) -> GenerationParams:
    """A generate_until request's settings (lm-eval's `generation_kwargs`) as lmpress's:
    greedy unless `do_sample`, as lm-eval's `hf` backend decodes."""
    settings = settings or {}
    until = settings.get("until") or []
    sampled = bool(settings.get("do_sample", False))
    params = GenerationParams(
        max_new_tokens=int(settings.get("max_gen_toks", 256)),
        temperature=float(settings.get("temperature", 1.0)) if sampled else 0.0,
        stop_strings=[until] if isinstance(until, str) else list(until),
    )
    if sampled and "top_p" in settings:
        params.top_p = float(settings["top_p"])
    return params


async def _bounded(
    jobs: Iterable[Callable[[], Awaitable[int]]], limit: int, bar: ProgressBar, total: int
) -> None:
    slots = asyncio.Semaphore(max(1, limit))
    done = 0

    async def one(job: Callable[[], Awaitable[int]]) -> None:
        nonlocal done
        async with slots:
            done += await job()
        bar.update(done)

    bar.start(total)
    try:
        tasks = [asyncio.ensure_future(one(job)) for job in jobs]
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        bar.stop()


def _build_engine(config: RunConfig | None, recipe: str | None, overrides: dict) -> Engine:
    from lmpress.configs import load_config
    from lmpress.engines.registry import create_engine

    if config is None:
        engine = overrides.pop("engine", None)
        config = load_config(recipe, overrides, engine=engine)
    elif recipe or overrides:
        raise ConfigError("give a config, or a recipe and overrides, not both")
    return create_engine(config)
