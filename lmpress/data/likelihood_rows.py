"""The rows of a loglikelihood or perplexity run (`vocabulary/likelihood.py`), both ways.

Input:
- loglikelihood: {"context": "...", "continuation": "..."}, or {"context": "...", "choices":
  ["...", ...], "gold"?: index}: each continuation is scored as the text that follows the
  context, as written (a choice that starts a new word carries its space, or the context ends
  with one: trailing spaces move to the continuation, as lm-eval splits them)
- perplexity: {"text": "..."}, or a table's `--text-column`
Output: the input row with, for one continuation, `logprob`, `is_greedy` and `tokens`; for
choices, `choice_logprobs`, `choice_is_greedy` and `choice_tokens` (one each, in order), `best`
(the index of the likeliest) and, where the row gave `gold`, `correct`; for a text,
`logprob`, `tokens` and `perplexity`. The names differ between the two loglikelihood forms
so that a Parquet column has one type. A `response` record beside them holds the usage,
model, engine and latency, as a pooling row's does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lmpress.data import openai_batch
from lmpress.data.columns import RowMapping
from lmpress.data.messages import RowError, json_type, row_shape
from lmpress.data.pooling_rows import meta as response_record
from lmpress.vocabulary.embeddings import Task
from lmpress.vocabulary.likelihood import (
    ChoicesRequest,
    LoglikelihoodResult,
    PerplexityRequest,
    PerplexityResult,
)

# The output values of a row, as a Parquet column of each is typed.
COLUMN_TYPES = {
    "logprob": "float64", "is_greedy": "bool", "tokens": "int64", "perplexity": "float64",
    "choice_logprobs": "floats", "choice_is_greedy": "bools", "choice_tokens": "ints",
    "best": "int64", "correct": "bool",
}  # fmt: skip
COLUMNS = tuple(COLUMN_TYPES)


@dataclass
class LikelihoodInput:
    """What a row asks of a loglikelihood or perplexity run."""

    task: Task  # the run's
    context: str = ""
    continuations: list[str] | None = None  # loglikelihood
    single: bool = True  # the row gave one `continuation`, not `choices`
    gold: int | None = None  # the index of the right choice, where the row says
    text: str | None = None  # perplexity

    def request(self, rid: str) -> ChoicesRequest | PerplexityRequest:
        if self.task == "perplexity":
            assert self.text is not None
            return PerplexityRequest(rid, self.text)
        assert self.continuations is not None
        return ChoicesRequest(rid, self.context, self.continuations)


def row_input(raw: dict[str, Any], task: Task, mapping: RowMapping) -> LikelihoodInput:
    """A plain row's (or a table row's) input to a loglikelihood or perplexity run."""
    if task == "perplexity":
        column = mapping.text_column or "text"
        if column not in raw:
            hint = " (the --text-column)" if mapping.text_column else " (or --text-column COL)"
            raise RowError(f"{_shape_of(raw)} in a perplexity run; give '{column}'{hint}")
        return LikelihoodInput(task, text=_text(raw[column], column, empty=False))
    if "context" not in raw:
        raise RowError(
            f"{_shape_of(raw)} in a loglikelihood run; give 'context' and 'continuation' "
            f"(or 'choices', a list)"
        )
    context = _text(raw["context"], "context", empty=True)
    if ("continuation" in raw) == ("choices" in raw):
        raise RowError("give 'continuation' (one text) or 'choices' (a list), one of the two")
    if "continuation" in raw:
        if "gold" in raw:
            raise RowError("'gold' is the index of the right one of 'choices'; this row has none")
        continuation = _text(raw["continuation"], "continuation", empty=False)
        return LikelihoodInput(task, context, [continuation])
    choices = raw["choices"]
    if not isinstance(choices, list):
        raise RowError(f"'choices' must be a list of texts, got {json_type(choices)}")
    if not choices:
        raise RowError("'choices' is empty; give at least one text")
    texts = [_text(c, f"choices[{i}]", empty=False) for i, c in enumerate(choices)]
    gold = _gold(raw.get("gold"), len(texts))
    return LikelihoodInput(task, context, texts, single=False, gold=gold)


def _text(value: Any, key: str, empty: bool) -> str:
    if not isinstance(value, str):
        raise RowError(f"'{key}' must be text, got {json_type(value)}")
    if not empty and not value:
        raise RowError(f"'{key}' is empty; give it some text")
    return value


def _gold(value: Any, choices: int) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < choices:
        raise RowError(
            f"'gold' must be the index of the right choice, 0 to {choices - 1}, got {value!r}"
        )
    return value


def _shape_of(raw: dict[str, Any]) -> str:
    return row_shape(raw, (("messages", "chat"), ("prompt", "prompt"), ("input", "embed")))


# --- output -------------------------------------------------------------------------------


def values(asked: LikelihoodInput, result: LoglikelihoodResult | PerplexityResult) -> dict:
    """What a row gets: its continuations' scores, or its text's."""
    if isinstance(result, PerplexityResult):
        return {
            "logprob": result.logprob, "tokens": result.tokens,
            "perplexity": result.perplexity,
        }  # fmt: skip
    scores = result.scores
    if asked.single:
        only = scores[0]
        return {"logprob": only.logprob, "is_greedy": only.is_greedy, "tokens": only.tokens}
    out: dict[str, Any] = {
        "choice_logprobs": [s.logprob for s in scores],
        "choice_is_greedy": [s.is_greedy for s in scores],
        "choice_tokens": [s.tokens for s in scores],
        "best": result.best,
    }
    if asked.gold is not None:
        out["correct"] = result.best == asked.gold
    return out


def render(
    rid: str,
    raw: dict[str, Any],
    own_id: bool,
    asked: LikelihoodInput,
    result: LoglikelihoodResult | PerplexityResult,
    openai: bool,
) -> dict[str, Any]:
    """A finished row's line: the input row (with `id` where it had none of its own) with its
    scores and a `response` record; or (`--output-format openai`) an OpenAI Batch output line
    whose body holds the same, there being no OpenAI endpoint that scores."""
    scores, record = values(asked, result), response_record(result)
    if openai:
        return openai_batch.render_body(rid, {"object": asked.task, **scores, **record})
    return {**({} if own_id else {"id": rid}), **raw, **scores, "response": record}
