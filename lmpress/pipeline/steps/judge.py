"""A judge step: the judge (`pipeline/judges.py`) builds the conversation from the row and
parses the reply into its columns (a score, an explanation); a reply it cannot parse fails
that row alone."""

from __future__ import annotations

from typing import Any

from lmpress.pipeline.steps.base import Outcome, Step
from lmpress.pipeline.steps.generate import ask
from lmpress.vocabulary.types import GenerationParams, Request


class Judge(Step):
    def __init__(self, name: str, judge: Any, answers: Any, params: GenerationParams,
                 concurrency: int):  # fmt: skip
        super().__init__(name, concurrency)
        self.judge = judge
        self.answers = answers  # made on first use: see Models.answers
        self.params = params

    async def run(self, key: str, row: dict[str, Any]) -> Outcome:
        try:
            messages = self.judge.messages(row)
        except (KeyError, ValueError) as exc:
            return Outcome(error=f"the judge cannot read this row ({exc})")
        result = await ask(self.answers(), Request(key, messages, self.params))
        if isinstance(result, str):
            return Outcome(error=result)
        try:
            columns = self.judge.parse(result.samples[0].text)
        except ValueError as exc:  # JudgeReplyError, one line
            return Outcome(error=f"the judge's reply: {exc}", usage=result.usage)
        return Outcome(rows=[{**row, **columns}], usage=result.usage)
