"""VLLM: vLLM's asynchronous engine (AsyncLLM).

`VllmEngine` checks the recipe and holds a `VllmScheduler` (scheduling.py), which streams
requests into vLLM as they are submitted; vLLM's own scheduler batches whatever is in flight.
The three local engines share this shape (worker.py), with one difference: vLLM's engine runs
on an event loop of its own, not a thread that lmpress schedules, so the VLLM scheduler bridges
event loops rather than running a step loop, and it renders prompts itself, with the tokenizer
that AsyncLLM hands back once started.

Data parallelism is vLLM's own: `model.model_kwargs.data_parallel_size: N` goes to
AsyncEngineArgs like the tensor and pipeline sizes, and AsyncLLM starts N engine cores and
balances requests across them, as `vllm serve --data-parallel-size N` does.

Chat rows are rendered with vLLM's tokenizer and the model's chat template (or
`model.chat_template`), then tokenized by vLLM without adding special tokens again, as vLLM's
own `LLM.chat` does for text conversations. A row with images (read once by lmpress.vocabulary.images)
goes to the template as parts, so that it writes the model's image placeholders, and its
pixels go as the prompt's `multi_modal_data`, which vLLM's processor expands into image
tokens. vLLM refuses images for a text model; `model.model_kwargs.limit_mm_per_prompt` is
vLLM's own cap on images a prompt.

A reasoning model's thinking is read apart from its answer by vLLM's own reasoning parser,
chosen before vLLM starts: it is an engine argument, which also starts vLLM's thinking budget
and holds structured outputs until the thinking ends (reasoning.py).

The rest of the package: api.py (the vLLM classes lmpress calls, and every version
difference), translate.py (recipe -> engine arguments, GenerationParams -> SamplingParams,
RequestOutput -> Delta/Result), reasoning.py and logs.py (vLLM's log kept apart); NATIVE and
LLAMACPP have no twin of these: their backends need no version shims, and no log to gather from
child processes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from lmpress.configs.schema import ModelParams, RunConfig
from lmpress.engines.base import Engine
from lmpress.engines.common.embeddings import finish_embeddings
from lmpress.engines.common.hf_tokenizer import HfTokenizer
from lmpress.engines.common.models import dtype_in_use
from lmpress.engines.common.prompts import resolve_chat_template
from lmpress.engines.common.tool_parsers import check_parser
from lmpress.engines.local.reasoning import template_switches, template_text
from lmpress.engines.local.vllm import prompt_count
from lmpress.engines.local.vllm.api import (
    INSTALL_HINT,
    VllmApi,
    accelerator_reason,
    describe,
    visible_gpus,
    vllm_version,
)
from lmpress.engines.local.vllm.lora import loadable_path
from lmpress.engines.local.vllm.options import VllmOptions
from lmpress.engines.local.vllm.reasoning import budget_refusal, own_chat_template, parser_name
from lmpress.engines.local.vllm.scheduling import VllmScheduler
from lmpress.engines.local.vllm.translate import EngineSettings, engine_settings, sampling_params
from lmpress.engines.prompt_count import PromptCounter
from lmpress.vocabulary.classifier import activated, activation_of, labels_of
from lmpress.vocabulary.embeddings import (
    CLASSIFYING_TASKS,
    LIKELIHOOD_TASKS,
    EmbedRequest,
    EmbedResult,
    ScoreRequest,
    ScoreResult,
)
from lmpress.vocabulary.errors import (
    ConfigError,
    EngineUnavailableError,
    ErrorKind,
    RequestError,
    UnsupportedParamError,
    first_line,
)
from lmpress.vocabulary.likelihood import Tokenizer
from lmpress.vocabulary.types import Delta, ErrorInfo, Message, Request, Result, Usage


class VllmEngine(Engine):
    name = "VLLM"
    # Tools go into the prompt and calls come back out as on NATIVE (common/tool_parsers.py); a
    # required call is generated under its grammar by vLLM's structured outputs.
    takes_tools = True
    supported_params = frozenset({
        "max_new_tokens", "temperature", "top_p", "top_k", "min_p", "repetition_penalty",
        "presence_penalty", "frequency_penalty", "stop_strings", "stop_token_ids", "min_tokens",
        "seed", "n", "logprobs", "top_logprobs", "logit_bias", "guided_decoding",
        "skip_special_tokens", "reasoning_effort", "max_reasoning_tokens", "prompt_logprobs",
        "ignore_eos", "bad_words", "num_beams", "length_penalty",
    })  # fmt: skip
    takes_hub_ids = True
    kv_cache_dtypes = frozenset({"fp8"})  # vLLM's kv_cache_dtype, by the same name
    # Each row's adapter (model.adapters) is its request's LoRARequest, and vLLM batches rows
    # of every adapter and the base model together (lora.py).
    takes_adapters = True
    merges_adapter_model = True
    # vLLM's own n-gram and draft-model speculation (translate.py).
    speculative_methods = frozenset({"ngram", "draft_model"})
    # The pooling tasks through vLLM's pooling runner (`LLM.embed`, `LLM.score` for an
    # embedding model or a cross-encoder, `LLM.classify` for a sequence classifier), started
    # for it with `task: embed`, `score`, `rerank`, `classify` or `reward`.
    tasks = frozenset(
        {"generate", "embed", "score", "rerank", *CLASSIFYING_TASKS, *LIKELIHOOD_TASKS}
    )
    options = VllmOptions

    @classmethod
    def prompt_counter(cls, config: RunConfig) -> PromptCounter:
        return prompt_count.prompt_counter(config)

    @classmethod
    def dtype_in_use(cls, model: ModelParams) -> str | None:
        return dtype_in_use(str(model.model_kwargs.get("dtype") or model.torch_dtype_str))

    @classmethod
    def unavailable_reason(cls) -> str | None:
        try:
            vllm_version()
            return accelerator_reason()
        except EngineUnavailableError as exc:
            return str(exc).removeprefix("engine VLLM ")
        except Exception as exc:  # a broken install must not break `lmpress engines`
            return f"vllm is installed but fails to load ({first_line(exc)}): {INSTALL_HINT}"

    def __init__(self, config: RunConfig):
        super().__init__(config)
        self.api = VllmApi.load()
        self.settings = engine_settings(
            config,
            self.api.engine_arg_names(),
            self.api.auto_dtype(),
            spare_lora_slot=self.api.spare_lora_slot(),
        )
        if config.task != "generate":
            self.settings.args.update(self.api.pooling_runner(config.task))
        sampling_params(self.api, config.generation, stream=False)  # refuse bad settings now
        template = config.model.chat_template
        self.chat_template = resolve_chat_template(template) if template else None
        if config.task == "generate":
            self._choose_reasoning_parser()
        self.tool_call_parser = check_parser(config.model.tool_call_parser)
        self.max_in_flight = 2 * self.settings.max_num_seqs * self.settings.data_parallel_size
        # One copy: vLLM checks tensor x pipeline against the GPUs itself, and says so plainly.
        if self.settings.data_parallel_size > 1:
            check_gpus(self.settings, visible_gpus())
        self.pair_format = "pair"  # how a cross-encoder's pair is read (api.pair_format)
        # classify and reward: the head's labels, in id order (None for the other tasks), and
        # what classify applies to its values (vocabulary/classifier.py)
        self.labels: list[str] | None = None
        self.activation = "softmax"
        self.scheduler = VllmScheduler(self, self.api, self.settings)
        try:
            self.cross_encoder = self._check_pooling(config.task, self.scheduler.pooling_task)
            self.scheduler.read_reasoning(self.settings.args.get("reasoning_parser"))
            self._check_reasoning_effort()
        except BaseException:
            self.scheduler.close()
            raise

    def _choose_reasoning_parser(self) -> None:
        """vLLM's reasoning parser, an engine argument (reasoning.py); a run that bounds the
        thinking of a model that does not think is refused before vLLM starts."""
        model = self.config.model
        args = self.settings.args
        source = args.get("tokenizer", args["model"])
        template = self.chat_template or own_chat_template(source, model.model_revision)
        name = parser_name(model, template, self.api.reasoning_parser_names, source)
        args.pop("reasoning_parser", None)
        if name is not None:
            args["reasoning_parser"] = name
        refusal = budget_refusal(name, model)
        if refusal and self.config.generation.max_reasoning_tokens is not None:
            raise ConfigError(refusal)

    def _check_reasoning_effort(self) -> None:
        """`generation.reasoning_effort` in the recipe, refused at start where the chat template
        cannot read it (a row's own is refused in that row)."""
        params = self.config.generation
        if params.reasoning_effort is None or self.config.task != "generate":
            return
        probe = Request("recipe", [Message("user", "")], params)
        try:
            template_switches(template_text(self.scheduler.chat_template()), probe, self.model_name)
        except RequestError as exc:
            raise ConfigError(str(exc)) from exc

    def _check_pooling(self, task: str, pooling_task: str | None) -> bool:
        """Whether the model scores as a cross-encoder (vLLM's `classify` head on each pair);
        UnsupportedParamError, in one line, where it cannot do the run's task."""
        if task == "generate":
            return False
        label = f"task: {task}: model '{self.model_name}'"
        hf_config = self.scheduler.llm.model_config.hf_config
        count = getattr(hf_config, "num_labels", 1)
        if task in CLASSIFYING_TASKS:
            self._read_head(label, pooling_task)
            return False
        if task == "embed" and pooling_task == "classify" and count != 1:
            raise UnsupportedParamError(
                f"{label} is a classifier with {count} labels: it has no vectors to give; use "
                f"task classify, or an embedding model"
            )
        if task == "embed" and pooling_task == "classify":
            raise UnsupportedParamError(
                f"{label} is a cross-encoder: it scores pairs and cannot embed; use task score "
                f"or rerank, or an embedding model"
            )
        if task == "embed" and pooling_task != "embed":
            raise UnsupportedParamError(
                f"{label} gives no vectors in vLLM's pooling runner, so it cannot embed; use an "
                f"embedding model"
            )
        if pooling_task == "classify":
            if count != 1:
                raise UnsupportedParamError(
                    f"{label} is a classifier with {count} labels; a cross-encoder for "
                    f"scoring has one. Use task classify"
                )
            self.pair_format = self.api.pair_format(self.scheduler.llm)
            if self.pair_format == "template":
                raise UnsupportedParamError(
                    f"{label} builds its (query, document) prompts with a score template of "
                    f"its own, which lmpress's VLLM engine does not apply; serve it with vllm "
                    f"serve and score through engine REMOTE_VLLM"
                )
            return True
        if pooling_task != "embed":
            raise UnsupportedParamError(
                f"{label} neither embeds nor classifies pairs in vLLM's pooling runner, so it "
                f"cannot score; use a cross-encoder or an embedding model"
            )
        return False

    def _read_head(self, label: str, pooling_task: str | None) -> None:
        """The labels of a classify or reward run's head, from the model's config; refused,
        in one line, where vLLM pools the model for anything but its classification head."""
        hf_config = self.scheduler.llm.model_config.hf_config
        if pooling_task != "classify":
            architecture = (getattr(hf_config, "architectures", None) or ["none declared"])[0]
            raise UnsupportedParamError(
                f"{label} has no classification head ({architecture}), so engine VLLM cannot "
                f"{self.config.task} with it; use a sequence-classification model "
                f"(…ForSequenceClassification)"
            )
        count = getattr(hf_config, "num_labels", 1)
        self.labels = labels_of(getattr(hf_config, "id2label", None), count)
        self.activation = activation_of(count, getattr(hf_config, "problem_type", None))

    @property
    def adapter_names(self) -> frozenset[str]:
        return frozenset(self.scheduler.loras.by_name)

    async def load_adapter(self, name: str, path: str) -> None:
        """vLLM's own loading at run time (AsyncLLM.add_lora, what `vllm serve` answers
        /v1/load_lora_adapter with), checked first (lora.py)."""
        loras, scheduler = self.scheduler.loras, self.scheduler
        if loras.default is not None:
            raise UnsupportedParamError(
                "model.adapter_model runs on every row, so engine VLLM loads no other adapter"
            )
        spare = self.api.spare_lora_slot()
        path = loadable_path(self.settings.args, set(loras.by_name), name, path, spare=spare)
        request = loras.new(name, path)
        try:
            loaded = await scheduler.on_engine_loop(scheduler.llm.add_lora(request))
        except Exception as exc:
            raise RequestError(f"vLLM could not load adapter '{name}': {describe(exc)}") from exc
        if loaded is False:
            raise RequestError(f"vLLM did not load adapter '{name}' from {path}")
        loras.by_name[name] = request

    async def unload_adapter(self, name: str) -> None:
        """vLLM's own unloading (AsyncLLM.remove_lora); rows naming it fail with 404 after."""
        request = self.scheduler.loras.by_name.pop(name, None)
        if request is None:
            raise RequestError(f"adapter '{name}' is not loaded", ErrorKind.NOT_FOUND, 404)
        await self.scheduler.on_engine_loop(self.scheduler.llm.remove_lora(request.lora_int_id))

    def tokenizer(self) -> Tokenizer:
        """vLLM's own tokenizer, the one its engine reads prompts with; the context is
        vLLM's max_model_len as it settled it at start."""
        scheduler = self.scheduler
        return HfTokenizer(scheduler.tokenizer, self.api.max_model_len(scheduler.llm))

    def stream(self, request: Request) -> AsyncIterator[Delta | Result]:
        self._check_generates()
        return self.scheduler.run(request, deltas=True)

    def _check_generates(self) -> None:
        if self.config.task != "generate":
            raise UnsupportedParamError(
                f"engine VLLM was started for task {self.config.task} (vLLM's pooling runner), "
                f"which does not generate text"
            )

    async def complete(self, request: Request) -> Result:
        self._check_generates()
        result = None
        async for item in self.scheduler.run(request, deltas=False):
            result = item
        assert isinstance(result, Result)
        return result

    # vLLM's pooling runner, started for any of the pooling tasks, answers both: an embedding
    # model embeds, and scores by its vectors' cosine similarity, as vLLM's LLM.score does; a
    # cross-encoder scores each pair by its classification head's logit, and cannot embed. A
    # run of classify or reward answers `embed` with each input's head values (`_classify`).

    async def embed(self, request: EmbedRequest) -> EmbedResult:
        self._check_pools("embed")
        if self.cross_encoder:  # started for score or rerank: it has no vectors to give
            message = (
                f"model '{self.model_name}' is a cross-encoder: it scores pairs and cannot embed"
            )
            info = ErrorInfo(ErrorKind.UNSUPPORTED_PARAM, message)
            return EmbedResult(request.id, [], Usage(), self.model_name, self.name, error=info)
        if self.labels is not None:
            return await self._classify(request)
        return finish_embeddings(await self.scheduler.embed(request), request)

    async def _classify(self, request: EmbedRequest) -> EmbedResult:
        """Each input's head values as the run's task gives them, labelled. vLLM gives the raw
        values (no activation) and lmpress applies classify's activation itself, by the rule
        NATIVE and LLAMACPP apply (vocabulary/classifier.py), in float64: one rule for every
        engine and vLLM version, where vLLM's own activation has changed between versions."""
        if request.dimensions is not None:
            message = (
                f"dimensions: {request.dimensions}: task {self.config.task} gives one value per "
                f"label, which cannot be cut; leave dimensions out"
            )
            info = ErrorInfo(ErrorKind.UNSUPPORTED_PARAM, message)
            return EmbedResult(request.id, [], Usage(), self.model_name, self.name, error=info)
        result = await self.scheduler.embed(request, head=True)
        result.labels = self.labels
        for embedding in result.embeddings:
            values = activated([embedding.vector], self.config.task, self.activation)
            embedding.vector = values[0]
        return finish_embeddings(result, request)

    async def score(self, request: ScoreRequest) -> ScoreResult:
        self._check_pools("score")
        if self.labels is not None:  # started for classify or reward: no pairs to score
            message = (
                f"task: engine {self.name} was started for {self.config.task}; run it with "
                f"task: score to score"
            )
            info = ErrorInfo(ErrorKind.UNSUPPORTED_PARAM, message)
            return ScoreResult(request.id, model=self.model_name, engine=self.name, error=info)
        return await self.scheduler.score(request, cross_encoder=self.cross_encoder)

    def _check_pools(self, call: str) -> None:
        if self.config.task == "generate":
            raise UnsupportedParamError(
                f"engine VLLM was started for task generate: {call} needs vLLM's pooling "
                f"runner, which task: embed, score, rerank, classify or reward starts"
            )

    async def aclose(self) -> None:
        await self.scheduler.aclose()


def check_gpus(settings: EngineSettings, visible: list[str]) -> None:
    """Refuse a data-parallel run that needs more GPUs than this process sees, before vLLM
    starts: vLLM finds out only while starting its engine processes, one per copy."""
    if len(visible) < settings.gpus:
        shown = ",".join(visible) or "none"
        raise ConfigError(
            f"model.model_kwargs.data_parallel_size: {settings.data_parallel_size} copies of the "
            f"model need {settings.gpus} GPUs (data x tensor x pipeline parallel size), but "
            f"{len(visible)} are visible (CUDA_VISIBLE_DEVICES: {shown})"
        )
