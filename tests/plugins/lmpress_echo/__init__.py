"""A third-party engine for tests, registered through the `lmpress.engines` entry point.

ECHO replies with a transcript of exactly what it received, word by word, so tests can check
what a front sent to the engine. `generation.max_new_tokens` caps the words; the environment
variable ECHO_DELAY_S slows each word down (to interrupt a reply mid-stream), ECHO_WARN
makes it warn as a library does about its own deprecated API, once per reply, and
ECHO_GATE, a file path, holds every reply until that file exists (to keep a job running
until a test has done what it must while the job runs). ECHO_THINK makes it a reasoning model:
each sample streams that text, word by word, as its thinking before the transcript, as the
local engines stream a thinking block (`Delta.reasoning`), and counts it in the usage;
`generation.max_reasoning_tokens` cuts it to that many words, `reasoning_effort: none` drops
it, and an earlier turn's thinking shows in the transcript as that message's `reasoning`.
ECHO_RAISE makes every reply raise RuntimeError with that text, as an engine's bug would.
ECHO_HANG_START, a file path, makes an engine created while that file exists never finish
starting (as a Ray replica whose restart cannot end).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import warnings

from lmpress.engines.base import Engine
from lmpress.vocabulary.types import Delta, Request, Result, Sample, Usage


class EchoEngine(Engine):
    name = "ECHO"
    supported_params = frozenset(
        {"max_new_tokens", "temperature", "seed", "n", "stop_strings", "reasoning_effort",
         "max_reasoning_tokens"}
    )  # fmt: skip

    def __init__(self, config):
        super().__init__(config)
        hang = os.environ.get("ECHO_HANG_START")
        while hang and os.path.exists(hang):
            time.sleep(0.1)

    async def stream(self, request: Request):
        if os.environ.get("ECHO_RAISE"):
            raise RuntimeError(os.environ["ECHO_RAISE"])
        delay = float(os.environ.get("ECHO_DELAY_S", "0"))
        if os.environ.get("ECHO_WARN"):
            warnings.warn("ECHO's `transcript` is deprecated: use `record`", FutureWarning, 1)
        gate = os.environ.get("ECHO_GATE")
        while gate and not os.path.exists(gate):
            await asyncio.sleep(0.02)
        transcript = json.dumps(
            # A message with images as OpenAI's parts; any other as its text.
            [
                {
                    "role": m.role,
                    "content": m.to_openai()["content"] if m.has_images() else m.text(),
                    **({"reasoning": m.reasoning} if m.reasoning is not None else {}),
                }
                for m in request.messages
            ]
            if request.prompt is None
            else request.prompt,
            ensure_ascii=False,
        )
        words = ("ECHO " + transcript).split(" ")
        limit = request.params.max_new_tokens
        think = os.environ.get("ECHO_THINK")
        thought = think.split(" ") if think else []
        if request.params.max_reasoning_tokens is not None:
            thought = thought[: request.params.max_reasoning_tokens]
        if request.params.reasoning_effort == "none":
            thought = []
        think = " ".join(thought) if thought else None
        samples = []
        for index in range(request.params.n):
            for i, word in enumerate(thought):
                yield Delta(request.id, word if not i else " " + word, index, reasoning=True)
            sent = []
            for word in words[:limit]:
                piece = word if not sent else " " + word
                sent.append(piece)
                yield Delta(request.id, piece, index)
                if delay:
                    await asyncio.sleep(delay)
            finish = "length" if len(words) > limit else "stop"
            samples.append(
                Sample(
                    "".join(sent),
                    finish,
                    completion_tokens=len(sent) + len(thought),
                    reasoning=think,
                    reasoning_tokens=len(thought),
                )
            )
        yield Result(
            request.id,
            samples,
            Usage(
                sum(len(m.text().split()) for m in request.messages),
                sum(s.completion_tokens for s in samples),
                sum(s.reasoning_tokens for s in samples),
            ),
            model=self.model_name or "echo",
            engine=self.name,
        )
