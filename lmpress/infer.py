"""`lmpress infer PROMPT`: the smallest front, one request with its reply streamed to stdout
(a reasoning model's thinking to stderr, dimmed on a terminal, so a pipe gets the answer
alone); with `--task embed`, the text's vector, with `--task score` or `rerank`, the
documents' scores against the text, with `--task classify` its labels' probabilities (likeliest
first), and with `--task reward` its reward."""

from __future__ import annotations

import json
import sys
from typing import TextIO

from lmpress.cache.responses import ResponseCache
from lmpress.chat.terminal import ThinkingView, why_cut
from lmpress.configs.schema import RunConfig
from lmpress.engines.base import check_params
from lmpress.engines.registry import create_engine
from lmpress.vocabulary.embeddings import (
    Classification,
    EmbedResult,
    Task,
    reward_of,
)
from lmpress.vocabulary.images import image_part
from lmpress.vocabulary.types import (
    ContentPart,
    Delta,
    GenerationParams,
    Message,
    Request,
    Result,
)


async def run_prompt(
    config: RunConfig,
    prompt: str,
    system: str | None = None,
    out: TextIO | None = None,
    raw: bool = False,
    image: str | None = None,
    err: TextIO | None = None,
    cache: str = "on",
    cache_dir: str | None = None,
) -> int:
    """Stream the reply to `prompt` to `out` and its thinking to `err`; with n > 1 each sample
    is printed after the first. `raw` sends the text as it is for the model to continue (no
    chat template), as a base model wants. A reply the response cache keeps (`cache`, as
    `lmpress batch --cache` takes it) is printed without loading the model. Returns the exit
    code: 0, or 1 when the request failed."""
    out = out or sys.stdout
    err = err or sys.stderr
    thinking = ThinkingView(err)
    messages = [
        Message("user", [image_part(image, "--image"), ContentPart("text", prompt)])
        if image
        else Message("user", prompt)
    ]
    if system:
        messages.insert(0, Message("system", system))
    request = Request("prompt", messages, config.generation, prompt=prompt if raw else None)
    say = lambda message: print(f"lmpress: {message}", file=err)  # noqa: E731
    responses = ResponseCache.open(config, cache, cache_dir, say)
    try:
        key, hit = responses.lookup(request) if responses else (None, None)
        if hit is not None:
            assert isinstance(hit, Result)
            say("from the response cache (--cache refresh generates it again)")
            thinking.show(hit.reasoning)
            out.write(hit.text)
            return _finish(hit, out, thinking, request.params, err)
        result = await _stream(config, request, out, thinking)
        if responses is not None and key is not None:
            responses.keep(key, result)
    finally:
        if responses is not None:
            responses.close()
    return _finish(result, out, thinking, request.params, err)


async def _stream(config: RunConfig, request: Request, out: TextIO, thinking: ThinkingView):
    engine = create_engine(config)
    check_params(engine, request.params)
    try:
        result: Result | None = None
        async for item in engine.stream(request):
            if isinstance(item, Delta) and item.index == 0 and item.reasoning:
                thinking.add(item.text)
            elif isinstance(item, Delta) and item.index == 0:
                thinking.end()
                out.write(item.text)
                out.flush()
            elif isinstance(item, Result):
                result = item
    finally:
        thinking.end()
        await engine.aclose()
    assert result is not None
    return result


def _finish(
    result: Result, out: TextIO, thinking: ThinkingView, params: GenerationParams, err: TextIO
) -> int:
    """The rest of a reply whose first sample's answer is printed: its thinking where the
    engine gave it only with the result, the other samples, a note on stderr when a limit cut
    it; the exit code."""
    if result.error:
        out.write("\n")
        print(f"lmpress: error: {result.error.message}", file=sys.stderr)
        return 1
    out.write("\n")
    out.flush()
    if not thinking.last:  # an engine that gave its thinking only with the result
        thinking.show(result.reasoning)
    for i, sample in enumerate(result.samples[1:], start=2):
        out.write(f"--- sample {i} ---\n")
        out.flush()
        thinking.show(sample.reasoning)
        out.write(f"{sample.text}\n")
    out.flush()
    cut = why_cut(result, params)
    if cut:
        hint = "" if cut.by_context else "; raise it with --generation.max_new_tokens N"
        print(f"lmpress: note: the reply was {cut.text}{hint}", file=err)
    return 0


SHOWN_VALUES = 8  # of a vector, printed without --json


async def run_pooled(
    config: RunConfig,
    text: str,
    documents: list[str],
    as_json: bool = False,
    out: TextIO | None = None,
) -> int:
    """Embed `text`, or score `documents` against it, as the config's task says; print the
    vector's size and first values (the scores, best first for rerank), or the row an embed
    or score run would write with `as_json`. Returns the exit code."""
    # Deferred: the pooling rows speak OpenAI's wire types, whose import is most of a second.
    from lmpress.data import pooling_rows
    from lmpress.data.pooling_rows import PoolingInput

    out = out or sys.stdout
    task: Task = config.task  # type: ignore[assignment]  # checked by configs.loading
    embeds = task in pooling_rows.INPUT_TASKS  # answered by embed
    if embeds:
        pooled = PoolingInput(task, [text])
    else:
        pooled = PoolingInput(task, query=text, documents=documents)
    engine = create_engine(config)
    try:
        request = pooled.request("prompt")
        result = await (
            engine.embed(request) if embeds else engine.score(request)  # type: ignore[arg-type]
        )
    finally:
        await engine.aclose()
    if result.error:
        print(f"lmpress: error: {result.error.message}", file=sys.stderr)
        return 1
    if as_json:
        row = {**pooling_rows.values(pooled, result), "response": pooling_rows.meta(result)}
        out.write(json.dumps(row, ensure_ascii=False) + "\n")
    elif isinstance(result, EmbedResult) and task == "classify":
        probs = Classification.of(result.embeddings[0].vector, result.labels or []).probs
        for label, prob in sorted(probs.items(), key=lambda pair: -pair[1]):
            out.write(f"{prob:.4f}  {label}\n")
    elif isinstance(result, EmbedResult) and task == "reward":
        reward = reward_of(result.embeddings[0].vector)
        values = reward if isinstance(reward, list) else [reward]
        out.write("  ".join(f"{value:.4f}" for value in values) + "\n")
    elif isinstance(result, EmbedResult):
        vector = [float(v) for v in result.embeddings[0].vector]
        shown = ", ".join(f"{v:.4f}" for v in vector[:SHOWN_VALUES])
        more = ", ..." if len(vector) > SHOWN_VALUES else ""
        out.write(f"{len(vector)} values: [{shown}{more}]\n")
    else:
        order = range(len(documents))
        if task == "rerank":
            order = [i for i, _ in sorted(enumerate(result.scores), key=lambda p: -p[1])]
        for i in order:
            out.write(f"{result.scores[i]:.4f}  {documents[i]}\n")
    out.flush()
    return 0
