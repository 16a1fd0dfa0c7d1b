"""`lmpress infer PROMPT`: the smallest front, one request with its reply streamed to stdout."""

from __future__ import annotations

import sys
from typing import TextIO

from lmpress.configs.schema import RunConfig
from lmpress.engines.base import check_params
from lmpress.engines.registry import create_engine
from lmpress.vocabulary.images import image_part
from lmpress.vocabulary.types import ContentPart, Delta, Message, Request, Result


async def run_prompt(
    config: RunConfig,
    prompt: str,
    system: str | None = None,
    out: TextIO | None = None,
    raw: bool = False,
    image: str | None = None,
) -> int:
    """Stream the reply to `prompt`; with n > 1 each sample is printed after the first.
    `raw` sends the text as it is for the model to continue (no chat template), as a base
    model wants. Returns the exit code: 0, or 1 when the request failed."""
    out = out or sys.stdout
    messages = [
        Message("user", [image_part(image, "--image"), ContentPart("text", prompt)])
        if image
        else Message("user", prompt)
    ]
    if system:
        messages.insert(0, Message("system", system))
    engine = create_engine(config)
    request = Request("prompt", messages, config.generation, prompt=prompt if raw else None)
    check_params(engine, request.params)
    try:
        result: Result | None = None
        async for item in engine.stream(request):
            if isinstance(item, Delta) and item.index == 0:
                out.write(item.text)
                out.flush()
            elif isinstance(item, Result):
                result = item
    finally:
        await engine.aclose()
    assert result is not None
    if result.error:
        out.write("\n")
        print(f"lmpress: error: {result.error.message}", file=sys.stderr)
        return 1
    out.write("\n")
    for i, sample in enumerate(result.samples[1:], start=2):
        out.write(f"--- sample {i} ---\n{sample.text}\n")
    out.flush()
    return 0
