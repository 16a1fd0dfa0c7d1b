"""Chat templates and prompts: the template a recipe names (`model.chat_template`), and a request
turned into prompt text and ids through a Hugging Face tokenizer's chat template, for the
engines that tokenize with one (NATIVE, VLLM). `HfPrompts` is that whole path, tool plans
included, so that NATIVE and the dry run's token counts (`lmpress.prompt_tokens`) share it.
LLAMACPP renders with llama-cpp-python's own formatter (llamacpp/prompts.py), from the
template `resolve_chat_template` gives."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lmpress.engines.common.tool_calls import ToolPlan, tool_plan
from lmpress.errors import ModelLoadError, RequestError
from lmpress.types import Request

CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
NAMED_TEMPLATES = {"chatml": CHATML_TEMPLATE, "chat_ml": CHATML_TEMPLATE}


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
) -> str:
    """The prompt text for a text-only chat request; the template writes BOS and the other
    special tokens itself. `template_kwargs` (model.chat_template_kwargs, e.g.
    enable_thinking) are variables the template reads. A row the template cannot render
    fails as a RequestError."""
    if any(m.has_images() for m in request.messages):
        raise RequestError(
            f"the {engine} engine in lmpress sends text only; this row has image parts",
            kind="invalid_request",
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
            kind="invalid_request",
        )
    messages = [{"role": m.role, "content": m.text()} for m in request.messages]
    if tool_plan is not None:  # tools offered, or turns that called them (tool_calls.py)
        messages = tool_plan.messages
        if tool_plan.tools:
            options["tools"] = tool_plan.tools
    try:
        return tokenizer.apply_chat_template(messages, **options)
    except Exception as exc:  # Jinja raises its own errors for refused conversations
        raise RequestError(f"chat template failed: {exc}", kind="invalid_request") from exc


class HfPrompts:
    """A request's prompt ids through a Hugging Face tokenizer: what NATIVE feeds its model,
    what vLLM tokenizes, and what the dry run counts. A raw `prompt` takes the tokenizer's own
    special tokens (BOS, where it adds one); a chat is the template's text, which writes them
    itself. `takes_tools`: whether tools and earlier tool calls go into the prompt (a plan from
    tool_calls.py), as on an engine that takes them."""

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
    ):
        self.tokenizer = tokenizer
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
        if request.prompt is not None:
            return list(self.tokenizer(request.prompt)["input_ids"])
        text = render_chat_prompt(
            self.tokenizer,
            request,
            self.engine,
            self.model,
            self.chat_template,
            self.template_kwargs,
            plan,
        )
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def count(self, request: Request) -> int:
        """How many tokens the prompt is, its tool plan included."""
        return len(self.encode(request, self.plan(request)))
