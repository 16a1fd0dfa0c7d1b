"""A generate step: the row's columns through a prompt template (and a system prompt) to the
model, `n` samples, each reply kept as text in one column or parsed into columns, a list
column exploded into one row per item."""

from __future__ import annotations

from typing import Any

from lmpress.pipeline.steps.base import Outcome, Step, exploded
from lmpress.vocabulary.types import GenerationParams, Message, Request, Result


class Generate(Step):
    def __init__(self, spec: Any, answers: Any, params: GenerationParams, schema: Any,
                 concurrency: int):  # fmt: skip
        from lmpress.data.columns import RowMapping

        super().__init__(spec.name, concurrency)
        self.answers = answers  # made on first use: see Models.answers
        self.params = params
        self.schema = schema  # None: the reply is kept as text in `output_column`
        self.output = spec.output_column
        self.explode = spec.explode
        self.fans_out = params.n > 1 or spec.explode is not None
        self._prompt = RowMapping(prompt_template=spec.prompt)
        self._system = RowMapping(prompt_template=spec.system) if spec.system else None

    async def run(self, key: str, row: dict[str, Any]) -> Outcome:
        try:
            messages = self.messages(row)
        except ValueError as exc:  # a template naming a column the row lacks
            return Outcome(error=str(exc))
        result = await ask(self.answers(), Request(key, messages, self.params))
        if isinstance(result, str):
            return Outcome(error=result)
        rows = []
        for sample in result.samples:
            try:
                rows.extend(self.reply_rows(sample.text, row))
            except ValueError as exc:
                cut = " (cut at max_new_tokens)" if sample.finish_reason == "length" else ""
                return Outcome(error=f"{exc}{cut}", usage=result.usage)
        return Outcome(rows=exploded(rows, self.explode), usage=result.usage)

    def messages(self, row: dict[str, Any]) -> list[Message]:
        """The conversation for a row; raises ValueError in one line. The Python front
        (`pipeline/python.py`) overrides this and `reply_rows` with the user's callables."""
        from lmpress.data.columns import TemplateError

        try:
            messages = [Message("user", self._prompt.prompt(row))]
            if self._system is not None:
                messages.insert(0, Message("system", self._system.prompt(row)))
        except TemplateError as exc:
            raise ValueError(str(exc)) from None
        return messages

    def reply_rows(self, text: str, row: dict[str, Any]) -> list[dict[str, Any]]:
        """The rows one reply makes: the text in the output column, or its parsed fields;
        raises ValueError (one line) on a reply that does not parse."""
        if self.schema is None:
            return [{**row, self.output: text}]
        from lmpress.pipeline.reply_columns import parse_reply

        return [{**row, **parse_reply(text, self.schema)}]


async def ask(answers: Any, request: Request) -> Result | str:
    """The model's Result, or why the request failed, in one line."""
    result = await answers.complete(request)
    if result.error is not None:
        return f"{result.error.kind}: {result.error.message}"
    if not result.samples:
        return "the engine returned no reply"
    return result


def step_params(base: GenerationParams, generation: dict[str, Any], where: str, **more: Any
                ) -> GenerationParams:  # fmt: skip
    """The model's generation settings with the step's own over them."""
    from lmpress.vocabulary.errors import ConfigError
    from lmpress.vocabulary.guided import GuidedDecoding

    changes = {**generation, **more}
    if isinstance(changes.get("guided_decoding"), dict):
        changes["guided_decoding"] = GuidedDecoding(**changes["guided_decoding"])
    try:
        return base.replace(**changes)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: generation: {exc}") from None
