"""STAND-IN (branch core only): the smallest single-score judge the core's judge step runs
against, to be replaced by the `judge` helper's module of the same name and contract."""

from __future__ import annotations

import re
from typing import Any

from lmpress.vocabulary.errors import ConfigError
from lmpress.vocabulary.types import Message


class JudgeReplyError(ValueError):
    """A judge's reply that holds no score."""


class SingleScore:
    makes = ("score", "explanation")

    def __init__(self, rubric: str, columns: list[str]):
        self.rubric = rubric
        self.columns = columns

    def needs(self) -> set[str]:
        return set(self.columns)

    def messages(self, row: dict[str, Any]) -> list[Message]:
        shown = "\n".join(f"{c}: {row[c]}" for c in self.columns)
        ask = 'Answer {"explanation": "...", "score": N} with N from 1 to 10.'
        return [Message("user", f"Rubric:\n{self.rubric}\n\n{shown}\n\n{ask}")]

    def parse(self, text: str) -> dict[str, Any]:
        found = re.search(r'"score"\s*:\s*(\d+)', text)
        if found is None:
            raise JudgeReplyError(f"no score in the reply: {text[:60]!r}")
        why = re.search(r'"explanation"\s*:\s*"([^"]*)"', text)
        return {"score": int(found.group(1)), "explanation": why.group(1) if why else ""}


def build_judge(settings: dict[str, Any]) -> SingleScore:
    unknown = set(settings) - {"judge", "rubric", "columns"}
    if unknown:
        raise ConfigError(f"{sorted(unknown)[0]}: unknown key")
    if settings.get("judge", "single") != "single":
        raise ConfigError(f"judge: unknown judge {settings['judge']!r}")
    return SingleScore(settings.get("rubric", "Rate this."), list(settings.get("columns", [])))
