"""Prompts for LLAMACPP: a request rendered with llama-cpp-python's own chat formatter and
tokenized by the GGUF file's tokenizer, as its chat handler does. The engine feeds these ids
to its context; the dry run (`prompt_count.py`) counts them from a vocabulary-only load of
the same file, without the weights, so both go through this one class.
"""

from __future__ import annotations

from typing import Any

from lmpress.engines.common.tool_parsers import ToolPlan, tool_plan
from lmpress.engines.local.llamacpp.loading import Vocab
from lmpress.engines.local.llamacpp.projector import ImageSegment
from lmpress.vocabulary.errors import ErrorKind, RequestError
from lmpress.vocabulary.images import load_images
from lmpress.vocabulary.types import Message, Request


class GgufPrompts:
    """A request's prompt ids on a GGUF model: `model` is llama-cpp-python's `LlamaModel`
    (`Llama._model`, or one loaded with `vocab_only`), `chat_template` the recipe's or the
    file's (None: neither has one), `template_kwargs` the variables the template reads
    (model.chat_template_kwargs, e.g. enable_thinking)."""

    def __init__(
        self,
        model: Any,
        vocab: Vocab,
        chat_template: str | None,
        model_name: str,
        parser: str | None,
        projector: Any = None,
        template_kwargs: dict[str, Any] | None = None,
    ):
        self.model = model
        self.template_kwargs = template_kwargs or {}
        self.projector = projector  # projector.Projector: this model reads images
        self.vocab = vocab
        self.chat_template = chat_template
        self.model_name = model_name
        self.parser = parser
        self._formatter: Any = None

    def plan(self, request: Request) -> ToolPlan | None:
        """The request's tool plan (None: it neither offers tools nor holds calls of them)."""
        return tool_plan(request, self.chat_template, self.parser)

    def render(
        self,
        request: Request,
        plan: ToolPlan | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        """The chat template applied to a request's messages, as llama-cpp-python renders it;
        `template_kwargs`: this request's own variables (its reasoning_effort's)."""
        if self._formatter is None:
            from llama_cpp.llama_chat_format import Jinja2ChatFormatter

            eos = self.model.token_eos()
            self._formatter = Jinja2ChatFormatter(
                template=self.chat_template,
                eos_token=self.vocab.text(eos),
                bos_token=self.vocab.text(self.model.token_bos()),
                stop_token_ids=[eos],
            )
        messages = [{"role": m.role, "content": self._content(m)} for m in request.messages]
        tools = None
        if plan is not None:  # tools offered, or turns that called them (tool_calls.py)
            messages, tools = plan.messages, plan.tools
        try:
            variables = {**self.template_kwargs, **(template_kwargs or {})}
            return self._formatter(messages=messages, tools=tools, **variables).prompt
        except Exception as exc:  # Jinja raises its own errors for refused conversations
            raise RequestError(
                f"chat template failed: {exc}", kind=ErrorKind.INVALID_REQUEST
            ) from exc

    def _content(self, message: Message) -> str:
        """A message's text; with a projector, each image as mtmd's marker, where it was."""
        if self.projector is None or isinstance(message.content, str):
            return message.text()
        marker = self.projector.marker + "\n"
        return "".join(marker if p.type == "image_url" else p.text or "" for p in message.content)

    def encode(self, request: Request, plan: ToolPlan | None = None) -> list[int]:
        """The prompt's token ids: the chat template applied, or the raw prompt."""
        return self.inputs(request, plan)[0]

    def inputs(
        self,
        request: Request,
        plan: ToolPlan | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> tuple[list[int], list[ImageSegment] | None]:
        """The prompt's token ids and, for a prompt with images, its image segments (their
        tokens are negative ids in the list, see projector.py); None without images."""
        if request.prompt_ids is not None:
            return self._given_ids(request.prompt_ids), None
        images = []
        if request.prompt is None and any(m.has_images() for m in request.messages):
            if self.projector is None:
                raise RequestError(
                    "the LLAMACPP engine sends text only unless model.model_kwargs.mmproj names "
                    "the model's projector GGUF; this row has image parts",
                    kind=ErrorKind.INVALID_REQUEST,
                )
            images = load_images(request)
        if request.prompt is not None:
            ids = self.model.tokenize(request.prompt.encode("utf-8"), add_bos=True, special=True)
        else:
            if not self.chat_template:
                raise RequestError(
                    f"model '{self.model_name}' has no chat template in its GGUF metadata; set "
                    f"model.chat_template (a Jinja string, a template file, or 'chatml')",
                    kind=ErrorKind.INVALID_REQUEST,
                )
            # As llama-cpp-python's chat handler does: the template emits BOS itself.
            text = self.render(request, plan, template_kwargs)
            if images:
                return self.projector.tokenize(text, images)
            ids = self.model.tokenize(text.encode("utf-8"), add_bos=False, special=True)
        if not ids:
            raise RequestError("the prompt is empty", kind=ErrorKind.INVALID_REQUEST)
        return list(ids), None

    def _given_ids(self, ids: list[int]) -> list[int]:
        """A prompt given as token ids, read as given (no template, no BOS), checked."""
        if not ids:
            raise RequestError("the prompt is empty", kind=ErrorKind.INVALID_REQUEST)
        bad = next((t for t in ids if not 0 <= t < self.vocab.size), None)
        if bad is not None:
            raise RequestError(
                f"the prompt's token id {bad} is not a token of this model (0 to "
                f"{self.vocab.size - 1}); send ids from this model's tokenizer",
                kind=ErrorKind.INVALID_REQUEST,
            )
        return list(ids)

    def count(self, request: Request) -> int:
        """How many tokens the prompt is, its tool plan included."""
        return len(self.encode(request, self.plan(request)))
