"""Reading a structured answer out of a model's free text.

A model asked for a JSON object wraps it in a fenced block, writes a sentence before or after
it, thinks aloud first (`<think>...</think>`), is cut off by its token limit, or ignores the
format and writes "Score: 7". Each reader here looks where models put what was asked for, so
that a judge (judges.py) fails a row only when the answer is truly not there; `quote` gives the
start of a reply for that row's one-line error.
"""

from __future__ import annotations

import json
import re
from typing import Any

THINKING = re.compile(r"<(think|thinking)>.*?</\1>", re.DOTALL | re.IGNORECASE)
FENCE = re.compile(r"```[\w-]*[ \t]*\n?(.*?)```", re.DOTALL)
TAG = re.compile(r"<(\w+)>(.*?)</\1>", re.DOTALL)
NUMBER = r"[-+]?\d+(?:\.\d+)?"
# A reply of thousands of braces (a model looping on "{") is not searched past this many: a
# judgment is near the start of any reply that has one.
MAX_OPENINGS = 64
QUOTE_CHARS = 60
# The longest explanation a judge's reply schema allows: a model that rambles under guided
# decoding is cut off here, rather than by its token limit before it writes the verdict.
EXPLANATION_CHARS = 400


class JudgeReplyError(ValueError):
    """A judge's reply that does not hold the judgment asked for. The row fails with this one
    line, which quotes the start of the reply, and the job goes on."""


def strip_thinking(text: str) -> str:
    """The reply without a reasoning model's thinking blocks, which may hold drafts of the
    answer in the very format asked for."""
    return THINKING.sub("", text).strip()


def json_object(text: str) -> dict[str, Any] | None:
    """The first JSON object in the text: inside a fenced block first, else the first `{` from
    which a whole object decodes (text around it ignored); None when there is none."""
    decoder = json.JSONDecoder()
    for chunk in [*FENCE.findall(text), text]:
        for n, opening in enumerate(re.finditer(r"\{", chunk)):
            if n == MAX_OPENINGS:
                break
            try:
                value, _ = decoder.raw_decode(chunk, opening.start())
            except json.JSONDecodeError:
                continue
            if isinstance(value, dict):
                return value
    return None


def key_value(found: dict[str, Any], name: str) -> Any:
    """A JSON object's value for `name`, its key spelled in any case; None when absent."""
    for key, value in found.items():
        if key.strip().lower() == name:
            return value
    return None


def xml_tags(text: str) -> dict[str, str]:
    """Each `<tag>value</tag>` in the text, by tag name in lower case; the last of a name wins,
    as a model that restates the format before answering puts its answer last."""
    return {name.lower(): value.strip() for name, value in TAG.findall(text)}


def labelled(text: str, label: str, value: str) -> re.Match[str] | None:
    """The first `label: value` in the text, in the ways models write it: "Score: 7",
    "**Score**: 7", '"score": 7' (a JSON object cut off), "score = 7". Group 1 is the value;
    `value` is a regular expression for it."""
    pattern = rf"(?i)\b{label}\b[\s*\"'_]*[:=][\s*\"']*({value})"
    return re.search(pattern, text)


def without_line(text: str, match: re.Match[str]) -> str:
    """The text with the line holding `match` taken out (a "Score: 7" line, leaving the prose
    around it as the explanation)."""
    start = text.rfind("\n", 0, match.start()) + 1
    end = text.find("\n", match.end())
    rest = text[:start] + (text[end + 1 :] if end != -1 else "")
    return rest.strip()


def as_int(value: Any) -> int | None:
    """A score as an integer: 7, 7.0, "7", "7/10", "7 out of 10"; None for anything else (a
    fraction, a word, a bool)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if value.is_integer() else None
    if isinstance(value, str):
        found = re.fullmatch(rf"\s*({NUMBER})\s*(?:(?:/|out of)\s*\d+)?\s*\.?\s*", value)
        return as_int(float(found.group(1))) if found else None
    return None


def as_float(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str) and re.fullmatch(rf"\s*{NUMBER}\s*\.?\s*", value):
        return float(value.strip().rstrip("."))
    return None


def bare_word(value: Any) -> str:
    """A one-word answer without what models put around it: quotes, brackets, markdown
    emphasis, a final full stop ('**Yes.**' -> 'Yes', '[[A]]' -> 'A')."""
    return str(value).strip().strip("*_`'\"[]()<>.,:;!").strip()


def quote(text: str) -> str:
    """The start of a reply on one line, quoted, for an error message."""
    flat = " ".join(text.split())
    if not flat:
        return "(an empty reply)"
    shown = flat if len(flat) <= QUOTE_CHARS else flat[:QUOTE_CHARS] + "..."
    return f"'{shown}'"
