"""`lmpress chat`: a multi-turn terminal chat over any engine.

One engine, one event loop, one conversation. Each message becomes one Request that carries the
whole history; the reply streams to stdout and, once complete (or stopped with Ctrl-C), joins
the history. Slash commands change the conversation or the generation settings between turns.

In a terminal, lines are read with readline (editing, history of typed lines, Tab completes
commands). Piped (`lmpress chat < script.txt`), each line of stdin is a message (or a command)
and only the replies go to stdout; status lines and notices always go to stderr.
"""

from __future__ import annotations

import asyncio
import dataclasses
import difflib
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from lmpress.chat_io import (
    Style,
    keys_not_echoed,
    read_messages,
    reply_renderer,
    setup_readline,
)
from lmpress.configs.loading import _parse_scalar, generation_with_overrides, validate
from lmpress.configs.schema import RunConfig
from lmpress.data.formats import RowError, parse_row
from lmpress.data.jsonl import JsonlWriter, count_lines, read_lines
from lmpress.engines.base import Engine, check_params
from lmpress.engines.registry import create_engine
from lmpress.errors import ConfigError, InputError, LmpressError, RequestError
from lmpress.types import SCHEDULING_FIELDS, Delta, GenerationParams, Message, Request, Result

GENERATION_FIELDS = [f.name for f in dataclasses.fields(GenerationParams)]


@dataclass
class Conversation:
    """What the model sees: an optional system prompt, then the exchanges so far. A message
    whose reply failed (or that a loaded file left unanswered) waits in `unsent` for /retry."""

    system: str | None = None
    messages: list[Message] = field(default_factory=list)
    unsent: Message | None = None

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
        """A batch input row (`{"messages": [...]}`) of the answered exchanges."""
        return {"messages": [m.to_openai() for m in self.with_system()]}

    @classmethod
    def from_messages(cls, messages: list[Message]) -> Conversation:
        system = None
        if messages and messages[0].role == "system":
            system, messages = messages[0].text(), messages[1:]
        unsent = None
        if messages and messages[-1].role == "user":
            unsent, messages = messages[-1], messages[:-1]
        return cls(system, list(messages), unsent)


@dataclass
class Turn:
    """One reply as it streams: filled in place, so a Ctrl-C at any await keeps what came."""

    pieces: list[str] = field(default_factory=list)
    result: Result | None = None
    stopped: bool = False
    error: str | None = None
    started: float = field(default_factory=time.perf_counter)
    elapsed: float = 0.0

    @property
    def text(self) -> str:
        return self.result.text if self.result and not self.stopped else "".join(self.pieces)


@dataclass
class Command:
    run: Callable[[Chat, str], None]
    usage: str
    about: str


class LeaveChat(Exception):
    """/exit was typed."""


class Chat:
    def __init__(
        self,
        engine: Engine,
        config: RunConfig,
        loop: asyncio.AbstractEventLoop,
        *,
        system: str | None = None,
        markdown: bool = False,
        interactive: bool = True,
        out: TextIO | None = None,
        info: TextIO | None = None,
    ):
        self.engine = engine
        self.config = config
        self.params = config.generation
        self.loop = loop
        self.conversation = Conversation(system=system)
        self.markdown = markdown
        self.interactive = interactive
        self.out = out or sys.stdout
        self.style = Style(info or sys.stderr)
        self.failures = 0
        self.turns = 0

    # --- the loop ------------------------------------------------------------------------

    def run(self, lines: Iterator[str]) -> int:
        """Handle each message or command; return the exit code (1 if anything failed)."""
        for line in lines:
            try:
                self.handle(line)
            except LeaveChat:
                break
            except KeyboardInterrupt:  # between a reply's end and the next prompt
                self.style.note("(Ctrl-C stops a reply; Ctrl-D or /exit leaves)")
        return 1 if self.failures else 0

    def handle(self, line: str) -> None:
        if line.startswith("/") and not line.startswith("//") and "\n" not in line:
            name, _, arg = line[1:].strip().partition(" ")
            command = COMMANDS.get(name.lower()) or ALIASES.get(name.lower())
            if command is None:
                self.fail(f"unknown command '/{name}'. Commands: {command_list()}")
                return
            try:
                command.run(self, arg.strip())
            except (LmpressError, RowError) as exc:
                self.fail(str(exc))
            return
        text = line[1:] if line.startswith("//") else line
        if text.strip():
            self.send(Message("user", text))

    def fail(self, message: str) -> None:
        self.failures += 1
        self.style.error(message)

    # --- one reply -----------------------------------------------------------------------

    def send(self, message: Message) -> None:
        conversation = self.conversation
        conversation.unsent = None
        self.turns += 1
        request = Request(f"chat-{self.turns}", [*conversation.with_system(), message], self.params)
        turn = self._run_turn(request)
        if turn.error:
            conversation.unsent = message
            self.fail(f"{turn.error} (/retry sends your message again)")
            return
        if turn.stopped and not turn.text:
            conversation.unsent = message
            self.style.note("stopped before any text came; /retry sends your message again")
            return
        conversation.messages += [message, Message("assistant", turn.text)]
        if turn.result and not turn.stopped:
            for i, sample in enumerate(turn.result.samples[1:], start=2):
                self.out.write(f"--- sample {i} ---\n{sample.text}\n")
            self.out.flush()
        self.style.status(status_line(turn, self.params))

    def _run_turn(self, request: Request) -> Turn:
        turn = Turn()
        task = self.loop.create_task(self._stream(request, turn))
        if not self.interactive:  # piped: Ctrl-C ends the whole run
            self.loop.run_until_complete(task)
            turn.elapsed = time.perf_counter() - turn.started
            return turn

        # Ctrl-C cancels this reply only; the stream's own cleanup frees it in the engine.
        def stop_reply(signum, frame):
            self.loop.call_soon_threadsafe(task.cancel)

        previous = signal.signal(signal.SIGINT, stop_reply)
        try:
            with keys_not_echoed():
                self.loop.run_until_complete(task)
        except asyncio.CancelledError:  # a second Ctrl-C while the stream was closing
            turn.stopped = True
        finally:
            signal.signal(signal.SIGINT, previous)
        turn.elapsed = time.perf_counter() - turn.started
        return turn

    async def _stream(self, request: Request, turn: Turn) -> None:
        renderer = reply_renderer(self.out, self.markdown)
        stream = self.engine.stream(request)
        try:
            async for item in stream:
                if isinstance(item, Delta) and item.index == 0:
                    turn.pieces.append(item.text)
                    renderer.add(item.text)
                elif isinstance(item, Result):
                    turn.result = item
                    if item.error:
                        turn.error = item.error.message
                    elif not turn.pieces and item.text:  # an engine that sends no deltas
                        renderer.add(item.text)
                    break
        except asyncio.CancelledError:
            turn.stopped = True
        except (LmpressError, RequestError) as exc:
            turn.error = str(exc)
        except Exception as exc:  # an engine bug must not end the chat
            if debug():
                traceback.print_exc()
            turn.error = f"internal error: {type(exc).__name__}: {exc} (--debug shows more)"
        finally:
            renderer.finish(empty_line=not (turn.error or turn.stopped))
            close = getattr(stream, "aclose", None)
            if close is not None:
                await close()
        if turn.result is None and not turn.stopped and not turn.error:
            turn.error = f"engine {self.engine.name} ended the reply without a result"

    # --- commands ------------------------------------------------------------------------

    def cmd_help(self, arg: str) -> None:
        self.style.info(help_text())

    def cmd_reset(self, arg: str) -> None:
        self.conversation.messages.clear()
        self.conversation.unsent = None
        self.style.note("conversation forgotten; the system prompt and settings are kept")

    def cmd_system(self, arg: str) -> None:
        conversation = self.conversation
        if not arg:
            if conversation.system:
                self.style.note(f"system prompt: {conversation.system}")
            else:
                self.style.note("no system prompt; set one with /system TEXT")
        elif arg.lower() in ("clear", "none", "off"):
            conversation.system = None
            self.style.note("system prompt removed")
        else:
            conversation.system = arg
            self.style.note("system prompt set; it applies from the next reply")

    def cmd_set(self, arg: str) -> None:
        if not arg:
            self.style.note(settings_text(self.params))
            return
        key, value = split_setting(arg)
        self.params = checked_params(self.engine, self.config, self.params, key, value)
        name = key.rsplit(".", 1)[-1]
        self.style.note(f"generation.{name} = {getattr(self.params, name)!r}")

    def cmd_retry(self, arg: str) -> None:
        conversation = self.conversation
        message = conversation.unsent or conversation.drop_last_exchange()
        if message is None:
            raise InputError("nothing to retry yet: send a message first")
        self.style.note("(regenerating)")
        self.send(message)

    def cmd_undo(self, arg: str) -> None:
        conversation = self.conversation
        if conversation.unsent is not None:
            conversation.unsent = None
            self.style.note("dropped your unanswered message")
        elif conversation.drop_last_exchange() is not None:
            left = conversation.exchanges
            self.style.note(f"dropped the last exchange; {left} left")
        else:
            raise InputError("nothing to undo: the conversation is empty")

    def cmd_save(self, arg: str) -> None:
        if not arg:
            raise InputError("usage: /save FILE (the conversation is appended as one JSONL row)")
        conversation = self.conversation
        if not conversation.messages:
            raise InputError("nothing to save yet: no message has had a reply")
        path = Path(arg).expanduser()
        if path.is_dir():
            raise InputError(f"{arg}: is a directory; give a file name")
        line = (count_lines(path) if path.exists() else 0) + 1
        with JsonlWriter(path, "a") as writer:
            writer.write(conversation.to_row())
        unsent = " (not your unanswered message)" if conversation.unsent else ""
        self.style.note(
            f"saved {conversation.exchanges} exchange(s){unsent} to {arg} (line {line}); "
            f"continue it with /load {arg}, replay it with lmpress batch -i {arg} -o OUT.jsonl"
        )

    def cmd_load(self, arg: str) -> None:
        if not arg:
            raise InputError("usage: /load FILE [LINE] (the file's last row unless LINE is given)")
        path, wanted = arg, None
        if not Path(arg).expanduser().exists() and arg.rsplit(" ", 1)[-1].isdigit():
            path, number = arg.rsplit(" ", 1)
            wanted = int(number)
        chosen = None
        for line in read_lines(path):
            if wanted is None or line.number == wanted:
                chosen = line
        if chosen is None:
            raise InputError(f"{path}: no line {wanted}" if wanted else f"{path}: no rows")
        if chosen.error:
            raise InputError(f"{path} line {chosen.number}: {chosen.error}")
        try:
            row = parse_row(chosen.value, chosen.number)
        except RowError as exc:
            raise InputError(f"{path} line {chosen.number}: {exc}") from exc
        self.conversation = Conversation.from_messages(row.messages)
        note = f"loaded {self.conversation.exchanges} exchange(s) from {path} line {chosen.number}"
        if self.conversation.system:
            note += " with its system prompt"
        if self.conversation.unsent:
            note += "; its last message has no reply yet: /retry generates one"
        if row.overrides:
            note += "; its row's generation settings are not applied (use /set)"
        self.style.note(note)
        last = self.conversation.messages[-1:] or [self.conversation.unsent]
        if last[0] is not None:
            self.style.note(f"last {last[0].role} message: {one_line(last[0].text())}")

    def cmd_exit(self, arg: str) -> None:
        raise LeaveChat


COMMANDS: dict[str, Command] = {
    "help": Command(Chat.cmd_help, "/help", "show this help"),
    "reset": Command(Chat.cmd_reset, "/reset", "forget the conversation (keeps system prompt and settings)"),
    "system": Command(Chat.cmd_system, "/system TEXT", "set the system prompt (alone: show it; '/system clear' removes it)"),
    "set": Command(Chat.cmd_set, "/set KEY=VALUE", "change a generation setting, e.g. /set generation.temperature=0.2 (alone: list them)"),
    "retry": Command(Chat.cmd_retry, "/retry", "generate the last reply again"),
    "undo": Command(Chat.cmd_undo, "/undo", "drop the last exchange (your message and its reply)"),
    "save": Command(Chat.cmd_save, "/save FILE", "append the conversation to FILE as one JSONL row ('lmpress batch -i FILE' replays it)"),
    "load": Command(Chat.cmd_load, "/load FILE [LINE]", "continue a conversation saved with /save (the file's last row, or LINE)"),
    "exit": Command(Chat.cmd_exit, "/exit", "leave (Ctrl-D too)"),
}  # fmt: skip
ALIASES = {"quit": COMMANDS["exit"], "?": COMMANDS["help"]}


def command_list() -> str:
    return " ".join(f"/{name}" for name in COMMANDS)


def help_text() -> str:
    width = max(len(c.usage) for c in COMMANDS.values())
    lines = ["Type a message and press Enter to send it. Commands:"]
    lines += [f"  {c.usage:<{width}}  {c.about}" for c in COMMANDS.values()]
    lines += [
        'Several lines: end a line with \\ to go on, or put the lines between """ and """.',
        "Ctrl-C stops a reply (what came so far is kept); Up/Down recall typed lines.",
        "A message that starts with / is sent by typing // for its first /.",
    ]
    return "\n".join(lines)


def settings_text(params: GenerationParams) -> str:
    shown = ["max_new_tokens", "temperature", "top_p", "top_k", "seed", "stop_strings"]
    shown += [name for name in params.changed_fields() if name not in shown]
    values = ", ".join(f"{name}={getattr(params, name)!r}" for name in shown)
    return f"generation: {values}\nchange one with /set generation.KEY=VALUE"


def split_setting(arg: str) -> tuple[str, str]:
    """`generation.temperature=0.2`, `generation.temperature 0.2` or `temperature=0.2`."""
    key, eq, value = arg.partition("=")
    if not eq:
        key, _, value = arg.partition(" ")
    key, value = key.strip(), value.strip()
    if not value:
        raise ConfigError(f"/set {key}: give a value, e.g. /set generation.temperature=0.2")
    if "." not in key:
        key = f"generation.{key}"
    section, _, name = key.partition(".")
    if section != "generation":
        top_level = {f.name for f in dataclasses.fields(RunConfig)}
        if section in top_level:
            raise ConfigError(
                f"/set {key}: only generation settings change during a chat; "
                f"restart with lmpress chat --{key} VALUE"
            )
        raise ConfigError(f"/set {key}: unknown key; settings are generation.KEY")
    if name not in GENERATION_FIELDS:
        close = difflib.get_close_matches(name, GENERATION_FIELDS, n=1, cutoff=0.6)
        hint = f" (did you mean 'generation.{close[0]}'?)" if close else ""
        raise ConfigError(f"/set {key}: unknown key{hint}; /set alone lists the settings")
    if name in SCHEDULING_FIELDS:
        raise ConfigError(f"/set {key}: fixed when the engine starts; give it on the command line")
    return key, value


def checked_params(
    engine: Engine, config: RunConfig, params: GenerationParams, key: str, value: str
) -> GenerationParams:
    """The params with one override, checked as the command line checks it: type, range,
    consistency with the other fields, and the engine's support."""
    name = key.rsplit(".", 1)[-1]
    updated = generation_with_overrides(params, {name: _parse_scalar(value)}, source="generation")
    validate(dataclasses.replace(config, generation=updated))
    check_params(engine, updated)
    return updated


def status_line(turn: Turn, params: GenerationParams) -> str:
    if turn.stopped:
        return (
            f"stopped by Ctrl-C after {turn.elapsed:.1f} s; the partial reply is kept "
            f"(/retry regenerates it, /undo drops it)"
        )
    assert turn.result is not None
    usage = turn.result.usage
    tokens = usage.completion_tokens
    parts = [f"{tokens} tokens"]
    if tokens and turn.elapsed > 0:
        parts.append(f"{tokens / turn.elapsed:.1f} tokens/s")
    parts.append(f"{turn.elapsed:.2f} s")
    if usage.prompt_tokens:  # how much of the context the conversation fills
        parts.append(f"prompt {usage.prompt_tokens} tokens")
    if turn.result.finish_reason == "length":
        parts.append(f"cut at generation.max_new_tokens={params.max_new_tokens}")
    return "[" + " · ".join(parts) + "]"


def one_line(text: str, limit: int = 100) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def debug() -> bool:
    return "--debug" in sys.argv or bool(os.environ.get("LMPRESS_DEBUG"))


def run_chat(config: RunConfig, system: str | None = None, markdown: bool = False) -> int:
    """Chat on stdin/stdout until Ctrl-D or /exit; returns the exit code."""
    interactive = sys.stdin.isatty()
    style = Style(sys.stderr)
    model = config.model.model_name
    if interactive:
        style.note(
            f"loading {model} on {config.engine}…" if model else f"starting {config.engine}…"
        )
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        engine = create_engine(config)
        check_params(engine, config.generation)
        chat = Chat(engine, config, loop, system=system, markdown=markdown, interactive=interactive)
        try:
            if interactive:
                save_history = setup_readline([f"/{c}" for c in [*COMMANDS, *ALIASES]])
                what = f"{model} on {engine.name}" if model else engine.name
                style.info(
                    f"Chatting with {what}. Type a message and press Enter; "
                    f"/help lists the commands; Ctrl-D or /exit leaves."
                )
                try:
                    chat.run(read_messages(interactive=True, on_interrupt=style.note))
                finally:
                    save_history()
                return 0  # errors in a session were shown as they came
            return chat.run(read_messages(interactive=False))
        finally:
            loop.run_until_complete(engine.aclose())
    finally:
        asyncio.set_event_loop(None)
        loop.close()
