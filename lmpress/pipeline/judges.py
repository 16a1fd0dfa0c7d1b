"""LLM-as-judge: what a judge step asks a model, and how it reads the answer.

A judge is the two ends of one model call, which the judge step makes: `messages(row)` builds
the conversation from the row's columns, `parse(reply)` reads the judgment into the columns
`makes` names, or raises JudgeReplyError, which fails that row alone (it goes to the rejects
with the start of the reply). The model call itself stays in the step, so that a judge's
requests are batched, cached, retried and counted as every other step's, and so that prompts
and parsing are tested here without a model.

The built-in judges (`judge:` in the step's settings):
- `single`: a rubric, the columns judged, a score scale (1-10 by default) -> `score` (an int
  within the scale) and `explanation`.
- `pairwise`: two answers to one question -> `winner` ("a", "b" or "tie") and `explanation`.
- `oumi`: one of Oumi's judge configs, file or inline (oumi_judges.py).
Each asks for a JSON object with the explanation first, so that the model reasons before it
commits to a verdict, and reads the reply tolerantly (replies.py). Each offers the JSON schema
of the reply it asks for (`reply_schema`), which a step may send as guided decoding.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import Field, field_validator, model_validator

from lmpress.configs.loading import suggest
from lmpress.data.columns import TemplateError
from lmpress.pipeline import replies
from lmpress.pipeline.replies import JudgeReplyError
from lmpress.pipeline.settings import StepSettings, validated
from lmpress.vocabulary.errors import ConfigError
from lmpress.vocabulary.types import Message

__all__ = ["Judge", "JudgeReplyError", "PairwiseJudge", "SingleJudge", "build_judge"]

KINDS = ("single", "pairwise", "oumi")


class Judge(Protocol):
    makes: tuple[str, ...]  # the columns `parse` returns
    reply_schema: dict[str, Any] | None  # the JSON schema of the reply asked for, if JSON

    def needs(self) -> set[str]:
        """The row columns `messages` reads."""
        ...

    def messages(self, row: dict[str, Any]) -> list[Message]:
        """The conversation that asks for this row's judgment."""
        ...

    def parse(self, text: str) -> dict[str, Any]:
        """The judgment in the reply, by column; JudgeReplyError when it is not there."""
        ...


def build_judge(
    settings: dict[str, Any], *, where: str = "", base_dir: Path | None = None
) -> Judge:
    """The judge a judge step's settings describe (the step's YAML mapping less its name,
    kind, model and generation).

    Args:
        settings: `judge:` (single, pairwise or oumi; single when not given) and that
            judge's keys.
        where: put in front of an error's line ("pipeline.yaml: step 'score': ").
        base_dir: where a relative path in the settings (an Oumi config) is found; the
            current directory when None.

    Raises:
        ConfigError: one line naming the key that is wrong.
    """
    settings = {"judge": "single", **settings}
    kind = settings["judge"]
    if kind not in KINDS:
        hint = suggest(str(kind), KINDS) or f" (one of {', '.join(KINDS)})"
        raise ConfigError(f"{where}judge: unknown judge {kind!r}{hint}")
    if kind == "single":
        return SingleJudge(validated(SingleSettings, settings, where))
    if kind == "pairwise":
        return PairwiseJudge(validated(PairwiseSettings, settings, where))
    from lmpress.pipeline.oumi_judges import OumiJudge, OumiSettings

    return OumiJudge(validated(OumiSettings, settings, where), where, base_dir or Path.cwd())


def column_text(row: dict[str, Any], column: str) -> str:
    """A column's value as the judge shows it: text as it is, other values as JSON."""
    if column not in row:
        raise TemplateError(f"the judge reads column '{column}', which this row lacks")
    value = row[column]
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def section(name: str, text: str) -> str:
    """One input of the judge, between tags: the bounds stay clear when the text itself holds
    blank lines or headings."""
    return f"<{name}>\n{text}\n</{name}>"


# --- single: one response graded against a rubric --------------------------------------------

SINGLE_SYSTEM = (
    "You are a strict, impartial grader. You judge a response against a rubric and answer "
    "with a JSON object only."
)


class SingleSettings(StepSettings):
    judge: Literal["single"]
    rubric: str = Field(min_length=1)
    # The judge's name for each input (shown to the model) -> the row column holding it; a
    # list of columns shows each under its own name.
    columns: dict[str, str] | list[str] = Field(min_length=1)
    scale: list[int] = Field(default=[1, 10], min_length=2, max_length=2)
    prefix: str = ""  # put before the output columns: judge_ -> judge_score
    system: str | None = None  # the system turn, instead of SINGLE_SYSTEM

    @field_validator("columns", mode="after")
    @classmethod
    def _named(cls, columns: dict[str, str] | list[str]) -> dict[str, str]:
        return columns if isinstance(columns, dict) else {column: column for column in columns}

    @model_validator(mode="after")
    def _scale_rises(self) -> SingleSettings:
        if self.scale[0] >= self.scale[1]:
            raise ValueError(f"scale: [{self.scale[0]}, {self.scale[1]}] must rise (e.g. [1, 10])")
        return self


class SingleJudge:
    """Grades one row's text (one column or several, e.g. a question and its answer) with an
    integer on a scale, and says why."""

    def __init__(self, settings: SingleSettings):
        self.settings = settings
        self.low, self.high = settings.scale
        self.makes = (f"{settings.prefix}score", f"{settings.prefix}explanation")
        self.reply_schema = _schema(
            {"type": "integer", "minimum": self.low, "maximum": self.high}, "score"
        )

    def needs(self) -> set[str]:
        return set(self.settings.columns.values())

    def messages(self, row: dict[str, Any]) -> list[Message]:
        inputs = [
            section(name, column_text(row, column))
            for name, column in self.settings.columns.items()
        ]
        ask = (
            f"Grade the above against the rubric with an integer from {self.low} to "
            f"{self.high}, where {self.high} is best. Answer with this JSON object only, the "
            f'explanation first:\n{{"explanation": "<one or two sentences>", "score": '
            f"<an integer from {self.low} to {self.high}>}}"
        )
        user = "\n\n".join([f"Rubric:\n{self.settings.rubric.strip()}", *inputs, ask])
        return [
            Message("system", self.settings.system or SINGLE_SYSTEM),
            Message("user", user),
        ]

    def parse(self, text: str) -> dict[str, Any]:
        value, explanation = _verdict(text, "score", replies.NUMBER + r"(?:\s*/\s*\d+)?")
        if value is None:
            raise JudgeReplyError(f"no score in the judge's reply {replies.quote(text)}")
        score = replies.as_int(value)
        if score is None:
            raise JudgeReplyError(f"score {value!r} is not an integer; reply {replies.quote(text)}")
        if not self.low <= score <= self.high:
            raise JudgeReplyError(
                f"score {score} is outside {self.low}-{self.high}; reply {replies.quote(text)}"
            )
        return dict(zip(self.makes, (score, explanation), strict=True))


# --- pairwise: which of two answers is better ------------------------------------------------

PAIRWISE_SYSTEM = (
    "You are an impartial judge. You compare two responses to the same question and answer "
    "with a JSON object only. The order in which the responses are shown says nothing about "
    "their quality, nor does their length."
)
PAIRWISE_RUBRIC = "Which response answers the question better: more helpful, more correct, clearer?"
TIES = {"tie", "draw", "equal", "both", "neither", "c"}
# A winner as models write it after "Winner:": A, "B", [[A]], **Response B**, tie.
WINNER = r"[\[\"'*\s]*(?:response[\s_]*)?(?:a|b|c|tie|draw)\b[\]\"'*]*"


class PairColumns(StepSettings):
    question: str
    a: str
    b: str


class PairwiseSettings(StepSettings):
    judge: Literal["pairwise"]
    columns: PairColumns  # the row columns of the question and of the answers a and b
    rubric: str = Field(default=PAIRWISE_RUBRIC, min_length=1)
    order: Literal["ab", "ba"] = "ab"  # which answer the model sees first
    ties: bool = True  # whether "tie" is a verdict the model may give
    prefix: str = ""
    system: str | None = None


class PairwiseJudge:
    """Says which of two answers to one question is better: `winner` is "a" or "b" (the
    answers' roles in `columns`, wherever they were shown) or "tie".

    Position bias: models favour the answer shown first (or second) more often than chance.
    The judge shows them as "Response A" and "Response B" in the order `order` sets and reads
    the verdict back to the columns, so `order: ba` asks the same question the other way
    round and its `winner` still names the column. To cancel the bias, a pipeline judges each
    pair twice, in a step with `order: ab` and one with `order: ba` (different `prefix`es),
    and keeps or scores the rows whose two winners agree (a filter over both columns); a
    disagreement is the bias showing, best counted as a tie. Asking twice is the pipeline's
    choice, since it doubles the judge's cost.
    """

    def __init__(self, settings: PairwiseSettings):
        self.settings = settings
        prefix = settings.prefix
        self.makes = (f"{prefix}winner", f"{prefix}explanation")
        verdicts = ["A", "B", "tie"] if settings.ties else ["A", "B"]
        self.reply_schema = _schema({"type": "string", "enum": verdicts}, "winner")
        self.shown = ("a", "b") if settings.order == "ab" else ("b", "a")

    def needs(self) -> set[str]:
        columns = self.settings.columns
        return {columns.question, columns.a, columns.b}

    def messages(self, row: dict[str, Any]) -> list[Message]:
        columns = self.settings.columns.model_dump()
        first, second = (column_text(row, columns[role]) for role in self.shown)
        choices = '"A", "B" or "tie"' if self.settings.ties else '"A" or "B"'
        ask = (
            "Answer with this JSON object only, the explanation first:\n"
            f'{{"explanation": "<one or two sentences>", "winner": <{choices}>}}'
        )
        user = "\n\n".join(
            [
                self.settings.rubric.strip(),
                section("question", column_text(row, columns["question"])),
                section("response_a", first),
                section("response_b", second),
                ask,
            ]
        )
        return [
            Message("system", self.settings.system or PAIRWISE_SYSTEM),
            Message("user", user),
        ]

    def parse(self, text: str) -> dict[str, Any]:
        value, explanation = _verdict(text, "winner", WINNER)
        if value is None:
            reply = replies.strip_thinking(text)
            brackets = replies.labelled(reply, "verdict", WINNER) or _double_brackets(reply)
            value = brackets.group(1) if brackets else None
        if value is None:
            raise JudgeReplyError(f"no winner in the judge's reply {replies.quote(text)}")
        word = replies.bare_word(value).lower().removeprefix("response").strip(" _")
        if word in ("a", "b"):
            position = 0 if word == "a" else 1
            return dict(zip(self.makes, (self.shown[position], explanation), strict=True))
        if word in TIES and self.settings.ties:
            return dict(zip(self.makes, ("tie", explanation), strict=True))
        allowed = "A, B or tie" if self.settings.ties else "A or B"
        raise JudgeReplyError(f"winner {value!r} is not {allowed}; reply {replies.quote(text)}")


def _double_brackets(text: str) -> Any:
    """A verdict written as [[A]], the convention of MT-Bench's judge prompts."""
    return re.search(r"\[\[\s*(A|B|C|tie)\s*\]\]", text, re.IGNORECASE)


def _verdict(text: str, key: str, pattern: str) -> tuple[Any, str]:
    """The reply's value for `key` (None when absent) and its explanation: from the first JSON
    object that has the key, else from a "key: value" line, the rest of the reply then being
    the explanation."""
    reply = replies.strip_thinking(text)
    found = replies.json_object(reply)
    if found is not None and replies.key_value(found, key) is not None:
        explanation = replies.key_value(found, "explanation")
        return replies.key_value(found, key), "" if explanation is None else str(explanation)
    match = replies.labelled(reply, key, pattern)
    if match is None:
        return None, reply
    said = replies.labelled(reply, "explanation", r".+")
    return match.group(1), said.group(1).strip() if said else replies.without_line(reply, match)


def _schema(verdict: dict[str, Any], key: str) -> dict[str, Any]:
    """The JSON schema of a reply: the explanation, then the verdict."""
    return {
        "type": "object",
        "properties": {
            "explanation": {"type": "string", "maxLength": replies.EXPLANATION_CHARS},
            key: verdict,
        },
        "required": ["explanation", key],
        "additionalProperties": False,
    }
