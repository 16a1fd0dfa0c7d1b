"""From a table's columns to a conversation: what `--prompt-template`, `--system` and
`--id-column` say, for rows read from Parquet, CSV, a dataset or JSONL alike.

- A row with a `messages` column (a list of {role, content}) is a conversation as it is.
- Otherwise `--prompt-template` makes the user turn from the row's columns: a Jinja template
  when it holds `{{` or `{%` (`Summarize: {{ text }}`), else a Python format string
  (`Summarize: {text}`). A column the template names and the row lacks is that row's error.
- `--system` makes a system turn for every chat row that has none of its own.
- `--text-column` names the column an embed run embeds (`data.pooling_rows`).
- `--id-column` names the column holding the row's id (else `id`, `custom_id` or
  `conversation_id`, else a hash of the row).
Every column is kept and written back out beside the reply.
"""

from __future__ import annotations

import string
from dataclasses import dataclass, field
from typing import Any

from lmpress.vocabulary.errors import ConfigError


class TemplateError(ValueError):
    """A row the prompt template cannot be filled from; the message names what is missing."""


@dataclass(frozen=True)
class RowMapping:
    prompt_template: str | None = None
    system: str | None = None
    id_column: str | None = None
    text_column: str | None = None  # an embed or perplexity run's text (`--text-column`)
    _render: Any = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.prompt_template is not None:
            object.__setattr__(self, "_render", _compile(self.prompt_template))

    @property
    def is_default(self) -> bool:
        return (
            self.prompt_template is None
            and self.system is None
            and self.id_column is None
            and self.text_column is None
        )

    def prompt(self, row: dict[str, Any]) -> str:
        """The user turn the template makes from the row's columns."""
        assert self._render is not None
        return self._render(row)

    def settings(self) -> dict[str, Any]:
        """What decides the output, for a job's fingerprint: only what is set."""
        values = {
            "prompt_template": self.prompt_template,
            "system": self.system,
            "id_column": self.id_column,
            "text_column": self.text_column,
        }
        return {key: value for key, value in values.items() if value is not None}


def _compile(template: str) -> Any:
    if "{{" in template or "{%" in template:
        return _jinja(template)
    return _format_string(template)


def _jinja(template: str) -> Any:
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(
        undefined=jinja2.StrictUndefined, keep_trailing_newline=True
    )
    try:
        compiled = env.from_string(template)
    except jinja2.TemplateSyntaxError as exc:
        raise ConfigError(f"--prompt-template: not a valid Jinja template ({exc.message})") from exc

    def render(row: dict[str, Any]) -> str:
        try:
            return compiled.render(**row)
        except jinja2.UndefinedError as exc:
            raise TemplateError(f"the prompt template: {exc.message}{_columns(row)}") from None
        except jinja2.TemplateError as exc:
            raise TemplateError(f"the prompt template failed: {exc}") from None

    return render


def _format_string(template: str) -> Any:
    formatter = string.Formatter()
    try:
        names = [name for _, name, _, _ in formatter.parse(template) if name is not None]
    except ValueError as exc:
        raise ConfigError(
            f"--prompt-template: {exc} (write a literal brace as {{{{ or }}}})"
        ) from exc
    for name in names:
        if name == "" or name.isdigit():
            raise ConfigError(
                "--prompt-template: name a column in each {...}, e.g. 'Summarize: {text}'"
            )

    def render(row: dict[str, Any]) -> str:
        try:
            return template.format_map(row)
        except KeyError as exc:
            raise TemplateError(
                f"the prompt template names column '{exc.args[0]}', which this row lacks"
                f"{_columns(row)}"
            ) from None
        except (AttributeError, IndexError, TypeError, ValueError) as exc:
            raise TemplateError(f"the prompt template failed on this row ({exc})") from None

    return render


def _columns(row: dict[str, Any]) -> str:
    names = ", ".join(sorted(row)[:12]) + (", ..." if len(row) > 12 else "")
    return f" (columns: {names or 'none'})"


def template_columns(template: str) -> set[str]:
    """The columns a prompt template names (Jinja's undeclared variables, or a format string's
    field names), so a pipeline can refuse one no earlier step makes before any work."""
    _compile(template)  # a template that does not compile is refused as --prompt-template is
    if "{{" in template or "{%" in template:
        from jinja2 import meta
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        return set(meta.find_undeclared_variables(ImmutableSandboxedEnvironment().parse(template)))
    names = (name for _, name, _, _ in string.Formatter().parse(template) if name is not None)
    return {name.split(".")[0].split("[")[0] for name in names}
