"""LLAMACPP: GGUF models through llama-cpp-python, many sequences decoded together.

llama-cpp-python's `Llama` loads the model (every `model.model_kwargs` key must be one of its
constructor's parameters: it ignores unknown ones, lmpress refuses them) and gives the
tokenizer and the GGUF metadata (loading.py). Generation does not go through `Llama`, which
decodes one sequence at a time: `LlamaCppEngine` makes a llama.cpp context whose KV cache holds
up to `generation.batch_size` sequences and hands it to its `LlamaCppScheduler`
(scheduling.py), which runs continuous batching on it on the worker thread, each sequence
sampling from its own sampler chain, seeded per row (sampling.py), and drafting by prompt lookup
or with `model.draft_model` (drafting.py: its own context beside the model's) when
`model.speculative_method` asks for it. This module checks each
request before it is queued; prompts.py renders and tokenizes it. The three local engines share
this shape (worker.py).

`model_kwargs.n_ctx` (default: the model's own context length) is the size of the KV cache, and
each of the `batch_size` sequences gets an equal part of it (a multiple of 256, at least 256),
as llama-server's `-c` and `-np` do. Each sequence attends only to its own part, so a step costs
the same whatever the others hold, and what else is in flight moves a sequence's logits only by
llama.cpp's rounding at different batch shapes (about 1e-6): greedy replies do not depend on the
batch size, short of a near-exact tie between two tokens. With `model_kwargs.kv_unified: true`
(the bundled smollm2 recipe's) the sequences share the cache instead, as llama-server's
`--kv-unified`: one prompt, one conversation or one long row may use all of it, and rows start
while their prompts and `max_new_tokens` fit beside those in flight (scheduling.py), so no row
is refused or cut for the others' sake; loading.batched_context says what that costs, and why
a drafting engine (`model.speculative_method`) keeps the split cache.

A reasoning model's thinking (local/reasoning.py) is counted, bounded and kept apart from its answer
sequence by sequence: the scheduler writes the close of a row's thinking once its
`max_reasoning_tokens` are spent, and holds its grammar until the answer starts.

A request may score its prompt instead of, or before, generating (issue 52): its prompt given as
token ids (`Request.prompt_ids`, read as given: no template, no BOS) and its tokens' logprobs
asked for (`prompt_logprobs`); the positions it scores return their logits in the same batches
as every other row's (reading.py), and with `max_new_tokens` 0 it is answered once its prompt
is read. `Engine.loglikelihood` (engines/scoring.py) builds on that, and the choices of one
context read it once (scheduling.py). `tokenizer()` is the GGUF file's (tokenizer.py).

`model.adapters` are LoRA adapters a row chooses by name: GGUF LoRA files, or PEFT directories
converted once (lora_gguf.py), loaded onto the model (loras.py); llama.cpp applies one to the
whole context, so rows take turns by adapter (turns.py).

`model_kwargs.mmproj` names the model's projector GGUF: rows may then carry images, read by
llama.cpp's multimodal library and decoded into their sequences by the same scheduler
(projector.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time

from lmpress.configs.schema import RunConfig
from lmpress.engines.base import Occupancy, check_adapter, check_token_settings
from lmpress.engines.common.embeddings import finish_embeddings
from lmpress.engines.common.tool_parsers import ToolPlan, check_parser
from lmpress.engines.local.bad_words import word_sequences
from lmpress.engines.local.beams import beams_refusal, grammar_refusal
from lmpress.engines.local.guided import Grammars, check_recipe_guided, request_matcher
from lmpress.engines.local.llamacpp import prompt_count
from lmpress.engines.local.llamacpp.drafting import load_drafter
from lmpress.engines.local.llamacpp.loading import (
    Vocab,
    batched_context,
    chat_template,
    gguf_path,
    llama_kwargs,
    load_llama,
    oumi_gguf_file,
    parallel_sequences,
)
from lmpress.engines.local.llamacpp.lora_gguf import BaseFacts, lora_file
from lmpress.engines.local.llamacpp.loras import Loras, adapter_files
from lmpress.engines.local.llamacpp.options import LlamaCppOptions
from lmpress.engines.local.llamacpp.pooling import (
    PooledSubmission,
    PoolingInputs,
    PoolingScheduler,
    error_answer,
    pooling_kwargs,
)
from lmpress.engines.local.llamacpp.projector import ImageSegment, load_projector
from lmpress.engines.local.llamacpp.prompts import GgufPrompts
from lmpress.engines.local.llamacpp.rows import LlamaCppSubmission
from lmpress.engines.local.llamacpp.scheduling import LlamaCppScheduler
from lmpress.engines.local.llamacpp.tokenizer import GgufTokenizer
from lmpress.engines.local.reasoning import ModelReasoning
from lmpress.engines.local.speculation import Speculation
from lmpress.engines.local.worker import WorkerEngine
from lmpress.engines.prompt_count import PromptCounter
from lmpress.vocabulary.embeddings import (
    CLASSIFYING_TASKS,
    LIKELIHOOD_TASKS,
    SCORING_TASKS,
    EmbedRequest,
    EmbedResult,
    ScoreRequest,
    ScoreResult,
)
from lmpress.vocabulary.errors import (
    ConfigError,
    ErrorKind,
    ModelLoadError,
    RequestError,
    UnsupportedParamError,
)
from lmpress.vocabulary.types import ErrorInfo, GenerationParams, Request

# model.kv_cache_dtype on llama.cpp: its K and V cells in blocks of 8 or 4 bits.
KV_CACHE_TYPES = {"int8": "GGML_TYPE_Q8_0", "int4": "GGML_TYPE_Q4_0"}


def kv_cache_kwargs(kv_cache_dtype: str, kwargs: dict) -> None:
    """`Llama()`'s type_k and type_v for `model.kv_cache_dtype`, with the flash attention a
    quantized V cache needs in llama.cpp (a context without it is refused)."""
    import llama_cpp

    if kv_cache_dtype == "auto":
        return
    own = sorted(k for k in ("type_k", "type_v") if k in kwargs)
    if own:
        raise ConfigError(
            f"model.kv_cache_dtype: {kv_cache_dtype} sets llama.cpp's type_k and type_v; "
            f"remove model.model_kwargs.{', '.join(own)} or set kv_cache_dtype to auto"
        )
    if kwargs.get("flash_attn") is False:
        raise ConfigError(
            f"model.kv_cache_dtype: {kv_cache_dtype} needs flash attention on LLAMACPP "
            f"(llama.cpp quantizes the V cache only under it); remove "
            f"model.model_kwargs.flash_attn: false"
        )
    kind = getattr(llama_cpp, KV_CACHE_TYPES[kv_cache_dtype])
    kwargs.update(type_k=kind, type_v=kind, flash_attn=True)


class LlamaCppEngine(WorkerEngine):
    name = "LLAMACPP"
    supported_params = frozenset({
        "max_new_tokens", "temperature", "top_p", "top_k", "min_p", "repetition_penalty",
        "presence_penalty", "frequency_penalty", "stop_strings", "stop_token_ids", "min_tokens",
        "seed", "n", "logprobs", "top_logprobs", "logit_bias", "skip_special_tokens",
        "guided_decoding", "reasoning_effort", "max_reasoning_tokens", "prompt_logprobs",
        "ignore_eos", "bad_words", "num_beams", "length_penalty", "early_stopping",
    })  # fmt: skip
    takes_tools = True
    takes_adapters = True  # model.adapters: GGUF LoRA files or PEFT directories (loras.py)
    kv_cache_dtypes = frozenset(KV_CACHE_TYPES)  # llama.cpp's q8_0 and q4_0 K and V cells
    # Drafts by prompt lookup or a draft model (drafting.py), row by row in the batch.
    speculative_methods = frozenset({"ngram", "draft_model"})
    # One per run: the engine loads the model for the task the run does (pooling.py).
    tasks = frozenset({"generate", "embed", *SCORING_TASKS, *CLASSIFYING_TASKS, *LIKELIHOOD_TASKS})
    options = LlamaCppOptions

    @classmethod
    def prompt_counter(cls, config: RunConfig) -> PromptCounter:
        return prompt_count.prompt_counter(config)

    def __init__(self, config: RunConfig):
        super().__init__(config)
        import llama_cpp

        if not config.model.load_pretrained_weights:
            raise ConfigError(
                "model.load_pretrained_weights: false: LLAMACPP reads its weights from the GGUF "
                "file; random weights need the NATIVE or VLLM engine"
            )
        speculation = Speculation.of(config.model)  # checked before anything is loaded
        if config.task == "generate" and (refusal := beams_refusal(config.generation)):
            raise UnsupportedParamError(refusal)
        self.path = gguf_path(oumi_gguf_file(config.model) or config.model.model_name)
        lora_files = adapter_files(config, self.path)  # model.adapters (loras.py)
        self.loras: Loras | None = None
        own = ("filename", "mmproj")  # lmpress's keys, not Llama()'s
        model_kwargs = {k: v for k, v in config.model.model_kwargs.items() if k not in own}
        kwargs = llama_kwargs(model_kwargs, llama_cpp.Llama)
        kwargs.setdefault("verbose", False)
        kwargs.setdefault("n_ctx", 0)  # 0: the model's own context length
        kv_cache_kwargs(config.model.kv_cache_dtype, kwargs)
        if config.task != "generate":
            pooling_kwargs(kwargs, self.path, config.task)
        extra_bufts = kwargs.pop("use_extra_bufts", None)
        unified = bool(kwargs.pop("kv_unified", False))  # lmpress's key (batched_context)
        try:
            self.llama = load_llama(self.path, kwargs, extra_bufts=extra_bufts)
        except Exception as exc:
            raise ModelLoadError(f"cannot load GGUF model '{self.path}': {exc}") from exc
        self.vocab = Vocab(self.llama)
        self.n_vocab = self.vocab.size
        self.metadata: dict[str, str] = dict(self.llama.metadata)
        if config.task != "generate":
            self.projector = None
            try:
                self.pooling = PoolingInputs(self.llama, self.path, config.task)
            except ConfigError:  # the model's pooling does not fit the task: free it first
                self.llama.close()
                raise
            scheduler = PoolingScheduler(
                self._queue, self, ctx=self.llama._ctx.ctx, limit=self.pooling.limit,
                n_seq=self.pooling.n_seq,
            )  # fmt: skip
            self.max_in_flight = 2 * self.pooling.n_seq
            self._start_worker(scheduler, "lmpress-llamacpp")
            return
        self.chat_template = chat_template(config, self.metadata)
        try:  # the recipe's thinking settings, checked before anything more is loaded
            self.model_reasoning = ModelReasoning(
                self.chat_template, config.model.reasoning_parser, self._tokenize,
                self._detokenize, self.model_name,
            )  # fmt: skip
            self.model_reasoning.check_recipe(config.generation)
        except ConfigError:
            self.llama.close()
            raise
        self.tool_call_parser = check_parser(config.model.tool_call_parser)
        parser = self.tool_call_parser
        self.projector = load_projector(config.model.model_kwargs.get("mmproj"), self.llama)
        self.prompts = GgufPrompts(
            self.llama._model, self.vocab, self.chat_template, self.model_name, parser,
            self.projector, config.model.chat_template_kwargs,
        )  # fmt: skip
        batch_size = parallel_sequences(config.generation.batch_size)
        ctx = batched_context(
            self.llama, self.path, kwargs, batch_size, images=self.projector is not None,
            split=not unified or speculation is not None,
        )  # fmt: skip
        drafter = None
        try:
            self.loras = Loras(self.llama.model, lora_files)
            if speculation is not None and speculation.draft_model:
                drafter = load_drafter(config.model, kwargs, self.llama, ctx, batch_size)
        except Exception:
            ctx.close()
            self.llama.close()
            raise
        scheduler = LlamaCppScheduler(
            self._queue, self, ctx=ctx, vocab=self.vocab, projector=self.projector,
            batch_size=batch_size,
            # The penalty window: the whole sequence unless the recipe says otherwise.
            penalty_window=kwargs.get("last_n_tokens_size"),
            speculation=speculation, drafter=drafter, loras=self.loras,
        )  # fmt: skip
        self.batch_size = batch_size
        self.n_ctx, self.n_ctx_seq = scheduler.n_ctx, scheduler.n_ctx_seq
        self._n_batch = scheduler.batches.size  # the most tokens llama.cpp decodes at once
        # Two batches' worth, so a finished sequence's place is taken at once; as much for
        # each adapter, so that each group's turn has a batch's worth waiting (turns.py).
        self.max_in_flight = 2 * batch_size * (1 + len(lora_files))
        self._start_worker(scheduler, "lmpress-llamacpp")
        self._grammars: Grammars | None = None
        check_recipe_guided(self._grammar_engine, config.generation.guided_decoding, self.name)

    def _grammar_engine(self) -> Grammars:
        """The grammar engine over this model's vocabulary, built on the first guided row."""
        if self._grammars is None:
            end_ids = self.vocab.end_ids()
            self._grammars = Grammars.for_llama_vocab(self.vocab.vocab, self.n_vocab, end_ids)
        return self._grammars

    async def aclose(self) -> None:
        if not await self._stop_worker():
            return
        self.scheduler.close()
        if self.projector is not None:
            self.projector.close()
        if self.loras is not None:
            self.loras.close()
        self.llama.close()

    # --- LoRA adapters (loras.py) ------------------------------------------------------------

    @property
    def adapter_names(self) -> frozenset[str]:
        return self.loras.names if self.loras is not None else frozenset()

    async def load_adapter(self, name: str, path: str) -> None:
        """Convert (where need be) and load an adapter while the engine runs."""
        self._check_started_for("generate")
        base = BaseFacts.of(self.metadata)
        self.loras.add(name, await asyncio.to_thread(lora_file, name, path, base))

    async def unload_adapter(self, name: str) -> None:
        """New requests may not choose it; it is freed once none of its requests is left."""
        self._check_started_for("generate")
        self.loras.retire(name)

    # --- the pooling tasks (pooling.py) ----------------------------------------------------

    async def embed(self, request: EmbedRequest) -> EmbedResult:
        started = time.perf_counter()
        self._check_started_for("embed")
        try:
            submission = self.pooling.embed_submission(request, started)
        except RequestError as exc:
            info = ErrorInfo(exc.kind, str(exc), exc.status)
            return error_answer(PooledSubmission(request, [], [], started), self, info)
        result = await self._answer(submission)
        if self.pooling.head is not None:  # classify, reward: the head's values, labelled
            result = self.pooling.head.finish(result)
        return finish_embeddings(result, request, self.pooling.normalize)

    async def score(self, request: ScoreRequest) -> ScoreResult:
        started = time.perf_counter()
        self._check_started_for("score")
        try:
            submission = self.pooling.score_submission(request, started)
        except RequestError as exc:
            info = ErrorInfo(exc.kind, str(exc), exc.status)
            return error_answer(PooledSubmission(request, [], [], started), self, info)
        return await self._answer(submission)

    def _check_started_for(self, call: str) -> None:
        task = self.config.task
        fits = {"generate": ("generate",), "score": SCORING_TASKS}
        fits["embed"] = ("embed", *CLASSIFYING_TASKS)  # classify, reward: their head's values
        if task not in fits[call]:
            raise UnsupportedParamError(
                f"engine LLAMACPP was started for task {task}: {call} needs an engine started "
                f"with task: {' or '.join(fits[call])}"
            )

    # --- what the KV cache holds now -------------------------------------------------------

    def occupancy(self) -> Occupancy:
        held = super().occupancy()
        if isinstance(self.scheduler, LlamaCppScheduler):
            held = dataclasses.replace(held, kv_cache_usage=self.scheduler.kv_cache_usage())
        return held

    def sequences_in_flight(self) -> int:
        """Sequences holding a slot in the KV cache right now (0 when idle)."""
        return self.scheduler.sequences.in_flight()

    def kv_cells_used(self) -> int:
        """Positions held in the KV cache, summed over sequences and read from llama.cpp
        itself (0 when nothing is cached)."""
        return self.scheduler.sequences.cells_used()

    def kv_cells_cached(self) -> int:
        """Positions that free sequences keep for a request that starts the same way."""
        return self.scheduler.sequences.cells_cached()

    # --- prompts ---------------------------------------------------------------------------

    def render(self, request: Request, tool_plan: ToolPlan | None = None) -> str:
        """The chat template applied to a request's messages, as llama-cpp-python renders it."""
        return self.prompts.render(
            request, tool_plan, self.model_reasoning.template_kwargs(request)
        )

    def _tokenize(self, text: str) -> list[int]:
        """Text as the GGUF tokenizer writes it mid-reply: no BOS, special tokens read."""
        return list(self.llama._model.tokenize(text.encode("utf-8"), add_bos=False, special=True))

    def _detokenize(self, ids: list[int]) -> str:
        """Ids back into text, special tokens written out (on the caller's thread, beside
        the worker's own decoding)."""
        return self.vocab.decode(ids, special=True)

    def tokenizer(self) -> GgufTokenizer:
        """The GGUF tokenizer; its context length leaves room for the token a prompt is
        scored after (a rolling window is its context and up to that many tokens)."""
        self._check_started_for("generate")
        return GgufTokenizer(self.llama._model, self.vocab, self.n_ctx_seq - 1)

    def encode(self, request: Request, tool_plan: ToolPlan | None = None) -> list[int]:
        """The prompt's token ids (the chat template applied, or the raw prompt), checked to
        fit the context."""
        return self.inputs(request, tool_plan)[0]

    def inputs(
        self, request: Request, tool_plan: ToolPlan | None = None
    ) -> tuple[list[int], list[ImageSegment] | None]:
        """The prompt's token ids, checked to fit, and its image segments (None: no images)."""
        switches = self.model_reasoning.template_kwargs(request)
        ids, images = self.prompts.inputs(request, tool_plan, switches)
        # A prompt that is only scored (no new tokens) may fill its context; else one token
        # at least must follow it.
        if len(ids) >= self.n_ctx_seq + (request.params.max_new_tokens == 0):
            where = f"the context is {self.n_ctx} (model.model_kwargs.n_ctx): raise n_ctx"
            if self.n_ctx_seq < self.n_ctx:  # a split cache
                where = (
                    f"the context of a sequence is {self.n_ctx_seq} (model.model_kwargs.n_ctx "
                    f"{self.n_ctx} shared by generation.batch_size {self.batch_size}): raise "
                    f"n_ctx or lower batch_size (or set model.model_kwargs.kv_unified: true)"
                )
            raise RequestError(
                f"prompt is {len(ids)} tokens, {where} or shorten the prompt",
                kind=ErrorKind.CONTEXT_LENGTH_EXCEEDED,
            )
        self._check_whole_images([image for image in images or () if image.non_causal])
        return ids, images

    def _check_whole_images(self, images: list[ImageSegment]) -> None:
        """A projector whose image tokens attend to each other both ways (non-causal) needs
        each image decoded in one batch."""
        largest = max((image.n_tokens for image in images), default=0)
        if largest > self._n_batch:
            raise RequestError(
                f"an image of this row is {largest} tokens, more than the {self._n_batch} "
                f"that llama.cpp decodes at once; raise model.model_kwargs.n_batch",
                kind=ErrorKind.INVALID_REQUEST,
            )

    # --- checking a request before it is queued -------------------------------------------

    def _prepare(self, request: Request, started: float) -> LlamaCppSubmission:
        self._check_started_for("generate")
        # Again after the worker's check: an unload may have come in the await between them.
        check_adapter(self, request)
        plan = self.prompts.plan(request)
        prompt_ids, images = self.inputs(request, plan)
        if images and request.params.prompt_logprobs is not None:
            raise RequestError(
                "generation.prompt_logprobs: a prompt with images has no logprobs at its image "
                "tokens on LLAMACPP; send the text alone to score it",
                kind=ErrorKind.INVALID_REQUEST,
            )
        if refusal := beams_refusal(request.params):
            raise RequestError(refusal, kind=ErrorKind.UNSUPPORTED_PARAM)
        logit_bias = self._logit_bias(request.params)
        check_token_settings(request.params, self.n_vocab)
        self._check_fits(request.params, len(prompt_ids))
        matcher = request_matcher(
            self._grammar_engine,
            request.params.guided_decoding,
            plan,
            self.name,
        )
        if refusal := grammar_refusal(request.params, matcher is not None):
            raise RequestError(refusal, kind=ErrorKind.UNSUPPORTED_PARAM)
        reasoning = self.model_reasoning.for_request(
            prompt_ids, request.params, matcher is not None
        )
        words = request.params.bad_words
        bad_words = word_sequences(words, self.tokenizer().encode) if words else []
        return LlamaCppSubmission(
            request, prompt_ids, started, logit_bias=logit_bias, matcher=matcher, tool_plan=plan,
            media=images, reasoning=reasoning, bad_words=bad_words,
        )  # fmt: skip

    def _logit_bias(self, params: GenerationParams) -> list[tuple[int, float]]:
        bias = []
        for key, value in params.logit_bias.items():
            try:
                token = int(key)
            except ValueError:
                token = -1
            if not 0 <= token < self.n_vocab:
                raise RequestError(
                    f"generation.logit_bias: '{key}' is not a token id of this model "
                    f"(0 to {self.n_vocab - 1})",
                    kind=ErrorKind.INVALID_REQUEST,
                )
            bias.append((token, float(value)))
        return bias

    def _check_fits(self, params: GenerationParams, prompt_tokens: int) -> None:
        shared = self.n_ctx_seq == self.n_ctx
        beams = params.num_beams > 1
        rows, name = (params.num_beams, "num_beams") if beams else (params.n, "n")
        new = rows if params.max_new_tokens else 0  # a token a sample, at least
        if shared and prompt_tokens + new > self.n_ctx:
            raise RequestError(
                f"generation.{name} is {rows} and the prompt {prompt_tokens} tokens: more than "
                f"the context of {self.n_ctx} (model.model_kwargs.n_ctx) holds; raise n_ctx or "
                f"lower {name}",
                kind=ErrorKind.CONTEXT_LENGTH_EXCEEDED,
            )
        if rows > self.batch_size:
            what = "beam" if beams else "sample"
            raise RequestError(
                f"generation.{name} is {rows} but generation.batch_size is {self.batch_size}: "
                f"each {what} is a sequence in flight; raise batch_size to at least {name}",
                kind=ErrorKind.INVALID_REQUEST,
            )
