"""The dry run's tally: every row read, its prompt counted as the engine will count it, nothing
generated. `lmpress batch --dry-run` feeds it each row as the batch runner reads it (the parsed
row and its request, or why the row cannot run) and prints its summary (`cli/report.py`).

What the summary says, and why it is shaped so:
- rows, bad rows (by kind) and duplicate ids, which a real run refuses before starting;
- rows whose prompt does not fit the context: the engine fails them (context_length_exceeded),
  so their tokens are not in the totals, as they would not be in the run's usage;
- prompt tokens, exact where the counter is the engine's own tokenizer (`Engine.prompt_counter`);
- the output-token bound: per row `max_new_tokens` times `n`, where a local engine stops at
  the end of the context the room left there, so the bound is one the run cannot exceed; a
  reasoning model's thinking is inside it (`max_new_tokens` counts thinking and answer
  together, as the providers' limits do, and `max_reasoning_tokens` only divides it), and
  is priced as output, as the providers bill it;
- the cost at the model's price (`batch/pricing.py`), live and through the provider's batch API: the
  prompt tokens plus the output bound, so an upper bound on output;
- the prompt tokens the provider is expected to read from its prompt cache, and to write to it
  (`Engine.prompt_cache_tally`: rows after the first that share a system prompt and tools long
  enough to cache, with Anthropic only under `remote_params.prompt_cache: auto`), priced at
  their own prices: an estimate, since a provider's cache is best-effort and, for a job run
  concurrently, rows sent together may each pay the full price.
Memory stays flat: a row costs its 8-byte id key (`IdKeys`), whatever the input's size.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from lmpress.batch.pricing import Price, price_for
from lmpress.configs.schema import RunConfig
from lmpress.data.idkeys import IdKeys
from lmpress.data.resume import id_key
from lmpress.data.row_shapes import ParsedRow
from lmpress.dryrun.prompt_tokens import prompt_cache_tally, prompt_counter
from lmpress.engines.prompt_count import PromptCounter
from lmpress.vocabulary.embeddings import EmbedRequest
from lmpress.vocabulary.errors import ErrorKind, RequestError
from lmpress.vocabulary.likelihood import ChoicesRequest, PerplexityRequest
from lmpress.vocabulary.types import GenerationParams, Request

if TYPE_CHECKING:
    from lmpress.cache.responses import ResponseCache


class RowFailed(Protocol):
    """Why a row cannot run, as the batch runner reads it (`lmpress.batch.RowFailure`)."""

    line: int
    kind: ErrorKind
    message: str


@dataclass
class DryRunSummary:
    rows: int = 0
    bad_rows: int = 0
    duplicates: int = 0  # rows whose id an earlier row already has
    over_context: int = 0
    prompt_tokens: int = 0  # of the rows that would run
    prompt_tokens_exact: bool = True
    # Of prompt_tokens, those expected to be read from and written to the provider's cache.
    cached_tokens: int = 0
    cache_creation_tokens: int = 0
    output_token_bound: int | None = 0  # None: some row has no bound (no max_new_tokens)
    context: int | None = None  # the tokens a prompt must stay under, where known
    tokenizer: str = ""
    price: Price | None = None
    cost_live: float | None = None  # None: no price, or no output bound
    cost_batch: float | None = None  # None as well where the provider has no batch API
    bad_kinds: dict[str, int] = field(default_factory=dict)
    longest_prompt: int = 0
    # Rows the response cache would answer: neither counted in the tokens nor priced above.
    cache_hits: int = 0

    @property
    def rows_to_run(self) -> int:
        return self.rows - self.bad_rows - self.over_context - self.cache_hits

    def as_dict(self) -> dict[str, Any]:
        price = self.price
        return {
            "rows": self.rows,
            "bad_rows": self.bad_rows,
            "bad_kinds": dict(self.bad_kinds),
            "duplicates": self.duplicates,
            "over_context": self.over_context,
            "rows_to_run": self.rows_to_run,
            "cache_hits": self.cache_hits,
            "prompt_tokens": self.prompt_tokens,
            "prompt_tokens_exact": self.prompt_tokens_exact,
            "cached_tokens": self.cached_tokens,
            "cache_creation_tokens": self.cache_creation_tokens,
            "longest_prompt": self.longest_prompt,
            "output_token_bound": self.output_token_bound,
            "context": self.context,
            "tokenizer": self.tokenizer,
            "price": None
            if price is None
            else {
                "input_per_million": price.input_per_million,
                "output_per_million": price.output_per_million,
                "batch_discount": price.batch_discount,
                "cached_input_per_million": price.cached_input_per_million,
                "cache_write_per_million": price.cache_write_per_million,
                "source": price.source,
            },
            "cost_live": self.cost_live,
            "cost_batch": self.cost_batch,
        }


class DryRun:
    """Tallies rows as they are read. `counter` defaults to the config's engine's own
    (loading its tokenizer, not its weights)."""

    def __init__(
        self,
        config: RunConfig,
        counter: PromptCounter | None = None,
        cache: ResponseCache | None = None,
    ):
        self.counter = counter or prompt_counter(config)
        self.cache = cache  # rows it would answer cost nothing
        self.price = price_for(config)
        self.prompt_cache = prompt_cache_tally(config)  # the provider's, not the response cache
        self._ids = IdKeys()
        self._summary = DryRunSummary(
            prompt_tokens_exact=self.counter.exact,
            context=self.counter.context,
            tokenizer=self.counter.tokenizer_label,
            price=self.price,
        )

    def add(self, rid: str, read: tuple[ParsedRow, Any] | RowFailed) -> None:
        """One row: its id, and its parsed row and request, or why it cannot run."""
        tally = self._summary
        tally.rows += 1
        self._ids.add(id_key(rid))
        if not isinstance(read, tuple):
            self._bad(read.kind)
            return
        _, request = read
        if self.cache is not None and self.cache.would_hit(request):
            tally.cache_hits += 1
            return
        if not isinstance(request, Request):
            self._add_pooled(request)
            return
        try:
            tokens = self.counter.count(request)
        except RequestError as exc:  # the engine would refuse it before generating
            self._bad(exc.kind)
            return
        context = self.counter.context
        if context and tokens >= context:
            tally.over_context += 1
            return
        tally.prompt_tokens += tokens
        tally.longest_prompt = max(tally.longest_prompt, tokens)
        self.prompt_cache.add(request, tokens)
        bound = output_bound(request, tokens, context)
        if bound is None or tally.output_token_bound is None:
            tally.output_token_bound = None
        else:
            tally.output_token_bound += bound

    def _add_pooled(self, request: Any) -> None:
        """An embed, score, rerank, loglikelihood or perplexity row: each text counted as a
        raw prompt (no chat template), a query once per document it is scored against, a
        context once per continuation; nothing is generated."""
        if isinstance(request, EmbedRequest):
            texts: list[str | list[int]] = list(request.inputs)
        elif isinstance(request, ChoicesRequest):
            texts = [request.context + text for text in request.continuations]
        elif isinstance(request, PerplexityRequest):
            texts = [request.text]
        else:
            pairs = zip(request.queries(), request.documents, strict=True)
            texts = [text for pair in pairs for text in pair]
        tokens = 0
        for text in texts:
            if isinstance(text, list):
                tokens += len(text)
                continue
            try:
                tokens += self.counter.count(
                    Request(request.id, [], GenerationParams(), prompt=text)
                )
            except RequestError as exc:
                self._bad(exc.kind)
                return
        self._summary.prompt_tokens += tokens
        self._summary.longest_prompt = max(self._summary.longest_prompt, tokens)

    def _bad(self, kind: ErrorKind) -> None:
        name = ErrorKind(kind).value  # written as a plain string in the dry run's JSON
        self._summary.bad_rows += 1
        self._summary.bad_kinds[name] = self._summary.bad_kinds.get(name, 0) + 1

    def summary(self) -> DryRunSummary:
        """The tally so far, priced; more rows may be added after."""
        tally = dataclasses.replace(
            self._summary,
            bad_kinds=dict(self._summary.bad_kinds),
            duplicates=self._ids.repeats(),
            cached_tokens=self.prompt_cache.cached_tokens,
            cache_creation_tokens=self.prompt_cache.cache_creation_tokens,
        )
        price, bound = self.price, tally.output_token_bound
        if price is not None and bound is not None:
            cache = {"cached_tokens": tally.cached_tokens,
                     "cache_creation_tokens": tally.cache_creation_tokens}  # fmt: skip
            tally.cost_live = price.cost(tally.prompt_tokens, bound, **cache)
            if price.has_batch:
                tally.cost_batch = price.cost(tally.prompt_tokens, bound, batch=True, **cache)
        return tally


def output_bound(request: Request, prompt_tokens: int, context: int | None) -> int | None:
    """The most tokens a request can generate: `max_new_tokens` for each of its `n` samples,
    or the room the context leaves, whichever is less. None: neither bounds it."""
    room = context - prompt_tokens if context else None
    limit = request.params.max_new_tokens
    if limit is None:
        per_sample = room
    else:
        per_sample = limit if room is None else min(limit, room)
    return None if per_sample is None else per_sample * request.params.n
