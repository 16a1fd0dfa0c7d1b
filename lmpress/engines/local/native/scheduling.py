"""The worker thread of NATIVE: batches of requests through `model.generate`.

The worker takes whatever requests are waiting (up to `generation.batch_size` rows, a request
with n samples counting n), left-pads their prompts into one batch and runs `model.generate`
on it with sampling.py's `BatchControl`, so each row keeps its own settings; each request is
answered as soon as its batch ends. A batch runs to its longest row; the next one waits.
"""

from __future__ import annotations

import time
from typing import Any

from lmpress.engines.local.native.sampling import BatchControl, Row, row_generator
from lmpress.engines.local.worker import Submission, WorkerEngine, failure_info
from lmpress.types import Result, Sample, Usage

# How long the worker waits for more requests to fill a batch once one has arrived. Callers
# submit a batch's worth within microseconds, so a few milliseconds catches them all.
GATHER_WINDOW_S = 0.005


class NativeScheduler(WorkerEngine):
    """The worker side of NativeEngine, which loads what is declared here before it starts
    the worker."""

    model: Any
    tokenizer: Any
    device: str
    eos_ids: set[int]
    context_length: int | None
    n_vocab: int
    batch_size: int

    def _run(self) -> None:
        while True:
            with self._wakeup:
                while not self._pending and not self._closed:
                    self._wakeup.wait()
                if self._closed:
                    return
            deadline = time.monotonic() + GATHER_WINDOW_S
            while self._pending_rows() < self.batch_size and time.monotonic() < deadline:
                time.sleep(0.0005)
            batch = self._take_batch()
            if not batch:
                continue
            try:
                self._generate(batch)
            except Exception as exc:  # one bad batch must not take the worker down
                self._fail(batch, failure_info(exc))

    def _pending_rows(self) -> int:
        return sum(s.request.params.n for s in list(self._pending))

    def _take_batch(self) -> list[Submission]:
        batch: list[Submission] = []
        rows = 0
        with self._wakeup:
            while self._pending:
                state = self._pending[0]
                if state.cancelled:
                    self._pending.popleft()
                    continue
                n = state.request.params.n
                if batch and rows + n > self.batch_size:
                    break
                batch.append(self._pending.popleft())
                rows += n
        return batch

    def _generate(self, states: list[Submission]) -> None:
        rows = [row for state in states for row in self._rows(state)]
        states = list(dict.fromkeys(row.state for row in rows))
        if not rows:
            return
        import torch

        for row in rows:
            # A row stops at the end of the model's context, as it would at max_new_tokens.
            room = self.context_length - len(row.state.prompt_ids) if self.context_length else None
            row.limit = min(row.params.max_new_tokens, room) if room else row.params.max_new_tokens
        width = max(len(row.state.prompt_ids) for row in rows)
        pad_id = self.tokenizer.pad_token_id
        input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
        attention = torch.zeros((len(rows), width), dtype=torch.long)
        for b, row in enumerate(rows):
            ids = row.state.prompt_ids
            input_ids[b, width - len(ids) :] = torch.tensor(ids)
            attention[b, width - len(ids) :] = 1
        control = BatchControl(rows, self.tokenizer, self.eos_ids, self.device, self.n_vocab)
        with torch.inference_mode():
            self.model.generate(
                input_ids=input_ids.to(self.device),
                attention_mask=attention.to(self.device),
                generation_config=self._generation_config(rows),
                logits_processor=[control],
                stopping_criteria=[control.stopper],
            )
        for state in states:
            own = [row for row in rows if row.state is state]
            state.deliver(self._result(state, own))

    def _rows(self, state: Submission) -> list[Row]:
        """A request's rows, one per sample; none when its settings fail (it is answered)."""
        params = state.request.params
        try:
            rows = [Row(state, i, row_generator(params.seed, i)) for i in range(params.n)]
            if state.matcher is not None:
                for row in rows:
                    row.matcher = state.matcher.copy()
            return rows
        except Exception as exc:  # this request's settings, not the batch, are at fault
            self._fail([state], failure_info(exc))
            return []

    def _generation_config(self, rows: list[Row]) -> Any:
        from transformers import GenerationConfig

        return GenerationConfig(
            max_new_tokens=max(row.limit for row in rows),
            do_sample=False,  # _BatchControl does the sampling, row by row
            num_beams=1,
            # _BatchControl applies each row's own penalty; the checkpoint's must not add one.
            repetition_penalty=1.0,
            pad_token_id=self.tokenizer.pad_token_id,
            eos_token_id=sorted(self.eos_ids),
        )

    def _result(self, state: Submission, rows: list[Row]) -> Result:
        samples = []
        for row in rows:
            row.finish(self.tokenizer)
            samples.append(
                Sample(
                    text=row.text,
                    finish_reason=row.finish_reason or "length",
                    logprobs=row.logprobs,
                    completion_tokens=row.generated,
                )
            )
        return Result(
            request_id=state.request.id,
            samples=samples,
            usage=Usage(len(state.prompt_ids), sum(row.generated for row in rows)),
            model=self.model_name,
            engine=self.name,
            latency_s=time.perf_counter() - state.started,
        )
