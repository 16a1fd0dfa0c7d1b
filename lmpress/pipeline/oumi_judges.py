"""Oumi's judge configs as a judge step (`judge: oumi`).

An Oumi judge config (what `oumi judge dataset --config` reads) is a YAML file of
`judge_params`, the prompt and the shape of the answer, and `inference_config`, the model. A
judge step takes the file as it is (`config: path.yaml`) or its `judge_params` inline. The
step's `model` and `generation` stand in for `inference_config`, which is read past, so that a
published config runs unchanged on any model of the pipeline.

What is honoured, as Oumi defines it:
- `prompt_template`: `{placeholders}` (Python format) filled from the row's columns of the
  same names (`columns:` maps a placeholder to another column); `prompt_template_placeholders`,
  when given, must list exactly those.
- `template_variables`: fixed text put into its `{name}`s in the template and the system
  instruction, before the row's columns.
- `system_instruction`: the system turn.
- `response_format` (JSON, XML or RAW; XML by default) and `include_explanation`: the answer's
  shape, asked for in a paragraph after the system instruction (after the prompt when there is
  none), as Oumi places it; the wording is lmpress's.
- `judgment_type` (BOOL, INT, FLOAT, TEXT or ENUM; BOOL by default): the type of the
  `judgment` column (BOOL answers "Yes" or "No", kept as true or false); `judgment_scores`
  (ENUM's options, with a score each) adds `judgment_score`.
- `examples`: few-shot turns, each the placeholders' values with its `judgment` (and
  `explanation`).
Rule-based configs (`rule_judge_params`) judge without a model; a filter step does that here,
so they are refused with one line.
"""

from __future__ import annotations

import json
import re
import string
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, field_validator, model_validator

from lmpress.data.columns import TemplateError
from lmpress.pipeline import replies
from lmpress.pipeline.replies import JudgeReplyError
from lmpress.pipeline.settings import StepSettings, validated
from lmpress.vocabulary.errors import ConfigError
from lmpress.vocabulary.types import Message

YES = {"yes", "true", "y", "t", "1", "correct", "pass"}
NO = {"no", "false", "n", "f", "0", "incorrect", "fail"}


class OumiParams(StepSettings):
    """Oumi's JudgeParams: its fields, defaults and enum names (in any case, as its YAML
    files write them)."""

    prompt_template: str = Field(min_length=1)
    prompt_template_placeholders: list[str] | None = None
    system_instruction: str | None = None
    template_variables: dict[str, str | int | float | bool | None] = {}
    response_format: Literal["json", "xml", "raw"] = "xml"
    judgment_type: Literal["bool", "int", "float", "text", "enum"] = "bool"
    judgment_scores: dict[str, float] | None = None
    include_explanation: bool = False
    examples: list[dict[str, Any]] = []

    @field_validator("response_format", "judgment_type", mode="before")
    @classmethod
    def _any_case(cls, value: Any) -> Any:
        known = ("json", "xml", "raw", "bool", "int", "float", "text", "enum")
        return value.lower() if isinstance(value, str) and value.lower() in known else value

    @model_validator(mode="after")
    def _enum_has_options(self) -> OumiParams:
        if self.judgment_type == "enum" and not self.judgment_scores:
            raise ValueError("judgment_type ENUM needs judgment_scores: each option's score")
        return self


class OumiFile(StepSettings):
    """An Oumi judge config file's sections; `inference_config` is the step's to give."""

    judge_params: dict[str, Any]
    inference_config: dict[str, Any] | None = None
    rule_judge_params: dict[str, Any] | None = None


class OumiSettings(StepSettings):
    judge: Literal["oumi"]
    config: str | None = None  # an Oumi judge config file
    judge_params: dict[str, Any] | None = None  # or its judge_params, inline
    columns: dict[str, str] = {}  # a placeholder -> the column that fills it (else its own)
    prefix: str = ""

    @model_validator(mode="after")
    def _one_source(self) -> OumiSettings:
        if (self.config is None) == (self.judge_params is None):
            raise ValueError(
                "give 'config' (an Oumi judge config file) or 'judge_params' (inline), "
                "one of the two"
            )
        return self


class OumiJudge:
    """An Oumi judge config's prompt and answer, for a judge step's model."""

    def __init__(self, settings: OumiSettings, where: str, base_dir: Path):
        params = load_params(settings, where, base_dir)
        self.params = params
        self.system, self.template = _with_variables(params)
        self.placeholders = placeholders(self.template, where)
        _check_declared(params, self.placeholders, where)
        self.columns = _columns(settings.columns, self.placeholders, where)
        self.scores = params.judgment_scores
        prefix = settings.prefix
        self.makes = tuple(
            f"{prefix}{name}"
            for name, wanted in (
                ("judgment", True),
                ("explanation", params.include_explanation),
                ("judgment_score", self.scores is not None),
            )
            if wanted
        )
        self.reply_schema = _schema(params) if params.response_format == "json" else None
        self.shots = [_shot(self, example, n, where) for n, example in enumerate(params.examples)]

    def needs(self) -> set[str]:
        return set(self.columns.values())

    def messages(self, row: dict[str, Any]) -> list[Message]:
        values = {}
        for name, column in self.columns.items():
            if column not in row:
                raise TemplateError(f"the judge reads column '{column}', which this row lacks")
            value = row[column]
            values[name] = json.dumps(value) if isinstance(value, dict | list) else value
        turns = [Message("system", self.system)] if self.system else []
        for prompt, answer in self.shots:
            turns += [Message("user", prompt), Message("assistant", answer)]
        return [*turns, Message("user", self.prompt(values))]

    def prompt(self, values: dict[str, Any]) -> str:
        """The template filled, with the answer's format asked for here when there is no
        system instruction to carry it."""
        try:
            text = self.template.format_map(values)
        except (AttributeError, IndexError, KeyError, TypeError, ValueError) as exc:
            raise TemplateError(f"the judge's prompt template failed on this row ({exc})") from None
        return text if self.params.system_instruction else f"{text}\n\n{instruction(self.params)}"

    def parse(self, text: str) -> dict[str, Any]:
        found = _answer(replies.strip_thinking(text), self.params.response_format)
        if found.get("judgment") is None:
            raise JudgeReplyError(f"no judgment in the judge's reply {replies.quote(text)}")
        raw = found["judgment"]
        judgment = _typed(raw, self.params)
        if judgment is None:
            raise JudgeReplyError(
                f"judgment {str(raw)[:40]!r} is not {hint(self.params)}; "
                f"reply {replies.quote(text)}"
            )
        values = [judgment]
        if self.params.include_explanation:
            values.append(str(found.get("explanation") or ""))
        if self.scores is not None:
            option = _option(raw, self.scores)
            if option is None:
                raise JudgeReplyError(
                    f"judgment {str(raw)[:40]!r} is not {hint(self.params)}; "
                    f"reply {replies.quote(text)}"
                )
            values.append(self.scores[option])
        return dict(zip(self.makes, values, strict=True))


def load_params(settings: OumiSettings, where: str, base_dir: Path) -> OumiParams:
    """The judge_params given inline, or read from the config file."""
    if settings.judge_params is not None:
        return validated(OumiParams, settings.judge_params, where, "judge_params.")
    assert settings.config is not None
    path = Path(settings.config).expanduser()
    path = path if path.is_absolute() else base_dir / path
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "not valid YAML"
        raise ConfigError(f"{where}config: {path}{line}: {problem}") from None
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise ConfigError(f"{where}config: cannot read {path} ({why})") from None
    config = validated(OumiFile, data or {}, f"{where}config: {path}: ")
    if config.rule_judge_params is not None:
        raise ConfigError(
            f"{where}config: {path}: a rule-based Oumi judge (rule_judge_params) needs no "
            f"model; use a filter step for it"
        )
    return validated(OumiParams, config.judge_params, f"{where}config: {path}: ", "judge_params.")


def placeholders(template: str, where: str) -> list[str]:
    """The columns a Python format template names, in order, each once."""
    names = []
    try:
        for _, name, _, _ in string.Formatter().parse(template):
            if name is None:
                continue
            head = re.split(r"[.\[]", name, maxsplit=1)[0]
            if not head or head.isdigit():
                raise ConfigError(
                    f"{where}prompt_template: name a column in each {{...}}, e.g. {{response}}"
                )
            names.append(head)
    except ValueError as exc:
        raise ConfigError(
            f"{where}prompt_template: {exc} (write a literal brace as {{{{ or }}}})"
        ) from None
    return list(dict.fromkeys(names))


def hint(params: OumiParams) -> str:
    """What the judgment may be, in words, for the prompt and for an error."""
    if params.judgment_scores:
        return "one of " + ", ".join(json.dumps(option) for option in params.judgment_scores)
    return {
        "bool": '"Yes" or "No"',
        "int": "an integer",
        "float": "a number",
        "text": "text",
        "enum": "one of the options",
    }[params.judgment_type]


def instruction(params: OumiParams) -> str:
    """The paragraph that asks for the answer's shape."""
    why = params.include_explanation
    if params.response_format == "json":
        fields = ['"explanation": "<why>"'] if why else []
        fields.append(f'"judgment": <{hint(params)}>')
        first = ", the explanation first" if why else ""
        return f"Answer with this JSON object only{first}:\n{{{', '.join(fields)}}}"
    if params.response_format == "xml":
        tags = ["<explanation>why</explanation>"] if why else []
        tags.append(f"<judgment>{hint(params)}</judgment>")
        first = ", the explanation first" if why else ""
        return f"Answer with these XML tags only{first}:\n" + "\n".join(tags)
    if why:
        return f"Explain your reasoning, then give your judgment ({hint(params)}) on a last line."
    return f"Answer with your judgment only: {hint(params)}."


def _with_variables(params: OumiParams) -> tuple[str | None, str]:
    """The system instruction (with the format paragraph) and the prompt template, their
    template variables put in. A variable's braces are kept literal in the template."""
    system, template = params.system_instruction, params.prompt_template
    for name, value in params.template_variables.items():
        text = str(value)
        template = template.replace(f"{{{name}}}", text.replace("{", "{{").replace("}", "}}"))
        system = system.replace(f"{{{name}}}", text) if system else system
    if system:
        system = f"{system.rstrip()}\n\n{instruction(params)}"
    return system, template


def _check_declared(params: OumiParams, found: list[str], where: str) -> None:
    declared = params.prompt_template_placeholders
    if declared is not None and set(declared) != set(found):
        raise ConfigError(
            f"{where}prompt_template_placeholders: {sorted(declared)} differ from the "
            f"template's placeholders {sorted(found)}"
        )


def _columns(given: dict[str, str], found: list[str], where: str) -> dict[str, str]:
    """Each placeholder's column: as `columns` maps it, else the column of its own name."""
    for name in given:
        if name not in found:
            raise ConfigError(
                f"{where}columns: '{name}' is no placeholder of the prompt template "
                f"(its placeholders: {', '.join(found) or 'none'})"
            )
    return {name: given.get(name, name) for name in found}


def _shot(judge: OumiJudge, example: dict[str, Any], n: int, where: str) -> tuple[str, str]:
    """A few-shot example as the user's prompt and the answer in the asked-for format."""
    wanted = ["judgment", *(["explanation"] if judge.params.include_explanation else [])]
    missing = [name for name in [*judge.placeholders, *wanted] if name not in example]
    if missing:
        raise ConfigError(f"{where}examples[{n}]: lacks {', '.join(missing)}")
    prompt = judge.prompt({name: example[name] for name in judge.placeholders})
    answer = {name: _shown(example[name]) for name in reversed(wanted)}  # explanation first
    if judge.params.response_format == "json":
        return prompt, json.dumps(answer, ensure_ascii=False)
    if judge.params.response_format == "xml":
        return prompt, "\n".join(f"<{name}>{value}</{name}>" for name, value in answer.items())
    return prompt, "\n".join(answer.values())


def _shown(value: Any) -> str:
    """An example's value as the judge is asked to write it (a YAML true as "Yes")."""
    if isinstance(value, bool):
        return "Yes" if value else "No"
    return str(value)


def _answer(reply: str, response_format: str) -> dict[str, Any]:
    """The reply's fields by lower-case name: from the asked-for format first, then from the
    other structured one (a model asked for XML that wrote JSON), then from a "Judgment: ..."
    line. A plain-text (RAW) answer's judgment is its last line."""
    if response_format == "raw":
        return _plain(reply, last_line=True)
    readers = [
        lambda: {k.strip().lower(): v for k, v in (replies.json_object(reply) or {}).items()},
        lambda: replies.xml_tags(reply),
    ]
    for read in readers if response_format == "json" else readers[::-1]:
        found = read()
        if found.get("judgment") is not None:
            return found
    return _plain(reply, last_line=False)


def _plain(reply: str, last_line: bool) -> dict[str, Any]:
    """A plain-text answer: a "Judgment: ..." line, else (where asked for) the last line; the
    rest of the reply is the explanation."""
    match = replies.labelled(reply, "judgment", r"[^\n]+")
    if match is not None:
        return {"judgment": match.group(1), "explanation": replies.without_line(reply, match)}
    lines = [line for line in reply.splitlines() if line.strip()]
    if not lines or not last_line:
        return {}
    return {"judgment": lines[-1], "explanation": "\n".join(lines[:-1]).strip()}


def _typed(raw: Any, params: OumiParams) -> Any:
    """The judgment as its judgment_type says; None when it is not one."""
    kind = params.judgment_type
    if kind == "text":
        return str(raw).strip()
    if kind == "enum":
        return _option(raw, params.judgment_scores or {})
    if kind == "bool":
        if isinstance(raw, bool):
            return raw
        words = str(raw).split()
        word = replies.bare_word(words[0]).lower() if words else ""
        return True if word in YES else False if word in NO else None
    number = replies.as_int(raw) if kind == "int" else replies.as_float(raw)
    if number is None and isinstance(raw, str):  # "7 (good)" -> 7
        first = re.search(replies.NUMBER, raw)
        number = _typed(first.group(0), params) if first else None
    return number


def _option(raw: Any, options: dict[str, float]) -> str | None:
    """The option the judgment names: itself in any case, else the one option it mentions."""
    word = replies.bare_word(raw).lower()
    for option in options:
        if option.lower() == word:
            return option
    mentioned = [o for o in options if re.search(rf"\b{re.escape(o)}\b", str(raw), re.I)]
    return mentioned[0] if len(mentioned) == 1 else None


def _schema(params: OumiParams) -> dict[str, Any]:
    if params.judgment_scores:
        verdict: dict[str, Any] = {"type": "string", "enum": list(params.judgment_scores)}
    else:
        verdict = {
            "bool": {"type": "string", "enum": ["Yes", "No"]},
            "int": {"type": "integer"},
            "float": {"type": "number"},
        }.get(params.judgment_type, {"type": "string"})
    explanation = {"type": "string", "maxLength": replies.EXPLANATION_CHARS}
    properties = {"explanation": explanation} if params.include_explanation else {}
    properties["judgment"] = verdict
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }
