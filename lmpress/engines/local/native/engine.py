"""NATIVE: Hugging Face transformers + PyTorch, on CPU or CUDA.

`NativeEngine` loads the model and tokenizer (loading.py) and turns each request into prompt ids
(its chat template applied, checked against the context and the KV cache's budget); its
`NativeScheduler` (scheduling.py), on the worker thread, batches rows continuously on the
model's forward pass (batch_cache.py and row_attention.py keep and read each row's KV cache)
while each row keeps its own sampling settings, seed, stop strings, streaming and cancellation
(sampling.py). The three local engines share this shape (worker.py).

A vision-language model (a config with a vision tower's: LLaVA, Idefics3, ...) loads through
AutoModelForImageTextToText with its AutoProcessor, whose chat template places the image
tokens; a row's images (lmpress.vocabulary.images) become the processor's pixel inputs, which the
worker passes to the model when it prefills that row. Text rows batch with image rows alike.

A run of `embed`, `score` or `rerank` loads an encoder instead (encoders.py: the model and
its pooling, or a cross-encoder) and a `PoolingScheduler` (embedding.py) that batches the
inputs waiting, sorted by length; `normalize` and `dimensions` apply to the vectors it hands
back, here.

A reasoning model's thinking (local/reasoning.py) is counted, bounded and kept apart from its answer
row by row inside the batch: sampling.py writes the close of a row's thinking once its
`max_reasoning_tokens` are spent, and holds its grammar until the answer starts.

On a CPU the linear layers multiply by weights packed once for oneDNN (packing.py;
`model.model_kwargs.pack_weights: false` keeps the plain layers).

With `model.draft_model` a second, smaller model drafts each row's next tokens (drafting.py),
loaded on the same device and dtype; its KV cache is not counted in `kv_cache_gb`.

`model.model_kwargs.kv_cache_gb` caps the KV cache (rows join only while it has room, and a
row that could outgrow it alone fails); `model.model_kwargs.prefix_reuse: false` turns off
reusing a shared prompt prefix's cache. `model.kv_cache_dtype: int8` holds the batch's KV
cache as int8 (int8_slots.py), so the same budget holds more tokens.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

from lmpress.configs.schema import ModelParams, RunConfig
from lmpress.engines.base import Occupancy, check_token_settings, failure_info
from lmpress.engines.common.checkpoints import context_length, load_model_config, load_tokenizer
from lmpress.engines.common.embeddings import cosine_scores, finish_embeddings
from lmpress.engines.common.hf_tokenizer import HfTokenizer
from lmpress.engines.common.models import dtype_in_use
from lmpress.engines.common.tool_parsers import ToolPlan, check_parser
from lmpress.engines.local.bad_words import word_sequences
from lmpress.engines.local.beams import beams_refusal, grammar_refusal
from lmpress.engines.local.guided import Grammars, check_recipe_guided, request_matcher
from lmpress.engines.local.native import prompt_count
from lmpress.engines.local.native.adapters import RowAdapters, check_settings
from lmpress.engines.local.native.batch_cache import give_freed_caches_back
from lmpress.engines.local.native.embedding import PoolingScheduler, PoolingSubmission
from lmpress.engines.local.native.encoders import Encoder, EncoderRow, made_for
from lmpress.engines.local.native.loading import (
    batching_settings,
    checkpoint_defaults,
    checkpoint_processors,
    compiled_decode,
    eos_ids,
    load_draft_model,
    load_model,
    load_processor,
    native_prompts,
    pick_device_and_dtype,
    switch,
)
from lmpress.engines.local.native.options import NativeOptions
from lmpress.engines.local.native.packing import pack_linears
from lmpress.engines.local.native.row_attention import use_row_attention
from lmpress.engines.local.native.scheduling import NativeScheduler, reply_limit
from lmpress.engines.local.reasoning import ModelReasoning
from lmpress.engines.local.speculation import Speculation
from lmpress.engines.local.worker import PREPARE_OFF_LOOP_CHARS, Submission, WorkerEngine
from lmpress.engines.prompt_count import PromptCounter
from lmpress.vocabulary.embeddings import (
    CLASSIFYING_TASKS,
    LIKELIHOOD_TASKS,
    SCORING_TASKS,
    Embedding,
    EmbedRequest,
    EmbedResult,
    ScoreRequest,
    ScoreResult,
)
from lmpress.vocabulary.errors import (
    ErrorKind,
    ModelLoadError,
    RequestError,
    UnsupportedParamError,
)
from lmpress.vocabulary.types import ErrorInfo, Request, Usage


class NativeEngine(WorkerEngine):
    name = "NATIVE"
    supported_params = frozenset({
        "max_new_tokens", "temperature", "top_p", "top_k", "min_p", "repetition_penalty",
        "presence_penalty", "frequency_penalty", "stop_strings", "stop_token_ids", "min_tokens",
        "seed", "n", "logprobs", "top_logprobs", "skip_special_tokens", "guided_decoding",
        "reasoning_effort", "max_reasoning_tokens", "prompt_logprobs", "ignore_eos", "bad_words",
        "num_beams", "length_penalty", "early_stopping",
    })  # fmt: skip
    uses_generation_defaults = True
    # Drafts by prompt lookup or a draft model (drafting.py), verified in the batch
    # (scheduling.py).
    speculative_methods = frozenset({"ngram", "draft_model"})
    takes_tools = True
    takes_hub_ids = True
    tasks = frozenset(
        {"generate", "embed", "score", "rerank", *CLASSIFYING_TASKS, *LIKELIHOOD_TASKS}
    )
    options = NativeOptions
    # Every row its own adapter, in one batch (adapters.py).
    takes_adapters = True
    merges_adapter_model = True
    # The batch's KV cache as int8 with a scale per head and token (int8_slots.py).
    kv_cache_dtypes = frozenset({"int8"})

    @classmethod
    def model_task(cls, config: RunConfig) -> str:
        try:
            return made_for(load_model_config(config.model))
        except ModelLoadError:  # the load that follows says what is wrong with the model
            return "generate"

    @classmethod
    def answered_tasks(cls, config: RunConfig) -> frozenset[str]:
        """A pooling model answers every pooling task its kind can: an embedding model scores
        too, by its vectors' cosine (as vLLM scores with one); a cross-encoder only scores; a
        classifier loaded to classify or reward answers that task."""
        if config.task == "generate":
            return frozenset({"generate"})
        if config.task in CLASSIFYING_TASKS:
            return frozenset({config.task})
        if cls.model_task(config) == "score":
            return frozenset(SCORING_TASKS)
        return frozenset({"embed", *SCORING_TASKS})

    @classmethod
    def prompt_counter(cls, config: RunConfig) -> PromptCounter:
        return prompt_count.prompt_counter(config)

    @classmethod
    def dtype_in_use(cls, model: ModelParams) -> str | None:
        return dtype_in_use(str(model.torch_dtype_str), model.device_map)

    def __init__(self, config: RunConfig):
        super().__init__(config)
        check_settings(config)
        if config.task == "generate" and (refusal := beams_refusal(config.generation)):
            raise UnsupportedParamError(refusal)
        import torch
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()  # its progress bars and hints would bury our output
        hf_logging.disable_progress_bar()
        self.device, self.dtype = pick_device_and_dtype(config.model, torch)
        self.encoder: Encoder | None = None
        if config.task != "generate":
            # No KV cache here, and no give_freed_caches_back: a forward pass's activations
            # (tens of MB at batch 32) would each be mapped and unmapped, three times the page
            # faults; glibc's own threshold reuses them, and memory stays flat as batches do.
            self.encoder = Encoder(config, self.device, self.dtype)
            # Rows waiting are what the scheduler sorts by length: keep a few batches' worth.
            self.max_in_flight = 4 * config.generation.batch_size
            scheduler = PoolingScheduler(
                self._queue, self, self.encoder, config.generation.batch_size
            )
            self._start_worker(scheduler, "lmpress-native")
            return
        if self.device == "cpu":
            give_freed_caches_back()
        model_config = load_model_config(config.model)
        self.model = load_model(config.model, self.device, self.dtype, model_config)
        self.adapters = RowAdapters(self.model)
        for name, path in config.model.adapters.items():
            self.adapters.add(name, path, f"model.adapters.{name}")
        self._adapter_names = set(config.model.adapters)  # what a request may choose now
        # After the weights: a packaged GGUF's tokenizer then comes from the dequantized copy
        # load_model made on first use, not from parsing the GGUF file's vocabulary again
        # (~7 s of SmolLM2's first run here).
        # transformers' own tokenizer; `tokenizer()` is the engine contract's, over it.
        self.hf_tokenizer = load_tokenizer(config.model)
        use_row_attention(self.model)
        # model.compile packs the weights its own way (inductor's freezing).
        if switch(config.model, "pack_weights") and not config.model.compile:
            pack_linears(self.model)
        self.processor = load_processor(config.model, model_config, self.hf_tokenizer)
        policy = config.model.generation_defaults
        self.model_defaults = checkpoint_defaults(self.model, policy)
        self.checkpoint_processors = checkpoint_processors(self.model, policy, self.device)
        self.eos_ids = eos_ids(self.model, self.hf_tokenizer)
        self.context_length = context_length(self.model.config, config.model.model_max_length)
        self._tokenizer = HfTokenizer(
            self.hf_tokenizer, self.context_length, min(self.eos_ids, default=None)
        )
        self.n_vocab = self.model.config.get_text_config().vocab_size  # the logits' width
        self.batch_size = config.generation.batch_size
        self.kv_budget_tokens, self.prefix_reuse = batching_settings(
            config.model, self.model.config, self.dtype
        )
        # Two batches' worth: one decoding, the next one waiting to join as rows end.
        self.max_in_flight = 2 * self.batch_size
        self._grammars: Grammars | None = None
        self.tool_call_parser = check_parser(config.model.tool_call_parser)
        self.prompts = native_prompts(
            config, self.hf_tokenizer, self.tool_call_parser, self.processor
        )
        tokenizer = self.hf_tokenizer
        self.model_reasoning = ModelReasoning(
            getattr(tokenizer, "chat_template", None),
            config.model.reasoning_parser,
            lambda text: tokenizer.encode(text, add_special_tokens=False),
            lambda ids: tokenizer.decode(ids, skip_special_tokens=False),
            self.model_name,
        )
        self.model_reasoning.check_recipe(config.generation)
        check_recipe_guided(self._grammar_engine, config.generation.guided_decoding, self.name)
        speculation = Speculation.of(config.model)
        self.draft_model = None
        if speculation is not None and speculation.draft_model:
            self.draft_model = load_draft_model(config.model, self.model, self.device, self.dtype)
        scheduler = NativeScheduler(
            self._queue, self, model=self.model, tokenizer=self.hf_tokenizer, device=self.device,
            eos_ids=self.eos_ids, context_length=self.context_length, batch_size=self.batch_size,
            kv_budget_tokens=self.kv_budget_tokens, prefix_reuse=self.prefix_reuse,
            checkpoint_processors=self.checkpoint_processors,
            speculation=speculation, draft_model=self.draft_model,
            decode=compiled_decode(self.model) if config.model.compile else None,
            token_text=self._tokenizer.piece, adapters=self.adapters,
            int8_cache=config.model.kv_cache_dtype == "int8",
        )  # fmt: skip
        if config.model.compile:
            scheduler.warm()
        self._start_worker(scheduler, "lmpress-native")

    def occupancy(self) -> Occupancy:
        held = super().occupancy()
        if isinstance(self.scheduler, NativeScheduler):
            held = dataclasses.replace(held, kv_cache_usage=self.scheduler.kv_cache_usage())
        return held

    @property
    def adapter_names(self) -> frozenset[str]:
        return frozenset(getattr(self, "_adapter_names", ()))

    async def load_adapter(self, name: str, path: str) -> None:
        """Load an adapter between two batch steps; a name already held is refused."""
        model = dataclasses.replace(self.config.model, adapters={name: path})
        check_settings(dataclasses.replace(self.config, model=model))
        if name in self.adapter_names:
            raise RequestError(f"adapter '{name}' is already loaded; unload it first",
                               ErrorKind.INVALID_REQUEST, status=400)  # fmt: skip
        await self.adapters.load(name, path)
        self._adapter_names.add(name)

    async def unload_adapter(self, name: str) -> None:
        """Stop taking requests for the adapter at once, wait for those in flight to end,
        then drop it between two batch steps."""
        if name not in self.adapter_names:
            raise RequestError(f"adapter '{name}' is not loaded", ErrorKind.NOT_FOUND, status=404)
        self._adapter_names.discard(name)
        while any(s.request.adapter == name for s in self._live):
            await asyncio.sleep(0.05)
        await self.adapters.unload(name)

    def tokenizer(self) -> HfTokenizer:
        if self.encoder is not None:
            raise UnsupportedParamError(
                f"engine {self.name} was loaded for {self.config.task}; run it with task: "
                f"generate to tokenize and score text"
            )
        return self._tokenizer

    def _grammar_engine(self) -> Grammars:
        """The grammar engine over this model's tokenizer, built on the first guided row."""
        if self._grammars is None:
            self._grammars = Grammars.for_hf_tokenizer(self.hf_tokenizer, sorted(self.eos_ids))
        return self._grammars

    async def aclose(self) -> None:
        await self._stop_worker()

    async def embed(self, request: EmbedRequest) -> EmbedResult:
        started = time.perf_counter()
        encoder = self._encoder("embed")
        try:
            if not request.inputs:
                raise RequestError("input is empty; give at least one text",
                                   kind=ErrorKind.INVALID_REQUEST)  # fmt: skip
            if encoder.cross_encoder:
                raise RequestError(
                    f"model '{self.model_name}' is a cross-encoder: it scores pairs and "
                    f"cannot embed",
                    kind=ErrorKind.UNSUPPORTED_PARAM,
                )
            width = encoder.cut_width(request.dimensions)
            texts = all(isinstance(item, str) for item in request.inputs)
            if texts:
                rows = await _text_rows(encoder, request.inputs)  # type: ignore[arg-type]
            else:
                rows = encoder.id_rows(request.inputs)
            answer = await self._answer(PoolingSubmission(rows, started))
        except RequestError as exc:
            answer = ErrorInfo(exc.kind, str(exc), exc.status)
        except Exception as exc:  # whatever the backend met in this request fails it alone
            answer = failure_info(exc)
        result = EmbedResult(request.id, [], Usage(), self.model_name, self.name)
        result.labels = encoder.labels
        if isinstance(answer, ErrorInfo):
            result.error = answer
        else:
            result.embeddings = [
                Embedding(cut_vector(vector, width), len(row.ids), row.truncated)
                for vector, row in zip(answer, rows, strict=True)
            ]  # fmt: skip
            result.usage = Usage(sum(len(row.ids) for row in rows))
        result.latency_s = time.perf_counter() - started
        return finish_embeddings(
            result, request
        )  # normalised after the cut, as sentence-transformers does

    async def score(self, request: ScoreRequest) -> ScoreResult:
        started = time.perf_counter()
        encoder = self._encoder("score")
        result = ScoreResult(request.id, model=self.model_name, engine=self.name)
        try:
            if encoder.classifies:
                raise RequestError(
                    f"task: engine {self.name} was loaded for {encoder.task}; run it with "
                    f"task: score to score",
                    kind=ErrorKind.UNSUPPORTED_PARAM,
                )
            if not request.documents:
                raise RequestError("documents is empty; give at least one",
                                   kind=ErrorKind.INVALID_REQUEST)  # fmt: skip
            if encoder.cross_encoder:  # each pair read together; its logit is the score
                rows = await _text_rows(encoder, request.queries(), request.documents)
            else:  # the cosine of the query's and each document's embeddings
                rows = await _text_rows(encoder, request.texts())
            answer = await self._answer(PoolingSubmission(rows, started))
        except RequestError as exc:
            answer = ErrorInfo(exc.kind, str(exc), exc.status)
        except Exception as exc:
            answer = failure_info(exc)
        if isinstance(answer, ErrorInfo):
            result.error = answer
        else:
            scores = answer if encoder.cross_encoder else cosine_scores(request, answer)
            result.scores = [float(score) for score in scores]
            result.usage = Usage(sum(len(row.ids) for row in rows))
        result.latency_s = time.perf_counter() - started
        return result

    def _encoder(self, task: str) -> Encoder:
        if self.encoder is None:
            raise UnsupportedParamError(
                f"task: engine {self.name} was loaded for {self.config.task}; run it with "
                f"task: {task} to {task}"
            )
        return self.encoder

    def _prepare(self, request: Request, started: float) -> Submission:
        if self.encoder is not None:
            raise RequestError(
                f"task: engine {self.name} was loaded for {self.config.task}, not generate",
                kind=ErrorKind.UNSUPPORTED_PARAM,
            )
        if refusal := beams_refusal(request.params):
            raise RequestError(refusal, kind=ErrorKind.UNSUPPORTED_PARAM)
        # A beam search is greedy by its own settings: a checkpoint's sampling defaults (its
        # temperature, its penalties) are not for it.
        if self.model_defaults and request.params.num_beams == 1:
            request = dataclasses.replace(
                request, params=request.params.with_defaults(self.model_defaults)
            )
        check_token_settings(request.params, self.n_vocab)
        check_scoring(request, self.n_vocab)
        plan = self.prompts.plan(request)
        matcher = request_matcher(
            self._grammar_engine,
            request.params.guided_decoding,
            plan,
            self.name,
        )
        if refusal := grammar_refusal(request.params, matcher is not None):
            raise RequestError(refusal, kind=ErrorKind.UNSUPPORTED_PARAM)
        ids, images = self.inputs(request, plan)
        reasoning = self.model_reasoning.for_request(ids, request.params, matcher is not None)
        return Submission(
            request, ids, started, matcher=matcher, tool_plan=plan, media=images,
            reasoning=reasoning,
            bad_words=word_sequences(request.params.bad_words, self._tokenizer.encode),
        )  # fmt: skip

    def encode(self, request: Request, tool_plan: ToolPlan | None = None) -> list[int]:
        """The prompt's token ids (the chat template applied, or the raw prompt), checked to
        leave room in the context."""
        return self.inputs(request, tool_plan)[0]

    def inputs(
        self, request: Request, tool_plan: ToolPlan | None = None
    ) -> tuple[list[int], dict[str, Any] | None]:
        """The prompt's token ids, checked to leave room in the context, and a prompt's image
        inputs for the model (pixel_values, ...; None without images)."""
        switches = self.model_reasoning.template_kwargs(request)
        ids, images = self.prompts.inputs(request, tool_plan, switches)
        # A reply needs a place after the prompt; with none, the last token is scored but never
        # fed (prompt_logprobs.py), so the prompt may be one token longer than the context.
        most = (self.context_length or 0) + (1 if request.params.max_new_tokens == 0 else -1)
        if self.context_length and len(ids) > most:
            raise RequestError(
                f"prompt is {len(ids)} tokens, the model's context is {self.context_length}",
                kind=ErrorKind.CONTEXT_LENGTH_EXCEEDED,
            )
        budget = self.kv_budget_tokens
        need = len(ids) + reply_limit(len(ids), request.params, self.context_length)
        if budget and need > budget:
            raise RequestError(
                f"prompt ({len(ids)} tokens) and max_new_tokens ({request.params.max_new_tokens})"
                f" need {need} tokens of KV cache; model.model_kwargs.kv_cache_gb holds {budget}",
                kind=ErrorKind.CONTEXT_LENGTH_EXCEEDED,
            )
        return ids, images


def check_scoring(request: Request, n_vocab: int) -> None:
    """Refuse token ids the model does not have (they would index past its embeddings) and a
    negative prompt_logprobs, each in one line that names it."""
    k = request.params.prompt_logprobs
    if k is not None and not 0 <= k <= n_vocab:
        raise RequestError(
            f"generation.prompt_logprobs: {k} is not between 0 and the model's {n_vocab} tokens",
            kind=ErrorKind.INVALID_REQUEST,
        )
    if request.prompt_ids is None:
        return
    if not request.prompt_ids:
        raise RequestError("prompt_ids is empty; give at least one token id",
                           kind=ErrorKind.INVALID_REQUEST)  # fmt: skip
    bad = next((t for t in request.prompt_ids if not 0 <= t < n_vocab), None)
    if bad is not None:
        raise RequestError(
            f"prompt_ids: {bad} is not a token id of this model (0 to {n_vocab - 1})",
            kind=ErrorKind.INVALID_REQUEST,
        )


def cut_vector(vector: Any, width: int | None) -> Any:
    """A vector cut to `width` (Matryoshka: the first values), as float32."""
    import numpy as np

    if width is not None:
        vector = vector[:width]
    return vector.astype(np.float32, copy=False)


async def _text_rows(
    encoder: Encoder, first: list[str], second: list[str] | None = None
) -> list[EncoderRow]:
    """The encoder's rows of these texts, tokenized on a thread where they are long (as a
    generation's prompt is, in `WorkerEngine`), so the caller's event loop does not wait."""
    if sum(map(len, first)) + sum(map(len, second or ())) > PREPARE_OFF_LOOP_CHARS:
        return await asyncio.to_thread(encoder.text_rows, first, second)
    return encoder.text_rows(first, second)
