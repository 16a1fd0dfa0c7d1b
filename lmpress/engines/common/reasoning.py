"""A reasoning model's thinking, kept apart from its answer, on the local engines.

Reasoning models write their thinking before the answer, in one of two forms. `PARSERS` reads
each back (the names are vLLM's `--reasoning-parser` names, so one recipe means the same on
NATIVE, LLAMACPP and VLLM):
- `deepseek_r1`, `qwen3`: a `<think>…</think>` block (DeepSeek-R1 and its distills, Qwen3,
  SmolLM3, QwQ). Many templates open the block themselves, at the end of the prompt; then the
  reply starts inside it. A prompt that closes it again (Qwen3 and SmolLM3 with
  `enable_thinking: false`) leaves none open, and the reply is all answer. The two names read
  the same way here: whether a block is open is read from the prompt, not from the name;
- `openai_gptoss`: gpt-oss's harmony channels: the `analysis` channel is the thinking, `final`
  (and `commentary`) the answer.

The parser comes from `model.reasoning_parser` or else from the marks in the chat template; a
template with neither mark gets none, and its text is never split. `none` turns it off.

`ReasoningFormat.close` is what an engine writes itself to end the thinking, once a row has
thought for `max_reasoning_tokens` tokens: the model then goes on to answer (`ThinkingBudget`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PARSERS = ("deepseek_r1", "qwen3", "openai_gptoss", "none")


@dataclass(frozen=True)
class ReasoningFormat:
    """How one family writes its thinking."""

    name: str
    start: str  # what opens the thinking
    end: str  # what closes it
    close: str  # what an engine writes to close it early: the end mark and what follows it
    answer_start: str = ""  # what opens the answer once the thinking is closed


THINK = ReasoningFormat("deepseek_r1", "<think>", "</think>", "\n</think>\n\n")
HARMONY = ReasoningFormat(
    "openai_gptoss",
    "<|channel|>analysis<|message|>",
    "<|end|>",
    "<|end|><|start|>assistant<|channel|>final<|message|>",
    answer_start="<|channel|>final<|message|>",
)
FORMATS = {"deepseek_r1": THINK, "qwen3": THINK, "openai_gptoss": HARMONY}


def check_parser(explicit: str | None) -> str | None:
    """`model.reasoning_parser` checked when the engine loads."""
    from lmpress.vocabulary.errors import ConfigError

    if explicit is not None and explicit not in PARSERS:
        raise ConfigError(f"model.reasoning_parser '{explicit}' is not one of {', '.join(PARSERS)}")
    return explicit


def format_for(chat_template: str | None, explicit: str | None = None) -> ReasoningFormat | None:
    """The format named by `model.reasoning_parser`, else the one the template's marks show;
    None for a model that does not think (or `reasoning_parser: none`)."""
    if explicit:
        return FORMATS.get(explicit)
    template = chat_template or ""
    if "<|channel|>" in template and "analysis" in template:
        return HARMONY
    if "</think>" in template or "<think>" in template:
        return THINK
    return None


def opened_in(prompt: str, fmt: ReasoningFormat) -> bool:
    """Whether the prompt ends inside a thinking block the template opened itself: the reply
    then starts with the thinking, without the start mark."""
    if fmt is HARMONY:
        return prompt.rstrip().endswith(fmt.start)
    start = prompt.rfind(fmt.start)
    return start >= 0 and start > prompt.rfind(fmt.end)


def split(text: str, fmt: ReasoningFormat | None, opened: bool = False) -> tuple[str | None, str]:
    """(thinking, answer) of a whole reply. The thinking is None when the reply has none (a
    model that does not think, or a block the prompt closed); a reply cut short while still
    thinking is all thinking."""
    if fmt is None:
        return None, text
    if fmt is HARMONY:
        return _split_harmony(text)
    if not opened:
        stripped = text.lstrip()
        if not stripped.startswith(fmt.start):
            return None, text
        text = stripped[len(fmt.start) :]
    thinking, mark, answer = text.partition(fmt.end)
    if not mark:
        return thinking.strip("\n"), ""
    return thinking.strip("\n"), answer.lstrip("\n")


_HARMONY_MESSAGE = re.compile(
    r"(?:<\|start\|>assistant)?<\|channel\|>(\w+)[^<]*<\|message\|>(.*?)"
    r"(?:<\|end\|>|<\|call\|>|<\|return\|>|$)",
    re.S,
)


_HARMONY_ENDS = ("<|end|>", "<|return|>", "<|call|>")


def _split_harmony(text: str) -> tuple[str | None, str]:
    thinking: list[str] = []
    answer: list[str] = []
    found = False
    for match in _HARMONY_MESSAGE.finditer(text):
        found = True
        (thinking if match.group(1) == "analysis" else answer).append(match.group(2))
    if not found:
        return None, text
    return ("\n".join(thinking) if thinking else None), "".join(answer)


class StreamSplitter:
    """Splits a reply into thinking and answer as it streams: `feed` takes each new piece
    of text and returns (thinking, answer) pieces, holding back a tail that may be the start
    of a mark until the next piece shows what it is."""

    def __init__(self, fmt: ReasoningFormat | None, opened: bool = False):
        self.fmt = fmt
        self._pending = ""
        # "start": not yet known whether the reply thinks; "thinking"; "answer"
        self._state = "answer" if fmt is None else ("thinking" if opened else "start")
        self._answer_started = False

    def feed(self, text: str) -> tuple[str, str]:
        fmt = self.fmt
        if fmt is None:
            return "", text
        self._pending += text
        thinking, answer = "", ""
        while self._pending:
            if self._state == "start":
                stripped = self._pending.lstrip()
                if fmt.start.startswith(stripped):  # could still become the start mark
                    break
                if stripped.startswith(fmt.start):
                    self._pending = stripped[len(fmt.start) :].lstrip("\n")
                    self._state = "thinking"
                else:
                    self._state = "answer"
            elif self._state == "thinking":
                end = self._pending.find(fmt.end)
                if end >= 0:
                    thinking += self._pending[:end]
                    self._pending = self._pending[end + len(fmt.end) :]
                    self._state = "answer"
                    continue
                keep = _partial_suffix(self._pending, fmt.end)
                thinking += self._pending[: len(self._pending) - keep]
                self._pending = self._pending[len(self._pending) - keep :]
                break
            else:
                if fmt is HARMONY:
                    answer_at = self._pending.find(fmt.answer_start)
                    if answer_at >= 0 and not self._answer_started:
                        self._pending = self._pending[answer_at + len(fmt.answer_start) :]
                        self._answer_started = True
                        continue
                    if not self._answer_started:
                        break  # the channel header is still arriving
                    self._pending = re.sub(r"<\|(?:end|return|call)\|>", "", self._pending)
                    keep = max(_partial_suffix(self._pending, m) for m in _HARMONY_ENDS)
                    if keep:
                        answer += self._pending[: len(self._pending) - keep]
                        self._pending = self._pending[len(self._pending) - keep :]
                        break
                if not self._answer_started:
                    self._pending = self._pending.lstrip("\n")
                    if not self._pending:
                        break
                    self._answer_started = True
                answer += self._pending
                self._pending = ""
        return thinking, answer

    def flush(self) -> tuple[str, str]:
        """What is held back once the reply has ended."""
        pending, self._pending = self._pending, ""
        if self.fmt is HARMONY:
            pending = "" if pending.startswith("<|") else pending
        if self._state == "thinking":
            return pending, ""
        if self._state == "start" and self.fmt is not None and pending.strip() == "":
            return "", ""
        return "", pending


def _partial_suffix(text: str, mark: str) -> int:
    """The length of the longest tail of `text` that is a proper start of `mark`."""
    for size in range(min(len(mark) - 1, len(text)), 0, -1):
        if mark.startswith(text[-size:]):
            return size
    return 0


class ThinkingBudget:
    """One sample's thinking on a local engine, token by token: counts the tokens it thinks,
    and once it has thought `limit` of them, hands out the tokens of `close` one by one for
    the engine to emit in place of what it would sample. `thinking` says whether the sample is
    still inside its thinking: grammars (JSON schemas, tool calls) apply only once it is over.

    `end_ids` are the token ids of the end mark as the tokenizer writes it (one token for a
    model that has `</think>` in its vocabulary); a sample that writes them ends its thinking."""

    def __init__(
        self,
        opened: bool,
        limit: int | None,
        close_ids: list[int],
        end_ids: list[int],
        start_ids: list[int] | None = None,
    ):
        self.limit = limit
        self.close_ids = close_ids
        self.end_ids = end_ids
        self.start_ids = start_ids or []
        # A template that did not open the block: the sample may still open it with its
        # first tokens (start_ids), else it answers straight away.
        self.thinking = opened
        self._may_open = not opened and bool(self.start_ids)
        self.spent = 0  # tokens thought, the end mark left out
        self._recent: list[int] = []
        self._forcing: list[int] = []

    def forced(self) -> int | None:
        """The token the engine must emit next instead of sampling, or None."""
        limit = self.limit
        if not self._forcing and self.thinking and limit is not None and self.spent >= limit:
            self._forcing = list(self.close_ids)
        return self._forcing[0] if self._forcing else None

    def accept(self, token: int) -> None:
        """Take the token the sample emitted."""
        if self._forcing:
            self._forcing.pop(0)
            if not self._forcing:
                self.thinking = False
            return
        if self._may_open:
            self._recent.append(token)
            if self._recent == self.start_ids[: len(self._recent)]:
                if len(self._recent) == len(self.start_ids):
                    self.thinking, self._may_open, self._recent = True, False, []
                return
            self._may_open, self._recent = False, []
            return
        if not self.thinking:
            return
        self.spent += 1
        self._recent = (self._recent + [token])[-len(self.end_ids) :] if self.end_ids else []
        if self.end_ids and self._recent == self.end_ids:
            self.thinking = False
            self.spent -= len(self.end_ids)
