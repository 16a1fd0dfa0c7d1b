"""NATIVE's scheduler: continuous batching on the model's forward pass, on the worker thread.

`NativeScheduler` is built by `NativeEngine` with the loaded model and the settings it batches
by, and owns everything that changes while the worker runs (the batch's rows and caches); the
engine only hands it submissions through the shared queue (worker.py).

Every step decodes one token for each row in the batch (batch_cache.py keeps the rows' KV cache
in slots, row_attention.py attends over it in one call a layer), and sampling.py's `BatchControl` picks each row's
token by its own settings. A row that ends leaves the batch at once and its request is answered
when its last sample ends; between steps, waiting requests join while there are free rows
(`generation.batch_size`, a request with n samples counting n) and room in the KV cache's memory
budget. The prompts joining in one round are prefilled together, many in a pass
(packed_prefill.py), one with images, an adapter or prompt logprobs on its own; each starts from
the longest prefix it shares with a recent prompt. Each row runs with its own LoRA adapter, or
none (adapters.py).

A prompt scored for its own tokens' logprobs (`prompt_logprobs`) keeps its prefill's logits
from its first scored position on (prompt_logprobs.py); its prefix may come from a recent
prompt up to that position. A request that generates nothing (`max_new_tokens` 0) is answered
right after its prefill and never joins the batch: it takes no row, and up to `batch_size` of
them are prefilled between two steps, those only scored all together (scoring_prefill.py: each
distinct context once, then every scored span in one pass).

transformers' own continuous batching (`generate_batch` and its manager) was measured against
this (benchmarks/README.md); it has no per-row grammar, stop strings, seeds or penalties.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lmpress.engines.base import Engine
from lmpress.engines.local.beams import rows_of
from lmpress.engines.local.native.adapters import RowAdapters
from lmpress.engines.local.native.batch_cache import (
    BatchCache,
    PrefixStore,
    PromptCache,
    cache_argument,
    dynamic_cache,
    layer_tensors,
)
from lmpress.engines.local.native.beam_rows import BeamSearches
from lmpress.engines.local.native.drafting import Drafter
from lmpress.engines.local.native.packed_prefill import PackedPrefill, packable, packs
from lmpress.engines.local.native.prompt_logprobs import (
    PrefillPlan,
    PromptScores,
    chunk_size,
    prefill_plan,
)
from lmpress.engines.local.native.sampling import BatchControl, BatchRow, row_generator
from lmpress.engines.local.native.scoring_prefill import (
    ScoringPrefill,
    scored_prompt,
    takes_more,
)
from lmpress.engines.local.native.speculation import row_drafts, settle, verify
from lmpress.engines.local.speculation import Speculation, SpeculationCounts
from lmpress.engines.local.worker import Scheduler, Submission, WorkQueue, failure_info
from lmpress.vocabulary.types import Delta, Result, Sample

# The dummy prompt `NativeScheduler.warm` compiles the decoding step on.
WARM_PROMPT_TOKENS = 8


def reply_limit(prompt_tokens: int, params: Any, context_length: int | None) -> int:
    """max_new_tokens, or less where the model's context ends first."""
    limit = params.max_new_tokens
    if context_length:
        limit = max(0, min(limit, context_length - prompt_tokens))
    return limit


class NativeScheduler(Scheduler):
    """NATIVE's worker loop over one loaded model (see the module docstring)."""

    def __init__(
        self,
        queue: WorkQueue,
        engine: Engine,
        *,
        model: Any,
        tokenizer: Any,
        device: str,
        eos_ids: set[int],
        context_length: int | None,
        batch_size: int,
        kv_budget_tokens: int | None,
        prefix_reuse: bool,
        checkpoint_processors: Any,
        speculation: Speculation | None = None,
        decode: Any = None,
        draft_model: Any = None,
        token_text: Callable[[int], str] | None = None,
        adapters: RowAdapters | None = None,
        int8_cache: bool = False,
    ):
        super().__init__(queue, engine)
        self.model = model
        self.tokenizer = tokenizer
        self.device = device
        self.eos_ids = eos_ids
        self.context_length = context_length
        self.batch_size = batch_size  # rows in the batch, a request with n samples counting n
        self.kv_budget_tokens = kv_budget_tokens  # tokens the KV cache may hold, all rows
        self.prefix_reuse = prefix_reuse
        self.checkpoint_processors = checkpoint_processors  # the checkpoint's own ("use")
        self.speculation = speculation
        self.speculation_counts = SpeculationCounts()
        self.int8_cache = int8_cache  # model.kv_cache_dtype: int8 (int8_slots.py)
        self._batch = BatchCache(int8_cache)
        # The forward the decoding steps call: the model's own, or its compiled one
        # (loading.compiled_decode); a prompt's prefill always calls the model's own.
        self._decode = decode or model
        self.draft_model = draft_model  # speculation's draft model (drafting.py), or None
        self._drafter: Drafter | None = None
        # A scored prompt token's text, where it follows another (HfTokenizer.piece).
        self.token_text = token_text or (lambda id: tokenizer.decode([id]))
        self._chunk = chunk_size(model.config.get_text_config().vocab_size)
        self._scores: dict[Submission, PromptScores] = {}  # scored prompts not yet answered
        self._beams = BeamSearches()  # beam searches in the batch (beam_rows.py)
        self.adapters = adapters or RowAdapters(model)  # a row's LoRA adapter (adapters.py)

    def kv_cache_usage(self) -> float | None:
        """The fraction of the KV cache's budget (`model_kwargs.kv_cache_gb`) the rows take
        now; None without a budget. Read from the event loop, without a lock, while the worker
        steps: at most a step out of date."""
        if not self.kv_budget_tokens:
            return None
        return self._batch.columns() / self.kv_budget_tokens

    def run(self) -> None:
        import torch

        self._batch = BatchCache(self.int8_cache)
        self._cache_arg = cache_argument(self.model)
        if self.draft_model is not None:
            n_vocab = self.model.config.get_text_config().vocab_size
            self._drafter = Drafter(self.draft_model, self.device, self._cache_arg, n_vocab)
        self._prefixes = PrefixStore() if self.prefix_reuse else None
        self._scoring = ScoringPrefill(self.model, self._cache_arg, self.device, self._chunk)
        self._packed = PackedPrefill(self._scoring) if packs(self.model) else None
        self._active: list[BatchRow] = []  # the rows in the batch, in the order of their caches
        self._rows_of: dict[Submission, list[BatchRow]] = {}  # requests in the batch, by request
        self._scores, self._beams = {}, BeamSearches()
        queue = self.queue
        while True:
            with queue.wakeup:
                while not queue.pending and not self._active and not queue.closed:
                    queue.wakeup.wait()
                if queue.closed:
                    return
            try:  # adapters load and unload between steps, under the same lock
                with self.adapters.lock, torch.inference_mode():
                    self._admit()
                    if self._active:
                        self._step()
            except Exception as exc:  # fail the rows in flight; the worker serves on
                self.fail(list(self._rows_of), failure_info(exc))
                self._active, self._rows_of, self._scores = [], {}, {}
                self._beams = BeamSearches()
                self._batch = BatchCache(self.int8_cache)
                if self._drafter is not None:
                    self._drafter.reset()

    def _admit(self) -> None:
        """Prefill the waiting requests that fit and add their rows to the batch."""
        joining: list[tuple[BatchRow, PromptCache]] = []
        drafts: list[tuple[PromptCache, list[int]]] = []  # the joining rows' draft caches
        drafter = self._drafter
        alone = self._prefill_scored(self._take_fitting())
        packed = self._prefill_packed(alone)
        for submission, rows, plan in alone:
            request = submission.request
            replies = request.params.max_new_tokens > 0
            try:
                if submission in packed:
                    (prompt, logits), scores = packed[submission], None
                else:
                    prompt, logits, scores = self._prefill(
                        submission.prompt_ids, submission.media, plan, request.adapter
                    )
                draft = drafter.prefill(submission.prompt_ids) if drafter and replies else None
            except Exception as exc:  # this prompt, not the batch, is at fault
                self.fail([submission], failure_info(exc))
                continue
            self._rows_of[submission] = rows
            if scores is not None:
                self._scores[submission] = scores
            if not replies:
                for row in rows:
                    row.finish_reason = "length"
                self._answer_finished(rows)
                continue
            if submission in self._beams:
                self._beams.first(submission, rows, logits)
            else:
                self._pick(rows, logits.repeat(len(rows), 1))
            settle(rows, [[] for _ in rows], [[row.last] for row in rows], self.speculation_counts)
            going = [row for row in rows if row.finish_reason is None]
            joining += [(row, prompt) for row in going]
            if draft is not None:
                drafts += [(draft, [row.last]) for row in going]
            self._answer_finished(rows)
        self._active += [row for row, _ in joining]
        needs = [self._need(row.submission) for row, _ in joining]
        self._batch.join([prompt for _, prompt in joining], needs)
        if drafter is not None:
            drafter.join(drafts, needs)

    def _prefill_scored(
        self, taken: list[Submission]
    ) -> list[tuple[Submission, list[BatchRow], PrefillPlan]]:
        """Prefill and answer the taken requests that are only scored, together
        (scoring_prefill.py); the others, with their rows and plans, are left to prefill one
        by one."""
        left, together = [], []
        for submission in taken:
            request, rows = submission.request, self._rows(submission)
            plan = prefill_plan(len(submission.prompt_ids), request.params, request.score_from)
            alone = request.adapter is not None  # a packed pass runs no adapter of its own
            prompt = scored_prompt(submission, plan, self._chunk) if rows and not alone else None
            if prompt is not None:
                together.append((submission, rows, prompt))
            elif rows:
                left.append((submission, rows, plan))
        if not together:
            return left
        try:
            self._scoring.prefill([prompt for _, _, prompt in together], self._prefixes)
        except Exception as exc:  # these prompts, not the batch, are at fault
            self.fail([submission for submission, _, _ in together], failure_info(exc))
            return left
        for submission, rows, prompt in together:
            self._rows_of[submission] = rows
            self._scores[submission] = prompt.scores
            for row in rows:
                row.finish_reason = "length"
            self._answer_finished(rows)
        return left

    def _prefill_packed(
        self, taken: list[tuple[Submission, list[BatchRow], PrefillPlan]]
    ) -> dict[Submission, tuple[PromptCache, Any]]:
        """The cache and last logits of each of the taken prompts that packed_prefill.py feeds
        together, where there are several; {} if that fails, and each is prefilled alone (a
        prompt at fault fails on its own)."""
        chosen = [s for s, _, plan in taken if packable(s, plan)]
        if self._packed is None or len(chosen) < 2:
            return {}
        try:
            made = self._packed.prefill([s.prompt_ids for s in chosen], self._prefixes)
        except Exception:
            return {}
        return dict(zip(chosen, made, strict=True))

    def _take_fitting(self) -> list[Submission]:
        """The waiting requests, in order, while their rows fit the batch and the budget."""
        taken: list[Submission] = []
        rows = len(self._active)
        unbatched = 0  # requests taken that generate nothing, so never join the batch
        tokens = 0  # their prompts' tokens
        needs: list[int] = []  # the columns the rows taken may come to hold
        pending = self.queue.pending
        with self.queue.wakeup:
            while pending:
                submission = pending[0]
                if submission.cancelled:
                    pending.popleft()
                    continue
                if submission.request.params.max_new_tokens == 0:
                    tokens += len(submission.prompt_ids)
                    if unbatched >= self.batch_size and not takes_more(submission, tokens):
                        break
                    taken.append(pending.popleft())
                    unbatched += 1
                    continue
                n, need = rows_of(submission.request.params), self._need(submission)
                fits = rows + n <= self.batch_size or not rows
                budget = self.kv_budget_tokens
                if not fits or (
                    budget and rows and self._batch.columns_with(needs + n * [need]) > budget
                ):
                    break
                taken.append(pending.popleft())
                rows, needs = rows + n, needs + n * [need]
        return taken

    def _need(self, submission: Submission) -> int:
        """The cache columns a request's row may come to hold: its prompt and its reply."""
        return len(submission.prompt_ids) + self._limit(submission)

    def _limit(self, submission: Submission) -> int:
        return reply_limit(
            len(submission.prompt_ids), submission.request.params, self.context_length
        )

    def _prefill(
        self,
        ids: list[int],
        media: dict[str, Any] | None = None,
        plan: PrefillPlan | None = None,
        adapter: str | None = None,
    ) -> tuple[PromptCache | None, Any, PromptScores | None]:
        """The prompt's cache, the logits after its last token and, for a scored prompt, its
        tokens' logprobs: computed as `plan` says (the whole prompt, for its last logits, by
        default), from the longest prefix it shares with a recent prompt, in chunks where many
        positions' logits are kept. A prompt with images (`media`: the processor's pixel
        inputs) neither reuses nor leaves a prefix (its cache depends on pixels that its ids do
        not show), and is fed in one pass, its pixels with it. A prompt with an adapter runs
        with it, and shares prefixes only with prompts of the same adapter."""
        plan = plan or PrefillPlan(len(ids), len(ids) - 1)
        scores = PromptScores(ids, plan) if plan.scores else None
        if not plan.fed:  # nothing to generate, nothing to score
            return None, None, scores
        fed = ids[: plan.fed]
        store = self.adapters.prefixes(self._prefixes, adapter) if media is None else None
        stored, shared = store.longest(fed, plan.start) if store else (None, 0)
        prefix = [(k[:, :, :shared], v[:, :, :shared]) for k, v in stored.layers] if stored else []
        cache = dynamic_cache(prefix)
        size = self._chunk if media is None else plan.fed
        for first, end, keep in plan.chunks(shared, size):
            with self.adapters.rows([adapter]):
                logits = self._prefill_pass(
                    fed, first, end, keep, cache, media if first == shared else None
                )
            if scores is not None:
                scores.add(logits[0], max(first, plan.start))
        prompt = PromptCache(fed, layer_tensors(cache))
        if store is not None:
            store.add(prompt)
        return prompt, logits[:, -1], scores

    def _prefill_pass(
        self, ids: list[int], first: int, end: int, keep: int, cache: Any, media: Any
    ) -> Any:
        """Feed ids[first:end] after the `first` tokens in `cache` (which grows by them), and
        return the last `keep` positions' logits."""
        import torch

        out = self.model(
            input_ids=torch.tensor([ids[first:end]], device=self.device),
            attention_mask=torch.ones((1, end), dtype=torch.long, device=self.device),
            position_ids=torch.arange(first, end, device=self.device)[None],
            use_cache=True,
            logits_to_keep=keep,
            **{self._cache_arg: cache},
            **self._on_device(media or {}),
        )
        return out.logits

    def _on_device(self, media: dict[str, Any]) -> dict[str, Any]:
        """Image inputs on the model's device, pixels in its dtype."""
        dtype = self.model.dtype
        return {
            k: v.to(self.device, dtype=dtype if v.is_floating_point() else v.dtype)
            if hasattr(v, "is_floating_point")
            else v
            for k, v in media.items()
        }

    def _step(self) -> None:
        """One token for every row in the batch, or more for a row whose drafts the model
        verifies; the rows that end leave it."""
        rows = self._active
        # A beam's row moves slots, which a verified draft cannot follow.
        drafts = [[] for _ in rows] if self._beams else row_drafts(rows, self._drafter)
        with self.adapters.rows([row.submission.request.adapter for row in rows]):
            logits = self._forward([[row.last, *d] for row, d in zip(rows, drafts, strict=True)])
        if logits.shape[1] == 1:
            moves = self._pick_or_search(rows, logits[:, -1])
            emitted = [[row.last] for row in rows]
        else:
            moves = []
            emitted = verify(rows, drafts, logits, self._pick)
        self._batch.keep([len(e) for e in emitted])
        if moves:  # after the step's own column is kept: it moves with its beam
            self._batch.reorder(moves)
        kept = settle(rows, drafts, emitted, self.speculation_counts)
        if self._drafter is not None:
            self._drafter.settle(drafts, kept, emitted)
        ended = [b for b, row in enumerate(self._active) if row.finish_reason is not None]
        if ended:
            self._answer_finished(self._active)
            self._active = [self._active[b] for b in self._batch.leave(ended)]
            if self._drafter is not None:
                self._drafter.leave(ended)

    def _forward(self, ids: list[list[int]]) -> Any:
        """The logits of a step's new tokens (`ids`: each row's): BatchCache.forward, on the
        compiled step where there is one."""
        return self._batch.forward(self.model, ids, self._cache_arg, self.device, self._decode)

    def warm(self) -> None:
        """Compile the decoding step now (`model.compile`), so that its cost counts as the
        engine's load rather than its first requests': a step on a short dummy prompt, at two
        rows in more slots, a token a row and, with speculation, two."""
        import torch

        self._cache_arg = cache_argument(self.model)
        self._prefixes = None
        widths = (1, 2) if self.speculation else (1,)
        with torch.inference_mode():
            prompt, _, _ = self._prefill([0] * WARM_PROMPT_TOKENS)
            self._batch = BatchCache(self.int8_cache)
            self._batch.join([prompt] * 3, [2 * WARM_PROMPT_TOKENS] * 3)
            self._batch.leave([2])
            for width in widths:
                self._forward([[0] * width] * 2)
        self._batch = BatchCache(self.int8_cache)

    def _pick_or_search(self, rows: list[BatchRow], logits: Any) -> list[tuple[int, int]]:
        """`_pick` for the rows that sample, a beam search's step for each group's; returns
        the (slot, slot it now continues) of each beam whose row took another's place."""
        if not self._beams:
            self._pick(rows, logits)
            return []
        plain = [b for b, row in enumerate(rows) if row.submission not in self._beams]
        if plain:
            self._pick([rows[b] for b in plain], logits[plain])
        return self._beams.step(rows, logits, self._rows_of)

    def _pick(self, rows: list[BatchRow], logits: Any) -> None:
        control = BatchControl(rows, self.tokenizer, self.eos_ids, self.checkpoint_processors)
        chosen = control.choose(logits)
        control.advance(chosen)
        for row, token in zip(rows, chosen.tolist(), strict=True):
            row.last = token

    def _answer_finished(self, rows: list[BatchRow]) -> None:
        """Answer each request of these rows whose samples have all ended."""
        for submission in dict.fromkeys(row.submission for row in rows):
            own = self._rows_of[submission]
            if all(row.finish_reason is not None for row in own):
                del self._rows_of[submission]
                submission.deliver(self._result(submission, own))
                self._scores.pop(submission, None)

    def _rows(self, submission: Submission) -> list[BatchRow]:
        """A request's rows, one per sample; none when its settings fail (it is answered)."""
        params = submission.request.params
        beams = params.num_beams > 1
        gone = self.adapters.missing(submission.request)  # unloaded since it was checked
        if gone is not None:
            self.fail([submission], gone)
            return []
        try:
            count = rows_of(params)
            rows = [BatchRow(submission, i, row_generator(params.seed, i)) for i in range(count)]
            for row in rows:
                row.limit = self._limit(submission)
                row.logprobs = [] if params.logprobs else None
                if submission.matcher is not None:
                    row.matcher = submission.matcher.copy()
                if submission.reasoning is not None:
                    row.budget = submission.reasoning.budget()
            # Sibling samples and the checkpoint's own processors (which read the whole
            # history at every pick) decode a token a step.
            if self.speculation and params.n == 1 and not beams and not self.checkpoint_processors:
                rows[0].drafts = self.speculation.row(submission.prompt_ids)
            if beams:
                self._beams.start(submission, rows, self._limit(submission), self.eos_ids)
            return rows
        except Exception as exc:  # this request's settings, not the batch, are at fault
            self.fail([submission], failure_info(exc))
            return []

    def _result(self, submission: Submission, rows: list[BatchRow]) -> Result:
        samples = []
        beams = submission.request.params.num_beams > 1
        if beams:
            rows = rows[: submission.request.params.n]  # the best n of the beams
        for row in rows:
            row.finish(self.tokenizer)
            if beams and row.text and submission.wants_deltas:  # a beam's text, whole at its end
                submission.deliver(Delta(submission.request.id, row.text, row.index))
            samples.append(
                Sample(
                    text=row.text,
                    finish_reason=row.finish_reason or "length",
                    logprobs=row.logprobs,
                    completion_tokens=row.generated,
                    reasoning_tokens=row.budget.spent if row.budget is not None else 0,
                    stop_sequence=row.stop_sequence,
                )
            )
        result = self.result(submission, samples)
        result.prompt_ids = submission.prompt_ids
        scores = self._scores.get(submission)
        if scores is not None:
            result.prompt_logprobs = scores.result(self.token_text)
        return result
