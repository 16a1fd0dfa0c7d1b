"""A chat's conversation: the system prompt, the exchanges, and the JSONL row that /save writes
(a batch input row) and /load reads (any batch input or output row)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from lmpress.data.jsonl import JsonlWriter, count_lines, read_lines
from lmpress.data.row_shapes import ParsedRow, RowError, parse_row
from lmpress.vocabulary.errors import InputError
from lmpress.vocabulary.types import ContentPart, Message


@dataclass
class Conversation:
    """What the model sees: an optional system prompt, then the exchanges so far. A message
    whose reply failed (or that a loaded file left unanswered) waits in `unsent` for /retry;
    images attached with /image wait in `attached` for the next message."""

    system: str | None = None
    messages: list[Message] = field(default_factory=list)
    unsent: Message | None = None
    attached: list[ContentPart] = field(default_factory=list)  # /image: for the next message

    def user_message(self, text: str) -> Message:
        """The user's next message: its text, after the images attached to it (taken)."""
        if not self.attached:
            return Message("user", text)
        parts, self.attached = [*self.attached, ContentPart("text", text=text)], []
        return Message("user", parts)

    def with_system(self) -> list[Message]:
        head = [Message("system", self.system)] if self.system else []
        return head + self.messages

    @property
    def exchanges(self) -> int:
        return sum(1 for m in self.messages if m.role == "user")

    def drop_last_exchange(self) -> Message | None:
        """Remove the last user message and everything after it; return that message."""
        for i in range(len(self.messages) - 1, -1, -1):
            if self.messages[i].role == "user":
                message = self.messages[i]
                del self.messages[i:]
                return message
        return None

    def to_row(self) -> dict:
        """A batch input row (`{"messages": [...]}`) of the answered exchanges; a turn's
        provider thinking blocks go with it, as `data.messages` reads them back."""
        return {"messages": [_saved(m) for m in self.with_system()]}

    @classmethod
    def from_messages(cls, messages: list[Message]) -> Conversation:
        system = None
        if messages and messages[0].role == "system":
            system, messages = messages[0].text(), messages[1:]
        unsent = None
        if messages and messages[-1].role == "user":
            unsent, messages = messages[-1], messages[:-1]
        return cls(system, list(messages), unsent)


def _saved(message: Message) -> dict:
    out = message.to_openai()
    if message.reasoning_details:
        out["reasoning_details"] = message.reasoning_details
    return out


def append_row(conversation: Conversation, path: str) -> int:
    """Append the conversation to a JSONL file as one row; return its line number."""
    target = Path(path).expanduser()
    if target.is_dir():
        raise InputError(f"{path}: is a directory; give a file name")
    if not target.parent.is_dir():  # a typo'd directory is not created behind the user's back
        raise InputError(f"{path}: the directory {target.parent} does not exist; create it first")
    line = (count_lines(target) if target.exists() else 0) + 1
    with JsonlWriter(target, "a") as writer:
        writer.write(conversation.to_row())
    return line


def read_row(path: str, wanted: int | None = None) -> ParsedRow:
    """Line `wanted` of a JSONL file (the last row when None), parsed as a batch row."""
    chosen = None
    for line in read_lines(path):
        if wanted is None or line.number == wanted:
            chosen = line
    if chosen is None:
        raise InputError(f"{path}: no line {wanted}" if wanted else f"{path}: no rows")
    if chosen.error:
        raise InputError(f"{path} line {chosen.number}: {chosen.error}")
    try:
        return parse_row(chosen.value, chosen.number, regenerate=False)
    except RowError as exc:
        raise InputError(f"{path} line {chosen.number}: {exc}") from exc
