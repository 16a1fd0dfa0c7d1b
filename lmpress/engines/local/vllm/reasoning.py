"""VLLM's reasoning models: the thinking read apart from the answer by vLLM's own reasoning
parsers, its length bounded by vLLM's thinking budget.

- Which parser: `model.reasoning_parser` (any name vLLM's `--reasoning-parser` takes, or `none`),
  else the family the chat template's marks show (common/reasoning.py `format_for`): the
  `<think>` family reads as vLLM's `deepseek_r1` (the thinking starts the reply, opened by the
  template or by the model's first token), gpt-oss's channels as `openai_gptoss`. The name goes
  to AsyncEngineArgs' `reasoning_parser`, which also starts vLLM's reasoning config (the thinking
  budget) and makes its structured outputs wait for the end of the thinking.
- Whether a reply thinks is read from its prompt as vLLM's budget reads it: the prompt's last
  start mark after its last end mark (a template that opens the block) means the reply starts
  inside the thinking; a prompt that closed it (`enable_thinking: false`) gives an answer only;
  otherwise the reply thinks only if its first token opens a block.
- `reasoning_effort` sets the chat template's switches as on NATIVE and LLAMACPP
  (local/reasoning.py `template_switches`).
- A row under a grammar (a JSON schema, a required tool call) gets the grammar from the end of
  its thinking on (vLLM's structured outputs wait for the end mark); where the template left the
  model to open the block, the prompt opens it (`opened_for_grammar`).
- `max_reasoning_tokens` is vLLM's `thinking_token_budget`, which counts the prompt's tokens
  after the start mark as thinking too (the newline Qwen3-style templates write after
  `<think>`); those are added, so that the reply itself thinks for exactly N tokens before vLLM
  forces the end mark (`budget`). vLLM forces `</think>` alone, where NATIVE and LLAMACPP write
  "\n</think>\n\n", so a bounded reply's answer goes on differently from theirs. vLLM's
  `reasoning_config.reasoning_end_str` could force the same, but its grammar starts at
  `</think>`, so the blank line forced after it breaks a compact-JSON row: left as vLLM has it.
- gpt-oss: vLLM's `openai_gptoss` parser only finds where the thinking ends (vLLM's server reads
  the channels with openai-harmony); its replies are read by lmpress's own harmony reader
  (common/reasoning.py), from text with the channel tokens kept.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmpress.configs.schema import ModelParams
from lmpress.vocabulary import reasoning as common
from lmpress.vocabulary.errors import ConfigError

HARMONY_PARSER = "openai_gptoss"


def parser_name(
    model: ModelParams,
    chat_template: str | None,
    known: Callable[[], list[str]],
    tokenizer_source: str | None = None,
) -> str | None:
    """vLLM's reasoning parser for the model, or None for a model that does not think.
    `known()`: the names vLLM registers; an explicit name outside them is refused in one line.
    A template's `<think>` marks choose a parser only where the tokenizer at
    `tokenizer_source` has them as tokens of their own, as vLLM's parsers need."""
    explicit = model.model_kwargs.get("reasoning_parser") or model.reasoning_parser
    if explicit == "none":
        return None
    if explicit:
        if explicit not in known():
            raise ConfigError(
                f"model.reasoning_parser '{explicit}' is not one of vLLM's reasoning parsers "
                f"({', '.join(known())}) or none"
            )
        return explicit
    found = common.format_for(chat_template)
    if found is None:
        return None
    marks = (found.start, found.end)
    if found is common.THINK and tokenizer_source and not tokenizer_has(tokenizer_source, marks):
        return None
    return found.name


def tokenizer_has(source: str, marks: tuple[str, ...]) -> bool:
    """Whether the tokenizer in directory `source` has each mark as a token, read from its
    tokenizer.json; True where that file cannot tell (a hub id, no such file): vLLM's parser
    then says so itself."""
    path = Path(source) / "tokenizer.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return True
    added = {token.get("content") for token in data.get("added_tokens") or []}
    vocab = (data.get("model") or {}).get("vocab")
    vocab = vocab if isinstance(vocab, dict) else {}
    return all(mark in added or mark in vocab for mark in marks)


def budget_refusal(name: str | None, model: ModelParams) -> str | None:
    """Why `generation.max_reasoning_tokens` cannot bound this model's thinking on VLLM, in one
    line (in NATIVE's and LLAMACPP's words where they refuse it too); None where vLLM's
    thinking budget can."""
    key = "generation.max_reasoning_tokens"
    if name is None:
        why = (
            "model.reasoning_parser is none"
            if "none" in (model.reasoning_parser, model.model_kwargs.get("reasoning_parser"))
            else "its chat template has no thinking marks; set model.reasoning_parser if it does"
        )
        return f"{key}: model '{model.model_name}' does not think ({why})"
    if name == HARMONY_PARSER:  # its parser names no marks for vLLM's budget to count between
        return (
            f"{key}: vLLM's thinking budget cannot bound gpt-oss's analysis channel (its "
            f"{HARMONY_PARSER} parser gives no start and end marks); use "
            f"generation.reasoning_effort"
        )
    return None


def own_chat_template(source: str, revision: str | None = None) -> str | None:
    """The model's own chat template as vLLM will load it, read before vLLM starts (the parser
    is an engine argument): the chat_template.jinja or tokenizer_config.json of `source`, the
    directory or hub id vLLM loads the tokenizer from. None where there is none."""
    for name in ("chat_template.jinja", "tokenizer_config.json"):
        path = Path(source) / name
        if not path.exists():
            path = _hub_file(source, name, revision)
        if path is None or not path.exists():
            continue
        try:
            text = path.read_text(encoding="utf-8")
            if name.endswith(".jinja"):
                return text
            template = json.loads(text).get("chat_template")
        except (OSError, ValueError, AttributeError):  # vLLM says so itself when it starts
            return None
        if isinstance(template, list):  # named templates: the default one
            named = {t.get("name"): t.get("template") for t in template}
            template = named.get("default")
        return template if isinstance(template, str) else None
    return None


def _hub_file(repo: str, name: str, revision: str | None) -> Path | None:
    if Path(repo).exists() or repo.startswith((".", "/", "~")):
        return None
    try:
        from huggingface_hub import hf_hub_download

        return Path(hf_hub_download(repo, name, revision=revision))
    except Exception:  # no such file, or no network: vLLM says what is wrong when it starts
        return None


@dataclass
class ReasoningMarks:
    """The parser's start and end marks, as text and as single token ids (None where the
    tokenizer splits a mark, or the parser has none)."""

    start: str = ""
    end: str = ""
    start_id: int | None = None
    end_id: int | None = None

    @classmethod
    def of(cls, parser: Any, tokenizer: Any) -> ReasoningMarks:
        start = parser.reasoning_start_str or ""
        end = parser.reasoning_end_str or ""
        vocab = tokenizer.get_vocab()
        return cls(start, end, vocab.get(start), vocab.get(end))

    def open_in(self, prompt_ids: list[int]) -> bool | None:
        """Whether the prompt leaves a thinking block open; None where the marks are unknown."""
        if self.start_id is None or self.end_id is None:
            return None
        last_start = _last(prompt_ids, self.start_id)
        return last_start >= 0 and last_start > _last(prompt_ids, self.end_id)


def _last(ids: list[int], token: int) -> int:
    for i in range(len(ids) - 1, -1, -1):
        if ids[i] == token:
            return i
    return -1


class VllmReasoning:
    """The engine's reasoning parser, made once the tokenizer is known: `reader()` gives each
    sample its own reader, and `budget()` vLLM's thinking budget for a row."""

    def __init__(self, name: str, parser_class: Any, tokenizer: Any):
        self.name = name
        self.tokenizer = tokenizer
        self.harmony = name == HARMONY_PARSER
        self._class = parser_class
        # Parsers built on vLLM's parser engine keep a stream's state: one per sample. The
        # others are pure functions of the ids they are given, and one serves every sample (a
        # parser reads the whole vocabulary when it is made).
        self._per_sample = bool(getattr(parser_class, "engine_based_streaming", False))
        self._shared = None
        if self.harmony:
            self.marks = ReasoningMarks(common.HARMONY.start, common.HARMONY.end)
        else:
            self._shared = parser_class(tokenizer)
            self.marks = ReasoningMarks.of(self._shared, tokenizer)

    def parser(self) -> Any:
        return self._class(self.tokenizer) if self._per_sample else self._shared

    def reader(self, prompt_ids: list[int] | None) -> ReplyReader:
        if self.harmony:
            return HarmonyReader(self.tokenizer)
        return ThinkReader(self.parser, self.marks, list(prompt_ids or []))

    def opened_for_grammar(self, prompt_text: str) -> str:
        """The prompt of a row under a grammar, with the thinking block opened where the
        template left the model to open it (as NATIVE and LLAMACPP write the start mark): vLLM
        holds the grammar until the end mark, and one that never came would hold it forever."""
        marks = self.marks
        if self.harmony or not marks.start:
            return prompt_text
        opened = prompt_text.rfind(marks.start) > prompt_text.rfind(marks.end)
        if opened or prompt_text.rstrip().endswith(marks.end):  # opened, or closed
            return prompt_text
        return prompt_text + marks.start

    def budget(self, limit: int, prompt_text: str) -> int:
        """vLLM's thinking_token_budget for `limit` tokens of the reply's own thinking: vLLM
        counts the prompt's tokens after an open start mark as thinking already."""
        marks = self.marks
        start = prompt_text.rfind(marks.start) if marks.start else -1
        if start < 0 or start < prompt_text.rfind(marks.end):
            return limit
        tail = prompt_text[start + len(marks.start) :]
        return limit + len(self.tokenizer.encode(tail, add_special_tokens=False))


class ReplyReader:
    """One sample's reply split into thinking and answer: `feed` each streamed piece (text and
    its token ids) for the pieces to stream, `whole` for the final split."""

    def __init__(self) -> None:
        self._thinking_started = False
        self._answer_started = False
        self._held = ""  # newlines that may end the thinking

    def feed(self, text: str, token_ids: list[int]) -> tuple[str, str]:
        thinking, answer = self._split_piece(text, token_ids)
        return self._trim(thinking, answer)

    def finish(self) -> tuple[str, str]:
        """What the parser still holds once the reply has ended."""
        return self._trim(*self._flush())

    def _flush(self) -> tuple[str, str]:
        return "", ""

    def _trim(self, thinking: str, answer: str) -> tuple[str, str]:
        # The same newlines the whole reply loses (`_tidy`): around the thinking, before the
        # answer. A newline at the end of a thinking piece waits for the next piece.
        if thinking:
            if not self._thinking_started:
                thinking = thinking.lstrip("\n")
                self._thinking_started = bool(thinking)
            body = thinking.rstrip("\n")
            if body:
                thinking, self._held = self._held + body, _trailing(thinking)
            else:  # newlines only: held with the others
                thinking, self._held = "", self._held + thinking
        if answer and not self._answer_started:
            answer = answer.lstrip("\n")
            self._answer_started = bool(answer)
        return thinking, answer

    def _split_piece(self, text: str, token_ids: list[int]) -> tuple[str, str]:
        raise NotImplementedError

    def whole(self, text: str, token_ids: list[int]) -> tuple[str | None, str, int]:
        """(thinking or None, answer, thinking tokens) of the whole reply."""
        raise NotImplementedError


def _trailing(text: str) -> str:
    return text[len(text.rstrip("\n")) :]


def _tidy(thinking: str | None, answer: str | None) -> tuple[str | None, str]:
    """As common/reasoning.py's `split` gives them: the template's newlines around the thinking
    and before the answer are no part of either."""
    return (None if thinking is None else thinking.strip("\n")), (answer or "").lstrip("\n")


class ThinkReader(ReplyReader):
    """A `<think>`-style reply through vLLM's own parser (deepseek_r1, qwen3, ...)."""

    def __init__(self, new_parser: Callable[[], Any], marks: ReasoningMarks, prompt_ids: list[int]):
        super().__init__()
        self.new_parser = new_parser
        self.marks = marks
        self.prompt_ids = prompt_ids
        opened = marks.open_in(prompt_ids)
        if opened is None:  # marks that are not single tokens: ask the parser, as vLLM's server
            opened = not new_parser().is_reasoning_end(prompt_ids)
        self.opened = opened
        # None until the first token shows whether a reply the prompt left closed thinks.
        self.thinks: bool | None = True if opened else None
        self._parser: Any = None  # the stream's, made on its first piece
        self._text = ""
        self._ids: list[int] = []
        self._ended = False

    @property
    def parser(self) -> Any:
        if self._parser is None:
            self._parser = self.new_parser()
            if self.opened:
                self._parser.adjust_initial_state_from_prompt(self.prompt_ids)
        return self._parser

    def _decide(self, token_ids: list[int]) -> bool | None:
        if self.thinks is None and token_ids:
            start = self.marks.start_id
            self.thinks = start is not None and token_ids[0] == start
        return self.thinks

    def _split_piece(self, text: str, token_ids: list[int]) -> tuple[str, str]:
        thinks = self._decide(token_ids)
        if not thinks or self._ended:
            return "", text
        previous_text, previous_ids = self._text, self._ids
        self._text, self._ids = previous_text + text, previous_ids + list(token_ids)
        message = self.parser.extract_reasoning_streaming(
            previous_text, self._text, text, previous_ids, self._ids, list(token_ids)
        )
        self._ended = self.parser.is_reasoning_end_streaming(self._ids, list(token_ids))
        if message is None:
            # vLLM's parsers drop a piece whose only token is the end mark, but the
            # detokenizer may have held back text of earlier tokens (the rest of a character
            # split across tokens) and send it with the mark.
            end = self.marks.end
            if self._ended and end and end in text:
                thinking, _, answer = text.partition(end)
                return thinking, answer
            return "", ""
        return message.reasoning or "", message.content or ""

    def _flush(self) -> tuple[str, str]:
        # Parsers on vLLM's parser engine hold back text that may begin a mark.
        parser = self._parser
        if (
            parser is None
            or not self.thinks
            or not getattr(parser, "engine_based_streaming", False)
        ):
            return "", ""
        flush = getattr(parser, "finish_streaming", None)
        message = flush() if flush is not None else None
        if message is None:
            return "", ""
        return message.reasoning or "", message.content or ""

    def whole(self, text: str, token_ids: list[int]) -> tuple[str | None, str, int]:
        if not self._decide(list(token_ids)):
            return None, text, 0
        parser = self.new_parser()
        thinking, answer = parser.extract_reasoning(text, None)
        # vLLM counts the tokens between the marks; a block the prompt opened starts before
        # the reply, so its start mark is put back for the count.
        start = [self.marks.start_id] if self.opened and self.marks.start_id is not None else []
        spent = parser.count_reasoning_tokens(start + list(token_ids))
        return (*_tidy(thinking or "", answer), spent)


class HarmonyReader(ReplyReader):
    """A gpt-oss reply (harmony channels) through lmpress's own reader: vLLM's openai_gptoss
    parser finds only where the thinking ends."""

    def __init__(self, tokenizer: Any):
        super().__init__()
        self.tokenizer = tokenizer
        self.splitter = common.StreamSplitter(common.HARMONY, opened=False)

    def _split_piece(self, text: str, token_ids: list[int]) -> tuple[str, str]:
        return self.splitter.feed(text)

    def _flush(self) -> tuple[str, str]:
        return self.splitter.flush()

    def whole(self, text: str, token_ids: list[int]) -> tuple[str | None, str, int]:
        thinking, answer = common.split(text, common.HARMONY)
        if thinking is None:
            return None, answer, 0
        # The thinking's tokens, as the tokenizer writes its text (the channel marks around it
        # left out): the reply's ids are not read by channel here.
        return thinking, answer, len(self.tokenizer.encode(thinking, add_special_tokens=False))
