"""Input rows to Requests and Results back to output rows, whatever file they are stored in.

A *row shape* is what one row looks like; a *file format* (`data.file_formats`) is how the
file holding the rows is stored. Input row shapes (`RowShape`), detected row by row:
- chat:   {"messages": [...], "id"?, "metadata"?}   (OpenAI chat messages)
- oumi:   {"conversation_id", "messages": [...], "metadata"}   (Oumi conversations)
- prompt: {"prompt": "...", "system"?: "..."}   (a chat turn: the chat template applies)
- text:   {"text": "..."}   (raw text for a base model to continue: no chat template)
- template: any columns, with `--prompt-template` making the user turn from them
- openai_batch: {"custom_id", "method", "url", "body"}   (OpenAI Batch request lines)
- embed, score: the rows of an embed, score or rerank run (`RunConfig.task`), read and
  written by `data.pooling_rows`; a row of a shape the run's task does not take fails alone.
- likelihood: the rows of a loglikelihood or perplexity run, read and written by
  `data.likelihood_rows`.
  An OpenAI Batch line is read for the task its url asks, whatever the run's task.
Any row may carry its own `generation` overrides, a mapping of generation fields, and a
generating row an `adapter`, one of `model.adapters` (chosen in `batch.rows`, which knows the
run's names, as an OpenAI Batch line's `model` is). A chat or
Oumi row may offer `tools` (OpenAI function tools, Oumi's `Conversation.tools`) and a
`tool_choice`, which overrides `generation.tool_choice` for that row.

A conversation whose last turn is the assistant's (a saved chat replayed on another model)
has that turn regenerated: it is dropped, and the reply generated in its place.

Output rows follow the input by default (OpenAI Batch lines for OpenAI Batch input, the input
row with the reply appended for the others); `OutputShape` "lmpress" or "openai" forces one
(`--output-format lmpress|openai`). A reasoning model's thinking goes to `response.reasoning`
(each sample's to its own record), its length to `usage.reasoning_tokens`, and in an Oumi row
to the reply's `reasoning_content` too, the field Oumi's `Message` has for it; a model that
does not reason writes neither, so its rows are what they were.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from lmpress.data import likelihood_rows, openai_batch, pooling_rows
from lmpress.data.columns import RowMapping, TemplateError
from lmpress.data.likelihood_rows import LikelihoodInput
from lmpress.data.messages import RowError, json_type, parse_messages, regenerate_last_turn
from lmpress.data.pooling_rows import PoolingInput
from lmpress.data.response_records import reply_message, response_record
from lmpress.vocabulary.embeddings import LIKELIHOOD_TASKS, EmbedResult, ScoreResult, Task
from lmpress.vocabulary.likelihood import LoglikelihoodResult, PerplexityResult, Tokenizer
from lmpress.vocabulary.tools import ToolError, check_tool_choice, check_tools
from lmpress.vocabulary.types import (
    GENERATION_FIELDS,
    GenerationParams,
    Message,
    Request,
    Result,
    Sample,
)


class RowShape(str, Enum):
    """What one input row looks like (see above)."""

    CHAT = "chat"
    OUMI = "oumi"
    PROMPT = "prompt"
    TEXT = "text"
    TEMPLATE = "template"
    OPENAI_BATCH = "openai_batch"
    EMBED = "embed"
    SCORE = "score"
    LIKELIHOOD = "likelihood"

    def __str__(self) -> str:
        return self.value


class OutputShape(str, Enum):
    """What one output row looks like: `--output-format auto|lmpress|openai`."""

    AUTO = "auto"  # follow the input: OpenAI Batch lines for OpenAI Batch rows, else lmpress
    LMPRESS = "lmpress"  # the input row with the reply appended and a `response` record
    OPENAI = "openai"  # OpenAI Batch output lines

    def __str__(self) -> str:
        return self.value


# The keys a row's own id may be under, in the order they are looked for.
ID_KEYS = ("id", "custom_id", "conversation_id")


@dataclass
class ParsedRow:
    line: int  # 1-based line number in the input file
    id: str
    shape: RowShape
    raw: dict[str, Any]
    messages: list[Message]
    overrides: dict[str, Any] = field(default_factory=dict)
    prompt: str | None = None  # raw completion text (/v1/completions): no chat template
    url: str = openai_batch.CHAT_URL  # the endpoint an OpenAI Batch line asked for
    model: str | None = None  # the model an OpenAI Batch line named
    tools: list[dict[str, Any]] | None = None  # the function tools the row offers
    pooling: PoolingInput | None = None  # what an embed, score or rerank row asks
    likelihood: LikelihoodInput | None = None  # what a loglikelihood or perplexity row asks
    prompt_ids: list[int] | None = None  # a /v1/completions prompt given as token ids
    # The adapter the row generates with (None: the base model), as `batch.rows` chose it from
    # the row's `adapter` column or its line's `model` (engines/adapters.py).
    adapter: str | None = None

    def request(self, params: GenerationParams) -> Request:
        return Request(
            self.id, self.messages, params, prompt=self.prompt, tools=self.tools,
            prompt_ids=self.prompt_ids, adapter=self.adapter,
        )  # fmt: skip

    @property
    def task(self) -> Task:
        """What the row asks: an OpenAI Batch line by its url, any other row the run's task."""
        asked = self.pooling or self.likelihood
        return asked.task if asked is not None else "generate"


NO_MAPPING = RowMapping()


def row_id(raw: dict[str, Any], line: int, id_column: str | None = None) -> str:
    """A row's id: its `id_column`'s, else its own `id`, `custom_id` or `conversation_id`, else
    a stable hash of its content and position."""
    for key in id_keys(id_column):
        value = raw.get(key)
        if isinstance(value, (str, int)) and not isinstance(value, bool) and value != "":
            return str(value)
    digest = hashlib.sha256(
        json.dumps(raw, sort_keys=True, ensure_ascii=False).encode() + f"#{line}".encode()
    )
    return f"row-{digest.hexdigest()[:16]}"


def id_keys(id_column: str | None) -> tuple[str, ...]:
    """The keys a row's id is looked for under, in order."""
    return ID_KEYS if id_column is None else (id_column, *ID_KEYS)


def parse_row(
    raw: Any,
    line: int,
    regenerate: bool = True,
    mapping: RowMapping = NO_MAPPING,
    task: Task = "generate",
) -> ParsedRow:
    """Turn one decoded row into a ParsedRow, or raise RowError. `regenerate`: drop a trailing
    assistant turn to generate it anew (batch); chat's /load keeps it to continue. `mapping`:
    how a table's columns make the conversation (`data.columns`). `task`: the run's, which
    decides the shapes a row may have."""
    if not isinstance(raw, dict):
        raise RowError(f"expected a JSON object, got {json_type(raw)}")
    if openai_batch.is_batch_request(raw):
        return _parse_batch_request(raw, line)
    if task in LIKELIHOOD_TASKS:
        rid = row_id(raw, line, mapping.id_column)
        asked = likelihood_rows.row_input(raw, task, mapping)
        return ParsedRow(line, rid, RowShape.LIKELIHOOD, raw, [], likelihood=asked)
    if task != "generate":
        rid = row_id(raw, line, mapping.id_column)
        pooled = pooling_rows.row_input(raw, task, mapping)
        shape = RowShape.SCORE if task in ("score", "rerank") else RowShape.EMBED
        return ParsedRow(line, rid, shape, raw, [], pooling=pooled)
    overrides = _row_overrides(raw.get("generation"))
    tools = _row_tools(raw, overrides)
    rid = row_id(raw, line, mapping.id_column)
    if mapping.id_column is not None and raw.get(mapping.id_column) in (None, ""):
        raise RowError(f"row has no '{mapping.id_column}' (the --id-column)")
    if "messages" in raw:
        oumi = "conversation_id" in raw or _has_oumi_items(raw["messages"])
        shape = RowShape.OUMI if oumi else RowShape.CHAT
        messages = parse_messages(raw["messages"])
        messages = regenerate_last_turn(messages) if regenerate else messages
    elif mapping.prompt_template is not None:
        shape = RowShape.TEMPLATE
        try:
            messages = [Message("user", mapping.prompt(raw))]
        except TemplateError as exc:
            raise RowError(str(exc)) from None
    elif "prompt" in raw:
        shape = RowShape.PROMPT
        prompt = raw["prompt"]
        if not isinstance(prompt, str):
            raise RowError(f"'prompt' must be a string, got {json_type(prompt)}")
        messages = [Message("user", prompt)]
        system = raw.get("system")
        if system is not None:
            if not isinstance(system, str):
                raise RowError(f"'system' must be a string, got {json_type(system)}")
            messages.insert(0, Message("system", system))
    elif "text" in raw:
        text = raw["text"]
        if not isinstance(text, str):
            raise RowError(f"'text' must be a string, got {json_type(text)}")
        messages = [Message("user", text)]
        if tools:
            raise RowError("'tools' need a chat row ('messages' or 'prompt'), not raw 'text'")
        return ParsedRow(line, rid, RowShape.TEXT, raw, messages, overrides, prompt=text)
    elif "input" in raw or "query" in raw or "text_1" in raw:
        raise RowError(
            "an embed, score or rerank row in a generate run; run it with --task embed "
            "(or score, rerank)"
        )
    elif "context" in raw:
        raise RowError("a loglikelihood row in a generate run; run it with --task loglikelihood")
    else:
        keys = ", ".join(sorted(raw)[:12]) or "none"
        raise RowError(
            f"row has no 'messages', 'prompt' (a chat turn) or 'text' (raw text) (keys: {keys}); "
            f"--prompt-template makes the prompt from other columns, e.g. 'Summarize: {{text}}'"
        )
    if mapping.system is not None and messages[0].role != "system":
        messages.insert(0, Message("system", mapping.system))
    return ParsedRow(line, rid, shape, raw, messages, overrides, tools=tools)


def _row_tools(raw: dict[str, Any], overrides: dict[str, Any]) -> list[dict[str, Any]] | None:
    """A row's tools, and its own tool_choice (which wins over its `generation`'s) into
    `overrides`, both checked."""
    try:
        tools = check_tools(raw.get("tools"))
        if "tool_choice" in raw:
            overrides["tool_choice"] = check_tool_choice(raw["tool_choice"], tools)
        elif overrides.get("tool_choice") is not None and tools:
            check_tool_choice(overrides["tool_choice"], tools, "generation.tool_choice")
    except ToolError as exc:
        raise RowError(str(exc)) from None
    return tools


def _parse_batch_request(raw: dict[str, Any], line: int) -> ParsedRow:
    """An OpenAI Batch line, read for the task its url asks, whatever the run's."""
    custom_id = raw.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        raise RowError("'custom_id' must be a non-empty string")
    method = raw.get("method", "POST")
    if method != "POST":
        raise RowError(f"method {json.dumps(method)} is not supported (use POST)")
    url = raw.get("url")
    urls = (*openai_batch.URLS, *pooling_rows.URLS)
    if url not in urls:
        raise RowError(f"url {json.dumps(url)} is not supported by lmpress (use {', '.join(urls)})")
    body = raw.get("body")
    if not isinstance(body, dict):
        raise RowError(f"'body' must be an object, got {json_type(body)}")
    model = body.get("model") if isinstance(body.get("model"), str) else None
    if url in pooling_rows.URLS:
        pooled = pooling_rows.body_input(url, body)
        return ParsedRow(
            line, custom_id, RowShape.OPENAI_BATCH, raw, [], url=url, model=model, pooling=pooled
        )
    if url == openai_batch.CHAT_URL:
        if "messages" not in body:
            raise RowError("body has no 'messages'")
        messages = regenerate_last_turn(parse_messages(body["messages"]))
        sampling = openai_batch.body_sampling(body, url)
        overrides = _row_overrides(sampling.overrides)
        return ParsedRow(
            line, custom_id, RowShape.OPENAI_BATCH, raw, messages, overrides, None, url, model,
            sampling.tools,
        )  # fmt: skip
    prompt = openai_batch.body_prompt(body)
    overrides = _row_overrides(openai_batch.body_sampling(body, url).overrides)
    if isinstance(prompt, list):  # token ids, read as given
        return ParsedRow(
            line, custom_id, RowShape.OPENAI_BATCH, raw, [], overrides, None, url, model,
            prompt_ids=prompt,
        )  # fmt: skip
    messages = [Message("user", prompt)]
    return ParsedRow(
        line, custom_id, RowShape.OPENAI_BATCH, raw, messages, overrides, prompt, url, model
    )


def _has_oumi_items(messages: Any) -> bool:
    if not isinstance(messages, list):
        return False
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list) and any(
            isinstance(p, dict) and "content" in p and "text" not in p for p in content
        ):
            return True
    return False


def _row_overrides(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise RowError(f"'generation' must be an object, got {json_type(value)}")
    unknown = sorted(key for key in value if key not in GENERATION_FIELDS)
    if unknown:
        raise RowError(f"'generation' has unknown key '{unknown[0]}'")
    if "batch_size" in value:
        raise RowError("'generation.batch_size' applies to the whole job, not to one row")
    return dict(value)


def output_shape_for(row: ParsedRow, output_shape: OutputShape) -> OutputShape:
    """The shape of a row's output line: as asked, or following the input row's."""
    if OutputShape(output_shape) is OutputShape.AUTO:
        openai = row.shape is RowShape.OPENAI_BATCH
        return OutputShape.OPENAI if openai else OutputShape.LMPRESS
    return OutputShape(output_shape)


def render_row(
    row: ParsedRow,
    result: Result | EmbedResult | ScoreResult | LoglikelihoodResult | PerplexityResult,
    output_shape: OutputShape = OutputShape.AUTO,
    tokenizer: Callable[[], Tokenizer | None] = lambda: None,
) -> dict[str, Any]:
    """The output line for a completed row; an OpenAI Batch line that echoes token ids, or its
    prompt's tokens with logprobs, has their text from `tokenizer` (the engine's, loaded when
    first asked)."""
    if row.likelihood is not None:
        assert isinstance(result, (LoglikelihoodResult, PerplexityResult))
        openai = output_shape_for(row, output_shape) is OutputShape.OPENAI
        own_id = any(k in row.raw for k in ID_KEYS)
        line = likelihood_rows.render(row.id, row.raw, own_id, row.likelihood, result, openai)
        return _mark_cached(line, result)
    if row.pooling is not None:
        assert isinstance(result, (EmbedResult, ScoreResult))
        return _render_pooled(row, row.pooling, result, output_shape)
    assert isinstance(result, Result)
    if output_shape_for(row, output_shape) is OutputShape.OPENAI:
        # The model that generated, as vLLM's run-batch reports it, not the name requested.
        body = row.raw.get("body") if row.shape is RowShape.OPENAI_BATCH else None
        echoed = isinstance(body, dict) and body.get("echo")
        echo = (row.prompt_ids or row.prompt or "") if echoed else None
        logprobs = isinstance(body, dict) and body.get("logprobs") is not None
        line = openai_batch.render_output(
            row.id, row.url, result, result.model or row.model or "unknown", echo, logprobs,
            tokenizer() if echo is not None and (logprobs or isinstance(echo, list)) else None,
        )  # fmt: skip
        return _mark_cached(line, result)
    return _render_lmpress(row, result)


def _render_pooled(
    row: ParsedRow,
    pooled: PoolingInput,
    result: EmbedResult | ScoreResult,
    output_shape: OutputShape,
) -> dict[str, Any]:
    """An embed, score or rerank row's line: an OpenAI Batch output line in the endpoint's
    response shape, or the input row with its vectors or scores and a `response` record."""
    model = result.model or row.model or "unknown"
    if output_shape_for(row, output_shape) is OutputShape.OPENAI:
        url = row.url if row.url in pooling_rows.URLS else pooling_rows.task_url(pooled.task)
        body = pooling_rows.openai_body(url, pooled, result, model, row.id)
        return _mark_cached(openai_batch.render_body(row.id, body), result)
    out: dict[str, Any] = {} if any(k in row.raw for k in ID_KEYS) else {"id": row.id}
    if row.shape is RowShape.OPENAI_BATCH:
        out["custom_id"] = row.id
    else:
        out.update(row.raw)
    out.update(pooling_rows.values(pooled, result))
    out["response"] = pooling_rows.meta(result)
    return out


def _mark_cached(line: dict[str, Any], result: Any) -> dict:
    """An OpenAI Batch output line answered from the response cache says so beside its
    response, where a reader of the API's own lines finds nothing unexpected in the body."""
    if result.cached:
        line["cached"] = True
    return line


def render_failure(
    row_id: str | None, line: int, kind: str, message: str, status: int | None, openai: bool
) -> dict[str, Any]:
    """The OUT.errors.jsonl line for a failed row: its input line, id and why."""
    if openai:
        return {"line": line, **openai_batch.render_error(row_id, kind, message, status)}
    error: dict[str, Any] = {"kind": kind, "message": message}
    if status is not None:
        error["status"] = status
    return {"line": line, "id": row_id, "error": error}


def output_row_id(out: dict[str, Any], id_column: str | None = None) -> str | None:
    """The row id an output (or errors) line was written for."""
    if "custom_id" in out and ("response" in out or "error" in out) and "messages" not in out:
        value = out["custom_id"]  # an OpenAI Batch line: its `id` is the batch request's own
    else:
        value = next((out[k] for k in id_keys(id_column) if k in out), None)
    return None if value is None else str(value)


def _render_lmpress(row: ParsedRow, result: Result) -> dict[str, Any]:
    """The input with the reply appended and a `response` record. A prompt row becomes a
    messages row; a row without an id gets the one lmpress gave it, so a resumed job can tell
    it is done."""
    reply = reply_message(result.samples[0] if result.samples else Sample("", "stop"))
    if row.shape is RowShape.OUMI and result.samples and result.samples[0].reasoning is not None:
        # Oumi's Message has a field of its own for the thinking; an OpenAI chat message does
        # not (DeepSeek refuses `reasoning_content` sent back), so chat rows keep it in
        # `response.reasoning` only.
        reply["reasoning_content"] = result.samples[0].reasoning
    out: dict[str, Any] = {}
    if not any(k in row.raw for k in ID_KEYS):
        out["id"] = row.id  # the id lmpress gave it, or the --id-column's
    if row.shape is RowShape.OPENAI_BATCH:
        out["custom_id"] = row.id
        out["messages"] = [m.to_openai() for m in row.messages] + [reply]
    for key, value in row.raw.items():
        if row.shape is RowShape.OPENAI_BATCH:
            break
        if row.shape is RowShape.PROMPT and key == "prompt":
            out["messages"] = [m.to_openai() for m in row.messages] + [reply]
        elif row.shape is RowShape.PROMPT and key == "system":
            continue
        elif key == "messages":
            out["messages"] = [*value[: len(row.messages)], reply]
        else:
            out[key] = value
    if row.shape is RowShape.TEMPLATE:  # the conversation the template made, and its reply
        out["messages"] = [m.to_openai() for m in row.messages] + [reply]
    out["response"] = response_record(result)
    return out
