"""The terminal side of `lmpress chat`: reading messages (prompt, line editing, multi-line
input, piped lines), showing replies (plain or Markdown) and styling notices."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple, TextIO

from lmpress.vocabulary.errors import Terminated
from lmpress.vocabulary.types import GenerationParams, Result

PROMPT = "> "
CONTINUE = "... "
BLOCK = '"""'
HISTORY_LINES = 1000


# --- reading ---------------------------------------------------------------------------------


def read_messages(
    interactive: bool, on_interrupt: Callable[[str], None] | None = None
) -> Iterator[str]:
    """Each message typed (or piped), multi-line input joined. A line ending in a backslash
    goes on on the next line; lines between \"\"\" and \"\"\" are one message.
    Ctrl-C at the prompt drops the line being typed; end of input ends the iteration."""
    read = _prompted if interactive else _piped
    while True:
        try:
            line = read(PROMPT)
            if line is None:
                if interactive:
                    print()  # leave the terminal on a fresh line after Ctrl-D
                return
            message = _gather(line, read)
        except KeyboardInterrupt:
            print()
            if on_interrupt:
                on_interrupt("(Ctrl-C clears the line; Ctrl-D or /exit leaves)")
            continue
        except Terminated:  # SIGTERM at the prompt: what comes next starts a fresh line
            if interactive:
                print()
            raise
        yield message.rstrip("\r\n")  # a pasted block's last newline is not part of it


def _gather(line: str, read: Callable[[str], str | None]) -> str:
    if line.startswith(BLOCK):
        first = line[len(BLOCK) :]
        if first.rstrip().endswith(BLOCK):
            return first.rstrip()[: -len(BLOCK)]
        lines = [first] if first else []
        while (more := read(CONTINUE)) is not None:
            if more.rstrip().endswith(BLOCK):
                last = more.rstrip()[: -len(BLOCK)]
                if last:
                    lines.append(last)
                break
            lines.append(more)
        return "\n".join(lines)
    lines = []
    while line.endswith("\\"):
        lines.append(line[:-1])
        more = read(CONTINUE)
        if more is None:
            line = ""
            break
        line = more
    lines.append(line)
    return "\n".join(lines)


def _prompted(prompt: str) -> str | None:
    try:
        return input(prompt)
    except EOFError:
        return None


def _piped(prompt: str) -> str | None:
    line = sys.stdin.readline()
    return line.rstrip("\r\n") if line else None


def setup_readline(commands: list[str]) -> Callable[[], None]:
    """Line editing, Tab completion of commands and a history of typed lines kept across
    sessions (in $XDG_STATE_HOME/lmpress/chat_history). Returns what saves the history."""
    try:
        import readline
    except ImportError:  # Windows without pyreadline: plain input still works
        return lambda: None

    def complete(text: str, index: int) -> str | None:
        """The index-th completion of `text` (readline asks 0, 1, ... until None)."""
        if readline.get_begidx() != 0:
            return None
        matches = [c + " " for c in commands if c.startswith(text)]
        return matches[index] if index < len(matches) else None

    readline.set_completer(complete)
    readline.set_completer_delims(" \t\n")
    if "libedit" in (readline.__doc__ or ""):
        readline.parse_and_bind("bind ^I rl_complete")
    else:
        readline.parse_and_bind("tab: complete")
        # A pasted block arrives as one input, newlines and all, instead of one message a line.
        readline.parse_and_bind("set enable-bracketed-paste on")

    # XDG's directory for data kept between sessions that is not worth a backup.
    xdg_dir = os.environ.get("XDG_STATE_HOME") or "~/.local/state"
    path = Path(xdg_dir).expanduser() / "lmpress" / "chat_history"
    try:
        readline.read_history_file(path)
    except OSError:  # none yet, or unreadable: start empty
        pass
    readline.set_history_length(HISTORY_LINES)

    def save() -> None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            readline.write_history_file(path)
        except OSError:
            pass  # a history that cannot be kept is no reason to fail

    return save


@contextlib.contextmanager
def keys_not_echoed() -> Iterator[None]:
    """While a reply streams, keys typed are not echoed into it (they wait for the next
    prompt), and neither is Ctrl-C's "^C", which would break a Markdown redraw."""
    try:
        import termios

        fd = sys.stdin.fileno()
        saved = termios.tcgetattr(fd)
    except (ImportError, OSError, ValueError):  # not a terminal, or no termios (Windows)
        yield
        return
    quiet = list(saved)
    quiet[3] &= ~(termios.ECHO | termios.ECHOCTL)
    termios.tcsetattr(fd, termios.TCSANOW, quiet)
    try:
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSANOW, saved)


# --- showing ---------------------------------------------------------------------------------


def colors_on(stream: TextIO) -> bool:
    """Whether to style what goes to `stream`: a terminal, unless NO_COLOR or TERM=dumb."""
    return stream.isatty() and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"


class Style:
    """Notices, status lines and errors, dimmed or coloured on a terminal (unless NO_COLOR)."""

    def __init__(self, stream: TextIO):
        self.stream = stream
        self.color = colors_on(stream)

    def _write(self, text: str, code: str | None) -> None:
        sys.stdout.flush()  # keep the order of reply and notice when both go to one terminal
        if self.color and code:
            text = f"\x1b[{code}m{text}\x1b[0m"
        self.stream.write(text + "\n")
        self.stream.flush()

    def info(self, text: str) -> None:
        self._write(text, None)

    def note(self, text: str) -> None:
        self._write(text, "2")

    def status(self, text: str) -> None:
        self._write(text, "2")

    def error(self, text: str) -> None:
        self._write(f"error: {text}", "31")


class Cut(NamedTuple):
    """Why a reply ended before the model ended it: the words, and whether the context (not
    generation.max_new_tokens) was the limit."""

    text: str
    by_context: bool


def why_cut(result: Result, params: GenerationParams) -> Cut | None:
    """Why a reply was cut, or None when the model ended it. A finish reason of "length" with
    fewer tokens than generation.max_new_tokens means the context ran out (the local engines
    cap a reply at what the context has left; providers say "length" for both)."""
    cut = [s for s in result.samples if s.finish_reason == "length"]
    if not cut:
        return None
    made = cut[0].completion_tokens
    if not made or made >= params.max_new_tokens:
        return Cut(f"cut at generation.max_new_tokens={params.max_new_tokens}", False)
    prompt = result.usage.prompt_tokens
    held = f"prompt {prompt} + reply {made} tokens" if prompt else f"after {made} tokens"
    return Cut(f"cut at the end of the model's context ({held}), not by max_new_tokens", True)


# Control characters a model may emit (a bell, an escape sequence) are shown, not obeyed.
SHOWN_CONTROLS = {c: "\ufffd" for c in [*range(0x20), *range(0x7F, 0xA0)] if chr(c) not in "\t\n"}


def printable(text: str) -> str:
    return text.translate(SHOWN_CONTROLS)


class PlainReply:
    def __init__(self, out: TextIO):
        self.out = out
        self.last = ""

    def add(self, text: str) -> None:
        if text:
            self.out.write(printable(text))
            self.out.flush()
            self.last = text

    def finish(self, empty_line: bool = True) -> None:
        """End the reply's line; an empty reply leaves an empty line unless told not to."""
        if (self.last and not self.last.endswith("\n")) or (not self.last and empty_line):
            self.out.write("\n")
        self.out.flush()


class MarkdownReply:
    """Renders the reply as Markdown, redrawn as it grows."""

    def __init__(self, out: TextIO):
        from rich.console import Console
        from rich.live import Live

        self.text = ""
        self.console = Console(file=out, highlight=False)
        self.live = Live(
            console=self.console, refresh_per_second=8, vertical_overflow="visible", transient=False
        )
        self.live.start()

    def add(self, text: str) -> None:
        from rich.markdown import Markdown

        self.text += printable(text)
        self.live.update(Markdown(self.text))

    def finish(self, empty_line: bool = True) -> None:
        from rich.markdown import Markdown

        self.live.update(Markdown(self.text), refresh=True)
        self.live.stop()


class ThinkingView:
    """A reasoning model's thinking as it streams, dimmed on a terminal, on a stream apart from
    the answer's (stderr), so that a pipe gets the answer alone. `end` closes it before the
    answer starts."""

    DIM, RESET = "\x1b[2m", "\x1b[0m"

    def __init__(self, stream: TextIO, shown: bool = True):
        self.stream = stream
        self.shown = shown
        self.color = colors_on(stream)
        self.last = ""
        self.open = False

    def add(self, text: str) -> None:
        if not (self.shown and text):
            return
        if not self.open:
            self.open = True
            if self.color:
                self.stream.write(self.DIM)
        self.stream.write(printable(text))
        self.stream.flush()
        self.last = text

    def show(self, text: str | None) -> None:
        """A whole thinking at once (none: nothing)."""
        self.add(text or "")
        self.end()

    def end(self) -> None:
        if not self.open:
            return
        self.open = False
        self.stream.write(
            (self.RESET if self.color else "") + ("" if self.last.endswith("\n") else "\n")
        )
        self.stream.flush()


def reply_renderer(out: TextIO, markdown: bool) -> PlainReply | MarkdownReply:
    return MarkdownReply(out) if markdown else PlainReply(out)
