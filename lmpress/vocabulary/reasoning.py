"""A reasoning model's thinking, kept apart from its answer: how each family writes it, read back
from a reply and bounded while a local engine writes it.

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
thought for `max_reasoning_tokens` tokens: the model then goes on to answer (`ReasoningBudget`).
A row under a grammar (a JSON schema, a required tool call) is held to it only once its
thinking is over; the engine writes the marks between thinking and answer itself (the start
mark where the prompt did not open the block, and what follows the end mark), so that the
grammar starts exactly where the answer does.
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
    then starts with the thinking, without the start mark. Only the start mark at the very end
    counts (whitespace aside): a user's own text that mentions `<think>` opens nothing."""
    return prompt.rstrip().endswith(fmt.start)


def closed_in(prompt: str, fmt: ReasoningFormat) -> bool:
    """Whether the prompt ends just after a thinking block the template closed itself (Qwen3's
    and SmolLM3's `enable_thinking: false` write an empty one), or with the answer opened: the
    reply is then all answer."""
    if fmt is HARMONY:
        return prompt.rstrip().endswith(fmt.answer_start)
    return prompt.rstrip().endswith(fmt.end)


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


# One harmony message: its channel, then (after a header that may name a recipient or a
# `<|constrain|>` format) its content, up to the mark that ends it or the end of the text.
_HARMONY_MESSAGE = re.compile(
    r"(?:<\|start\|>assistant)?<\|channel\|>(\w+)(?:(?!<\|message\|>).)*?<\|message\|>(.*?)"
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
    of a mark (and thinking's trailing newlines, which `split` strips) until the next piece
    shows what it is; `flush` hands out the rest once the reply has ended. The pieces join up
    to what `split` gives for the whole reply. Each feed reads only what is new since the last
    mark, so a long reply streams in time linear in its length."""

    def __init__(self, fmt: ReasoningFormat | None, opened: bool = False):
        self.fmt = fmt
        self._text = ""
        # THINK: "start" (not yet known whether the reply thinks), "thinking" (from `_at`),
        # "answer" (from `_at`, its leading newlines dropped), or "plain" (all answer).
        self._state = "thinking" if opened else "start"
        self._at = 0  # where the thinking or the answer begins in the text
        self._sent = 0  # THINK: where what was handed out of the current part ends
        self._leading = True  # THINK: the current part's leading newlines still to drop
        # HARMONY: the contents of the messages read whole so far (thinking, answer), up to
        # `_at`; the message still arriving (whether it thinks, where its content begins) and
        # how far it has been searched for its end; how much of each part was handed out.
        self._parts: tuple[list[str], list[str]] = ([], [])
        self._live: tuple[bool, int] | None = None
        self._scan = 0
        self._sent_parts = [0, 0]

    def feed(self, text: str) -> tuple[str, str]:
        if self.fmt is None:
            return "", text
        self._text += text
        if self.fmt is HARMONY:
            return self._harmony(final=False)
        return self._think(final=False)

    def flush(self) -> tuple[str, str]:
        """What is held back, once the reply has ended."""
        if self.fmt is None:
            return "", ""
        if self.fmt is HARMONY:
            return self._harmony(final=True)
        return self._think(final=True)

    def _think(self, final: bool) -> tuple[str, str]:
        fmt, text = self.fmt, self._text
        if self._state == "start":
            stripped = text.lstrip()
            if stripped.startswith(fmt.start):
                self._state, self._at = "thinking", len(text) - len(stripped) + len(fmt.start)
                self._sent = self._at
            elif fmt.start.startswith(stripped) and not final:
                return "", ""  # all whitespace, or the start mark's beginning
            else:
                self._state = "plain"
        if self._state == "plain":
            piece, self._sent = text[self._sent :], len(text)
            return "", piece
        thinking = ""
        if self._state == "thinking":
            end = text.find(fmt.end, max(self._at, self._sent - len(fmt.end)))
            if end < 0 and not final:  # hold back what may begin the end mark, and newlines
                limit = len(text) - _partial_suffix(text, fmt.end)
            else:
                limit = len(text) if end < 0 else end
            if self._leading:  # the thinking's leading newlines are dropped
                self._skip_newlines(limit)
            stop = limit
            while stop > self._sent and text[stop - 1] == "\n":
                stop -= 1
            thinking, self._sent = text[self._sent : stop], max(self._sent, stop)
            if end < 0:
                return thinking, ""
            self._state, self._at = "answer", end + len(fmt.end)
            self._sent, self._leading = self._at, True
        if self._leading:  # the answer's leading newlines are dropped
            self._skip_newlines(len(text))
        piece, self._sent = text[self._sent :], len(text)
        return thinking, piece

    def _skip_newlines(self, limit: int) -> None:
        """Drop the newlines that open the current part, up to `limit`."""
        text = self._text
        while self._sent < limit and text[self._sent] == "\n":
            self._sent += 1
        self._leading = self._sent == limit

    def _harmony(self, final: bool) -> tuple[str, str]:
        text = self._text
        keep = 0 if final else max(_partial_suffix(text, mark) for mark in _HARMONY_MARKS)
        head = text[: len(text) - keep]
        if self._state == "start":
            if _HARMONY_HEADER.search(head) is None:
                stripped = head.lstrip()
                if final or not (stripped.startswith("<|") or "<|".startswith(stripped)):
                    self._state = "plain"  # no channels: all of it is answer, as split says
                else:
                    return "", ""
            else:
                self._state = "messages"
        if self._state == "plain":
            piece, self._sent = text[self._sent :], len(text)
            return "", piece
        while True:
            if self._live is None:  # between messages: the next one's header
                header = _HARMONY_HEADER.search(head, self._at)
                if header is None:
                    break
                self._live = (header.group(1) == "analysis", header.end())
                self._scan = header.end()
            thinks, begins = self._live
            ends = [at for at in (head.find(m, self._scan) for m in _HARMONY_ENDS) if at >= 0]
            if not ends:
                self._scan = max(begins, len(head) - max(map(len, _HARMONY_ENDS)))
                break
            end = min(ends)
            self._parts[not thinks].append(head[begins:end])
            self._at = end + next(len(m) for m in _HARMONY_ENDS if head.startswith(m, end))
            self._live = None
        return self._new_harmony(True, head), self._new_harmony(False, head)

    def _new_harmony(self, thinks: bool, head: str) -> str:
        """What is new of the thinking (or the answer): the messages read whole, joined as
        `split` joins them, then the one still arriving."""
        parts = self._parts[not thinks]
        glue = "\n" if thinks else ""
        done = sum(map(len, parts)) + len(glue) * max(0, len(parts) - 1)
        live = self._live is not None and self._live[0] == thinks
        joint = glue if parts and live else ""
        sent = self._sent_parts[not thinks]
        piece = ""
        if sent < done + len(joint):  # joined only when some of it is new
            piece = (glue.join(parts) + joint)[sent:]
        if live:
            piece += head[self._live[1] + max(0, sent - done - len(joint)) :]
        self._sent_parts[not thinks] = sent + len(piece)
        return piece


# A harmony message's header: its channel, then what may name a recipient or a
# `<|constrain|>` format, up to where its content begins.
_HARMONY_HEADER = re.compile(
    r"(?:<\|start\|>assistant)?<\|channel\|>(\w+)(?:(?!<\|message\|>).)*?<\|message\|>", re.S
)


_HARMONY_MARKS = (
    "<|start|>assistant",
    "<|channel|>",
    "<|message|>",
    "<|constrain|>",
    *_HARMONY_ENDS,
)


def _partial_suffix(text: str, mark: str) -> int:
    """The length of the longest tail of `text` that is a proper start of `mark`."""
    for size in range(min(len(mark) - 1, len(text)), 0, -1):
        if mark.startswith(text[-size:]):
            return size
    return 0


class ReasoningBudget:
    """One sample's thinking on a local engine, token by token: counts the tokens it thinks,
    and once it has thought `limit` of them, hands out the tokens of `close` one by one for
    the engine to emit in place of what it would sample. `waits` says whether the sample is
    still inside its thinking (or inside marks the engine writes): grammars (JSON schemas,
    tool calls) apply only once it is over.

    `end_ids` are the token ids of the end mark as the tokenizer writes it (one token for a
    model that has `</think>` in its vocabulary); a sample that writes them ends its thinking.
    For a sample under a grammar the engine writes what must come between the thinking and
    the answer itself: the start mark where the prompt did not open the block
    (`force_open`), and after the model's own end mark the rest of `close` (`after_end_ids`:
    THINK's blank line, harmony's final-channel header), so that the grammar starts where the
    answer does."""

    def __init__(
        self,
        opened: bool,
        limit: int | None,
        close_ids: list[int],
        end_ids: list[int],
        start_ids: list[int] | None = None,
        *,
        force_open: bool = False,
        after_end_ids: list[int] | None = None,
    ):
        self.limit = limit
        self.close_ids = close_ids
        self.end_ids = end_ids
        self.start_ids = start_ids or []
        self.after_end_ids = after_end_ids or []
        # A template that did not open the block: the sample may still open it with its
        # first tokens (start_ids), else it answers straight away.
        self.thinking = opened
        self._may_open = not opened and bool(self.start_ids) and not force_open
        self.spent = 0  # tokens thought, the end mark left out
        self._recent: list[int] = []
        # What the engine writes next in place of sampling, and whether it opens the block.
        self._forcing = list(self.start_ids) if force_open and not opened else []
        self._opening = bool(self._forcing)

    @property
    def waits(self) -> bool:
        """Whether a grammar must wait: the sample thinks, or the engine writes marks."""
        return self.thinking or bool(self._forcing)

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
                self.thinking, self._opening = self._opening, False
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
            self._forcing = list(self.after_end_ids)
