"""A chat request rendered to prompt text through a Hugging Face tokenizer's chat template,
for the engines that tokenize with one (NATIVE, VLLM)."""

from __future__ import annotations

from typing import Any

from lmpress.errors import RequestError
from lmpress.types import Request


def render_chat_prompt(
    tokenizer: Any,
    request: Request,
    engine: str,
    model: str,
    chat_template: str | None = None,
    template_kwargs: dict[str, Any] | None = None,
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
    try:
        return tokenizer.apply_chat_template(messages, **options)
    except Exception as exc:  # Jinja raises its own errors for refused conversations
        raise RequestError(f"chat template failed: {exc}", kind="invalid_request") from exc
