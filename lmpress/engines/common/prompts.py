"""Chat templates and prompts: the template a recipe names (`model.chat_template`), and a request
turned into prompt text and ids through a Hugging Face tokenizer's chat template, for the
engines that tokenize with one (NATIVE, VLLM). `HfPrompts` is that whole path, tool plans
included, so that NATIVE and its dry-run counts (`native/prompt_count.py`) share it.
LLAMACPP renders with llama-cpp-python's own formatter (llamacpp/prompts.py), from the
template `resolve_chat_template` gives."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lmpress.engines.common.tool_parsers import ToolPlan, tool_plan
from lmpress.vocabulary.chat_templates import NAMED_TEMPLATES
from lmpress.vocabulary.errors import ErrorKind, ModelLoadError, RequestError, first_line
from lmpress.vocabulary.images import load_images
from lmpress.vocabulary.types import ContentPart, Message, Request


def resolve_chat_template(value: str) -> str:
    """A named template, a path to a template file, or a literal Jinja template."""
    if value.lower() in NAMED_TEMPLATES:
        return NAMED_TEMPLATES[value.lower()]
    if "{{" in value or "{%" in value:
        return value
    path = Path(value).expanduser()
    if path.is_file():
        return path.read_text(encoding="utf-8")
    raise ModelLoadError(
        f"model.chat_template: '{value}' is not a template name "
        f"({', '.join(NAMED_TEMPLATES)}), a file, or a Jinja template"
    )


def render_chat_prompt(
    tokenizer: Any,
    request: Request,
    engine: str,
    model: str,
    chat_template: str | None = None,
    template_kwargs: dict[str, Any] | None = None,
    tool_plan: ToolPlan | None = None,
    reads_images: bool = False,
) -> str:
    """The prompt text for a chat request; the template writes BOS and the other special
    tokens itself. `template_kwargs` (model.chat_template_kwargs, e.g. enable_thinking) are
    variables the template reads. `reads_images`: the model takes images, so each message's
    content goes to the template as parts ({"type": "image"} where an image was given, as
    vision-language processors' templates expect), for it to place the image tokens. A row the
    template cannot render fails as a RequestError."""
    if not reads_images and any(m.has_images() for m in request.messages):
        raise RequestError(
            f"model '{model}' on the {engine} engine reads text only; this row has image parts "
            f"(use a vision-language model)",
            kind=ErrorKind.INVALID_REQUEST,
        )
    options: dict[str, Any] = {
        **(template_kwargs or {}),
        "tokenize": False,
        "add_generation_prompt": True,
    }
    if chat_template:
        options["chat_template"] = chat_template
    elif not getattr(tokenizer, "chat_template", None):
        raise RequestError(
            f"model '{model}' has no chat template; set model.chat_template "
            f"(a Jinja string, a template file, or 'chatml')",
            kind=ErrorKind.INVALID_REQUEST,
        )
    messages = [template_message(m, reads_images) for m in request.messages]
    if tool_plan is not None:  # tools offered, or turns that called them (tool_parsers.py)
        messages = tool_plan.messages
        if tool_plan.tools:
            options["tools"] = tool_plan.tools
    try:
        return tokenizer.apply_chat_template(messages, **options)
    except Exception as exc:  # Jinja raises its own errors for refused conversations
        raise RequestError(f"chat template failed: {exc}", kind=ErrorKind.INVALID_REQUEST) from exc


def template_message(message: Message, as_parts: bool) -> dict[str, Any]:
    """A message as a chat template reads it: its text, or (`as_parts`) its parts in order,
    an image as {"type": "image"} (its pixels go to the processor, not the template)."""
    if not as_parts:
        return {"role": message.role, "content": message.text()}
    parts = (
        [ContentPart("text", text=message.content)]
        if isinstance(message.content, str)
        else message.content
    )
    content = [
        {"type": "text", "text": part.text or ""} if part.type == "text" else {"type": "image"}
        for part in parts
    ]
    return {"role": message.role, "content": content}


class HfPrompts:
    """A request's prompt ids through a Hugging Face tokenizer: what NATIVE feeds its model,
    what vLLM tokenizes, and what the dry run counts. A raw `prompt` takes the tokenizer's own
    special tokens (BOS, where it adds one); a chat is the template's text, which writes them
    itself. `takes_tools`: whether tools and earlier tool calls go into the prompt (a plan from
    tool_parsers.py), as on an engine that takes them. `processor`: a vision-language model's
    processor (AutoProcessor), which turns a prompt with images into its ids, each image
    expanded into its tokens, and the pixel inputs that go with them."""

    def __init__(
        self,
        tokenizer: Any,
        engine: str,
        model: str,
        *,
        parser: str | None = None,
        template_kwargs: dict[str, Any] | None = None,
        chat_template: str | None = None,
        takes_tools: bool = True,
        processor: Any = None,
    ):
        self.tokenizer = tokenizer
        self.processor = processor
        self.engine = engine
        self.model = model
        self.parser = parser
        self.template_kwargs = template_kwargs
        self.chat_template = chat_template
        self.takes_tools = takes_tools

    def plan(self, request: Request) -> ToolPlan | None:
        """The request's tool plan (None: no tools, or an engine that takes none)."""
        if not self.takes_tools:
            return None
        template = self.chat_template or getattr(self.tokenizer, "chat_template", None)
        return tool_plan(request, template, self.parser)

    def encode(self, request: Request, plan: ToolPlan | None = None) -> list[int]:
        """The prompt's token ids: the chat template applied, or the raw prompt."""
        return self.inputs(request, plan)[0]

    def inputs(
        self,
        request: Request,
        plan: ToolPlan | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> tuple[list[int], dict[str, Any] | None]:
        """The prompt's token ids, and for a prompt with images the processor's image inputs
        (pixel_values and whatever else the model takes with them); None without images.
        `template_kwargs`: this request's own template variables (its reasoning_effort's),
        over the recipe's."""
        if request.prompt_ids is not None:  # as given: no template, no special tokens added
            return list(request.prompt_ids), None
        if request.prompt is not None:
            return list(self.tokenizer(request.prompt)["input_ids"]), None
        text = render_chat_prompt(
            self.tokenizer,
            request,
            self.engine,
            self.model,
            self.chat_template,
            {**(self.template_kwargs or {}), **(template_kwargs or {})},
            plan,
            reads_images=self.processor is not None,
        )
        images = load_images(request) if self.processor is not None else []
        if not images:
            return list(self.tokenizer(text, add_special_tokens=False)["input_ids"]), None
        try:
            processed = dict(
                self.processor(
                    text=[text], images=[images], add_special_tokens=False, return_tensors="pt"
                )
            )
        except Exception as exc:  # the processor's refusals (image tokens that do not match)
            raise RequestError(
                f"the model's processor refused this row's {len(images)} image(s): "
                f"{first_line(exc)}",
                kind=ErrorKind.INVALID_REQUEST,
            ) from exc
        ids = processed.pop("input_ids")[0].tolist()
        processed.pop("attention_mask", None)  # one prompt: all ones
        return ids, processed

    def count(self, request: Request) -> int:
        """How many tokens the prompt is, its tool plan included."""
        return len(self.encode(request, self.plan(request)))
