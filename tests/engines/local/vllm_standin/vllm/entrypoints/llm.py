"""Stand-in for vllm/entrypoints/llm.py: the offline LLM class, as far as
benchmarks/vllm_check.py uses it (LLM(model, **engine_args).chat(conversations, params))."""

import asyncio
from types import SimpleNamespace
from typing import Any

from vllm.engine.arg_utils import EngineArgs
from vllm.sampling_params import RequestOutputKind, SamplingParams
from vllm.v1.engine.async_llm import AsyncLLM, _check_engine_args


class LLM:
    def __init__(self, model: str, **kwargs: Any) -> None:
        kwargs.setdefault("disable_log_stats", True)
        engine_args = EngineArgs(model=model, **kwargs)
        engine_args.enable_log_requests = False
        _check_engine_args(engine_args)
        self._engine = AsyncLLM(engine_args)
        # vLLM's LLM holds an LLMEngine whose engine_core client is stopped by shutdown();
        # the one AsyncLLM stands for both here.
        self.llm_engine = SimpleNamespace(engine_core=self._engine)
        self._counter = 0

    def get_tokenizer(self):
        return self._engine.get_tokenizer()

    def chat(
        self,
        messages,
        sampling_params: SamplingParams | None = None,
        use_tqdm: bool = True,
        lora_request: Any = None,
        chat_template: str | None = None,
        chat_template_content_format: str = "auto",
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: Any = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        mm_processor_kwargs: dict[str, Any] | None = None,
    ):
        conversations = messages if messages and isinstance(messages[0], list) else [messages]
        params = sampling_params or SamplingParams()
        params.output_kind = RequestOutputKind.FINAL_ONLY
        tokenizer = self.get_tokenizer()
        prompts = []
        for conversation in conversations:
            parsed, images = _parse_images(conversation)
            text = tokenizer.apply_chat_template(
                parsed,
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
                chat_template=chat_template,
            )
            prompts.append(
                {"prompt": text, **({"multi_modal_data": {"image": images}} if images else {})}
            )

        async def one(prompt: dict):
            self._counter += 1
            async for output in self._engine.generate(
                prompt,
                params,
                str(self._counter),
                lora_request=lora_request,
                tokenization_kwargs={"add_special_tokens": False},
            ):
                final = output
            return final

        async def run_all():
            return await asyncio.gather(*(one(p) for p in prompts))

        return asyncio.run(run_all())


def _parse_images(conversation: list[dict]) -> tuple[list[dict], list[Any]]:
    """As vLLM's chat parsing does for a template that reads parts ("openai" content format):
    an image_url part becomes {"type": "image"} and its image (data: URLs only, here) goes to
    multi_modal_data."""
    import base64
    import io

    from PIL import Image

    parsed, images = [], []
    for message in conversation:
        content = message["content"]
        if isinstance(content, list):
            parts = []
            for part in content:
                if part["type"] == "image_url":
                    data = part["image_url"]["url"].partition(",")[2]
                    images.append(Image.open(io.BytesIO(base64.b64decode(data))).convert("RGB"))
                    parts.append({"type": "image"})
                else:
                    parts.append(part)
            content = parts
        parsed.append({**message, "content": content})
    return parsed, images
