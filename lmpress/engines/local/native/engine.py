"""NATIVE: Hugging Face transformers + PyTorch, on CPU or CUDA.

A worker thread takes whatever requests are waiting (up to `generation.batch_size` sequences),
left-pads them into one batch and runs `model.generate` on it. One `_BatchControl` object
plugs into generate as a logits processor and a stopping criterion, so each row keeps its own
sampling settings and seed, stop strings, max_new_tokens, streaming and cancellation.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lmpress.configs.schema import ModelParams, RunConfig
from lmpress.engines.base import check_token_settings
from lmpress.engines.common.models import DTYPE_CHOICES, dtype_name, local_or_hub
from lmpress.engines.common.prompts import render_chat_prompt, resolve_chat_template
from lmpress.engines.local.worker import Submission, WorkerEngine, failure_info
from lmpress.errors import ModelLoadError, RequestError, first_line
from lmpress.types import (
    Delta,
    Request,
    Result,
    Sample,
    TokenLogprob,
    Usage,
)

# How long the worker waits for more requests to fill a batch once one has arrived. Callers
# submit a batch's worth within microseconds, so a few milliseconds catches them all.
GATHER_WINDOW_S = 0.005


class NativeEngine(WorkerEngine):
    name = "NATIVE"
    supported_params = frozenset({
        "max_new_tokens", "temperature", "top_p", "top_k", "min_p", "repetition_penalty",
        "presence_penalty", "frequency_penalty", "stop_strings", "stop_token_ids", "min_tokens",
        "seed", "n", "logprobs", "top_logprobs", "skip_special_tokens",
    })  # fmt: skip
    uses_generation_defaults = True

    def __init__(self, config: RunConfig):
        super().__init__(config)
        import torch
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()  # its progress bars and hints would bury our output
        hf_logging.disable_progress_bar()
        self._torch = torch
        self.device, self.dtype = pick_device_and_dtype(config.model, torch)
        self.tokenizer = load_tokenizer(config.model)
        self.model = load_model(config.model, self.device, self.dtype)
        self.model_defaults = checkpoint_defaults(self.model, config.model.generation_defaults)
        self.eos_ids = _eos_ids(self.model, self.tokenizer)
        self.context_length = _context_length(self.model, self.tokenizer)
        if config.model.model_max_length:  # Oumi's cap on the sequence length, prompt included
            self.context_length = min(
                self.context_length or config.model.model_max_length,
                config.model.model_max_length,
            )
        self.n_vocab = self.model.config.get_text_config().vocab_size  # the logits' width
        self.batch_size = config.generation.batch_size
        # Two batches' worth: one decoding, the next one waiting so the worker never idles.
        self.max_in_flight = 2 * self.batch_size
        self._start_worker("lmpress-native")

    async def aclose(self) -> None:
        await self._stop_worker()

    def _prepare(self, request: Request, started: float) -> Submission:
        if self.model_defaults:
            request = dataclasses.replace(
                request, params=request.params.with_defaults(self.model_defaults)
            )
        check_token_settings(request.params, self.n_vocab)
        return Submission(request, self.encode(request), started)

    def encode(self, request: Request) -> list[int]:
        """The prompt's token ids: the chat template applied, or the raw prompt."""
        if request.prompt is not None:
            ids = self.tokenizer(request.prompt)["input_ids"]
        else:
            text = render_chat_prompt(
                self.tokenizer,
                request,
                self.name,
                self.model_name,
                template_kwargs=self.config.model.chat_template_kwargs,
            )
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if self.context_length and len(ids) >= self.context_length:
            raise RequestError(
                f"prompt is {len(ids)} tokens, the model's context is {self.context_length}",
                kind="context_length_exceeded",
            )
        return list(ids)

    # --- the worker thread -----------------------------------------------------------------

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
        torch = self._torch
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
        control = _BatchControl(self, rows)
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

    def _rows(self, state: Submission) -> list[_Row]:
        """A request's rows, one per sample; none when its settings fail (it is answered)."""
        params = state.request.params
        try:
            return [
                _Row(state, i, _row_generator(params.seed, i, self._torch)) for i in range(params.n)
            ]
        except Exception as exc:  # this request's settings, not the batch, are at fault
            self._fail([state], failure_info(exc))
            return []

    def _generation_config(self, rows: list[_Row]) -> Any:
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

    def _result(self, state: Submission, rows: list[_Row]) -> Result:
        samples = []
        for row in rows:
            row.finish(self)
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


# --- per-request and per-row state ---------------------------------------------------------


@dataclass
class _Row:
    """One sequence in a batch: one sample of one request."""

    state: Submission
    index: int
    generator: Any
    tokens: list[int] = field(default_factory=list)  # generated, EOS and stop ids left out
    generated: int = 0  # tokens generated, EOS included
    limit: int = 0  # max_new_tokens, or less where the model's context ends first
    finish_reason: str | None = None
    text: str = ""
    emitted: int = 0  # characters already sent as deltas
    logprobs: list[TokenLogprob] | None = None

    @property
    def params(self):
        return self.state.request.params

    @property
    def needs_text(self) -> bool:
        return self.state.wants_deltas or bool(self.params.stop_strings)

    def finish(self, engine: NativeEngine) -> None:
        if self.finish_reason != "stop" or not self.params.stop_strings:
            self.text = engine.tokenizer.decode(
                self.tokens, skip_special_tokens=self.params.skip_special_tokens
            )
        if self.finish_reason is None:
            self.finish_reason = "length"


def _row_generator(seed: int | None, index: int, torch: Any) -> Any:
    """Each row draws from its own generator, so a seeded row samples the same tokens
    whatever else shares its batch."""
    if seed is None:
        seed = random.SystemRandom().randrange(2**62)
    return torch.Generator().manual_seed(seed + index)


class _BatchControl:
    """Per-row sampling (as a logits processor) and per-row stopping (as `stopper`)."""

    def __init__(self, engine: NativeEngine, rows: list[_Row]):
        torch = engine._torch
        self.engine = engine
        self.torch = torch
        self.rows = rows
        self.stopper = _Stopper(self)
        params = [row.params for row in rows]
        device = engine.device
        self.sampled = [b for b, p in enumerate(params) if p.sampling_temperature() > 0]
        self.penalised = any(
            p.repetition_penalty != 1 or p.presence_penalty or p.frequency_penalty for p in params
        )
        self.min_tokens = any(p.min_tokens for p in params)
        self.want_logprobs = any(p.logprobs for p in params)
        self.plain = not (self.sampled or self.penalised or self.min_tokens or self.want_logprobs)
        self.counts = None  # generated-token counts per row, for presence/frequency penalties
        if self.penalised:
            vocab = engine.model.config.get_text_config().vocab_size
            self.counts = torch.zeros((len(rows), vocab), device=device)
        for row in rows:
            if row.params.logprobs:
                row.logprobs = []
        self.stop_ids = [set(engine.eos_ids) | set(p.stop_token_ids) for p in params]

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        if self.plain:
            return scores
        torch = self.torch
        scores = scores.float()
        rows = self.rows
        if self.penalised:
            scores = self._penalise(scores)
        if self.min_tokens:
            for b, row in enumerate(rows):
                if row.generated < row.params.min_tokens:
                    scores[b, list(self.stop_ids[b])] = float("-inf")
        chosen = scores.argmax(dim=-1)
        if self.sampled:
            idx = torch.tensor(self.sampled, device=scores.device)
            chosen[idx] = self._sample(scores[idx], [rows[b] for b in self.sampled])
        if self.want_logprobs:
            self._record_logprobs(scores, chosen)
        forced = torch.full_like(scores, float("-inf"))
        forced.scatter_(1, chosen[:, None], 0.0)
        return forced

    def _penalise(self, scores: Any) -> Any:
        torch = self.torch
        for b, row in enumerate(self.rows):
            p = row.params
            if p.repetition_penalty != 1:
                seen = torch.tensor(
                    sorted(set(row.state.prompt_ids) | set(row.tokens)), device=scores.device
                )
                picked = scores[b, seen]
                scores[b, seen] = torch.where(
                    picked < 0, picked * p.repetition_penalty, picked / p.repetition_penalty
                )
            if p.presence_penalty or p.frequency_penalty:
                counts = self.counts[b, : scores.shape[1]]
                scores[b] -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0)
        return scores

    def _sample(self, scores: Any, rows: list[_Row]) -> Any:
        torch = self.torch
        device = scores.device
        temperature = torch.tensor([r.params.sampling_temperature() for r in rows], device=device)
        top_p = torch.tensor([r.params.top_p for r in rows], device=device)
        min_p = torch.tensor([r.params.min_p for r in rows], device=device)
        vocab = scores.shape[1]
        top_k = torch.tensor([r.params.top_k or vocab for r in rows], device=device)
        logits, order = (scores / temperature[:, None]).sort(dim=-1, descending=True)
        probs = logits.softmax(dim=-1)
        position = torch.arange(vocab, device=device)[None, :]
        drop = position >= top_k[:, None]
        drop |= (probs.cumsum(dim=-1) - probs) > top_p[:, None]
        drop |= probs < min_p[:, None] * probs[:, :1]
        drop[:, 0] = False  # the most likely token always stays
        probs = probs.masked_fill(drop, 0.0)
        cdf = probs.cumsum(dim=-1)
        draws = torch.cat([torch.rand(1, generator=r.generator) for r in rows]).to(device)
        picked = torch.searchsorted(cdf, (draws * cdf[:, -1])[:, None]).clamp(max=vocab - 1)
        return order.gather(1, picked).squeeze(1)

    def _record_logprobs(self, scores: Any, chosen: Any) -> None:
        decode = self.engine.tokenizer.decode
        logprobs = scores.log_softmax(dim=-1)
        for b, row in enumerate(self.rows):
            if row.logprobs is None or row.finish_reason is not None:
                continue
            token = int(chosen[b])
            top = []
            if row.params.top_logprobs:
                values, ids = logprobs[b].topk(row.params.top_logprobs)
                top = [(decode([int(i)]), float(v)) for v, i in zip(values, ids, strict=True)]
            row.logprobs.append(TokenLogprob(decode([token]), float(logprobs[b, token]), top))


class _Stopper:
    """Called by generate after every step with the new tokens appended."""

    def __init__(self, control: _BatchControl):
        self.control = control

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        control = self.control
        torch = control.torch
        done = []
        new_tokens = input_ids[:, -1].tolist()
        for b, row in enumerate(control.rows):
            if row.finish_reason is None:
                self._advance(b, row, new_tokens[b])
            done.append(row.finish_reason is not None)
        return torch.tensor(done, device=input_ids.device)

    def _advance(self, b: int, row: _Row, token: int) -> None:
        control = self.control
        row.generated += 1
        if control.counts is not None:
            control.counts[b, token] += 1
        if token in control.stop_ids[b]:
            row.finish_reason = "stop"
        else:
            row.tokens.append(token)
            if row.generated >= row.limit:
                row.finish_reason = "length"
        if row.state.cancelled:
            row.finish_reason = "cancelled"
            return
        if row.needs_text:
            self._update_text(row)

    def _update_text(self, row: _Row) -> None:
        params = row.params
        text = self.control.engine.tokenizer.decode(
            row.tokens, skip_special_tokens=params.skip_special_tokens
        )
        holdback = 0
        if params.stop_strings:
            hits = [i for i in (text.find(s) for s in params.stop_strings) if i >= 0]
            if hits:
                text = text[: min(hits)]
                row.finish_reason = "stop"
            else:
                holdback = max(len(s) for s in params.stop_strings) - 1
        row.text = text
        if not row.state.wants_deltas:
            return
        if row.finish_reason is None:
            # Hold back a half-formed character and anything that may begin a stop string.
            end = len(text.rstrip("\ufffd")) - holdback
        else:
            end = len(text)
        if end > row.emitted:
            row.state.deliver(Delta(row.state.request.id, text[row.emitted : end], row.index))
            row.emitted = end


# --- loading ---------------------------------------------------------------------------------


def pick_device_and_dtype(model: ModelParams, torch: Any) -> tuple[str, Any]:
    device = model.device_map
    if device in (None, "auto"):
        device = "cuda" if torch.cuda.is_available() else "cpu"
    name = model.torch_dtype_str
    if name == "auto":
        if device.startswith("cuda"):
            return device, torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return device, torch.float32
    dtype = getattr(torch, dtype_name(name), None)
    if not isinstance(dtype, torch.dtype):
        raise ModelLoadError(f"model.torch_dtype_str: unknown dtype '{name}' (use {DTYPE_CHOICES})")
    return device, dtype


def model_source(model: ModelParams) -> tuple[str, str | None]:
    """Where transformers loads the model from: a directory or hub id, and the GGUF file in it
    when the model is one. A `.gguf` path (or a packaged or tiny GGUF name) names the file
    itself; Oumi's form names a hub repo or directory in `model_name` and the file in
    `model_kwargs.filename`. transformers dequantizes GGUF weights as it loads them."""
    name = local_or_hub(model.model_name, "model.model_name")
    filename = model.model_kwargs.get("filename")
    if filename is not None:
        if not isinstance(filename, str) or not filename.endswith(".gguf"):
            raise ModelLoadError(
                f"model.model_kwargs.filename: '{filename}' is not a .gguf file name; the NATIVE "
                f"engine reads it as the GGUF file inside model.model_name"
            )
        return name, filename
    path = Path(name)
    if path.suffix == ".gguf" and path.is_file():
        return str(path.parent), path.name
    return name, None


def load_tokenizer(model: ModelParams) -> Any:
    from transformers import AutoTokenizer

    kwargs = dict(model.tokenizer_kwargs)
    if model.tokenizer_name:
        name = local_or_hub(model.tokenizer_name, "model.tokenizer_name")
    else:
        name, gguf_file = model_source(model)
        if gguf_file:
            kwargs["gguf_file"] = gguf_file
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            name,
            trust_remote_code=model.trust_remote_code,
            revision=model.model_revision,
            **kwargs,
        )
    except Exception as exc:
        raise ModelLoadError(f"cannot load the tokenizer of '{name}': {first_line(exc)}") from exc
    if model.tokenizer_pad_token:
        tokenizer.pad_token = model.tokenizer_pad_token
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
    if model.chat_template:
        tokenizer.chat_template = resolve_chat_template(model.chat_template)
    tokenizer.padding_side = "left"
    return tokenizer


def load_model(model: ModelParams, device: str, dtype: Any) -> Any:
    from transformers import AutoModelForCausalLM

    name, gguf_file = model_source(model)
    kwargs = {k: v for k, v in model.model_kwargs.items() if k != "filename"}
    if gguf_file:
        kwargs["gguf_file"] = gguf_file
    if model.attn_implementation:
        kwargs["attn_implementation"] = model.attn_implementation
    # transformers draws a progress bar while it dequantizes GGUF tensors, with no switch.
    quiet = contextlib.redirect_stderr(io.StringIO()) if gguf_file else contextlib.nullcontext()
    try:
        with quiet:
            if model.load_pretrained_weights:
                loaded = AutoModelForCausalLM.from_pretrained(
                    name,
                    dtype=dtype,
                    trust_remote_code=model.trust_remote_code,
                    revision=model.model_revision,
                    **kwargs,
                )
            else:
                loaded = _random_model(model, name, dtype, kwargs)
    except Exception as exc:
        raise ModelLoadError(f"cannot load model '{model.model_name}': {first_line(exc)}") from exc
    if model.adapter_model:
        try:
            from peft import PeftModel
        except ImportError as exc:
            raise ModelLoadError("model.adapter_model needs peft: pip install peft") from exc
        loaded = PeftModel.from_pretrained(loaded, model.adapter_model)
    loaded = loaded.to(device).eval()
    if model.compile:
        import torch

        # Compiles on the first batch; dynamic shapes, since every batch's length differs.
        loaded.forward = torch.compile(loaded.forward, dynamic=True)
    return loaded


def _random_model(model: ModelParams, name: str, dtype: Any, kwargs: dict[str, Any]) -> Any:
    """`model.load_pretrained_weights: false`: the architecture from the model's config, with
    freshly initialised weights (no weight file is read), as Oumi does; handy to benchmark."""
    from transformers import AutoConfig, AutoModelForCausalLM

    gguf = {"gguf_file": kwargs.pop("gguf_file")} if "gguf_file" in kwargs else {}
    config = AutoConfig.from_pretrained(
        name, trust_remote_code=model.trust_remote_code, revision=model.model_revision, **gguf
    )
    return AutoModelForCausalLM.from_config(
        config, trust_remote_code=model.trust_remote_code, dtype=dtype, **kwargs
    )


# The checkpoint's generation_config.json fields that lmpress has fields for. The sampling
# ones count only where the checkpoint samples (do_sample), as transformers reads them.
DEFAULTS_ALWAYS = ("max_new_tokens", "repetition_penalty")
DEFAULTS_WHEN_SAMPLING = ("temperature", "top_p", "top_k", "min_p")


def checkpoint_defaults(model: Any, policy: str) -> dict[str, Any]:
    """What `model.generation_defaults` takes from the checkpoint's generation config.

    "ignore" leaves it only its token ids (EOS still ends a reply), since transformers fills
    every field lmpress leaves unset from it: a shipped repetition_penalty or
    no_repeat_ngram_size would otherwise change even greedy decoding. "use" keeps it, so
    transformers applies the fields lmpress has no name for, and returns the ones lmpress
    has, to fill each request's unset fields.
    """
    from transformers import GenerationConfig

    shipped = model.generation_config
    if policy != "use":
        ids = ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id")
        model.generation_config = GenerationConfig(**{k: getattr(shipped, k, None) for k in ids})
        return {}
    given = {k: v for k, v in shipped.to_diff_dict().items() if v is not None}
    names = DEFAULTS_ALWAYS + (DEFAULTS_WHEN_SAMPLING if given.get("do_sample") else ())
    defaults = {k: given[k] for k in names if k in given}
    if given.get("do_sample"):
        defaults.setdefault("temperature", 1.0)
    return defaults


def _eos_ids(model: Any, tokenizer: Any) -> set[int]:
    ids = model.generation_config.eos_token_id
    found = set(ids if isinstance(ids, list) else [ids] if ids is not None else [])
    if tokenizer.eos_token_id is not None:
        found.add(tokenizer.eos_token_id)
    return found


def _context_length(model: Any, tokenizer: Any) -> int | None:
    text_config = model.config.get_text_config()
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        value = getattr(text_config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None
