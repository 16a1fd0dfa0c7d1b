"""The chat loop: each message becomes one Request carrying the whole conversation, its reply
streams to stdout (a reasoning model's thinking before it, dimmed, on stderr, unless /think
off), and Ctrl-C during a reply cancels only that reply. A line starting with / runs one of the
slash commands the chat was given (chat/commands.py), which act on the Chat. The history keeps
the answer as the assistant turn's content and the thinking in its `reasoning`."""

from __future__ import annotations

import asyncio
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TextIO

from lmpress.chat.conversation import Conversation
from lmpress.chat.terminal import (
    MarkdownReply,
    PlainReply,
    Style,
    ThinkingView,
    keys_not_echoed,
    reply_renderer,
    why_cut,
)
from lmpress.configs.schema import RunConfig
from lmpress.engines.base import Engine
from lmpress.vocabulary.errors import LmpressError, RequestError, Terminated, exception_line
from lmpress.vocabulary.types import Delta, GenerationParams, Message, Request, Result


@dataclass
class Command:
    """A slash command: what it does to the chat given the text after it, and its help."""

    run: Callable[[Chat, str], None]
    usage: str
    about: str


class LeaveChat(Exception):
    """/exit was typed."""


@dataclass
class Turn:
    """One reply as it streams: filled in place, so a Ctrl-C at any await keeps what came."""

    pieces: list[str] = field(default_factory=list)
    thinking: list[str] = field(default_factory=list)  # a reasoning model's, streamed first
    result: Result | None = None
    stopped: bool = False
    error: str | None = None
    started: float = field(default_factory=time.perf_counter)
    elapsed: float = 0.0

    @property
    def text(self) -> str:
        return self.result.text if self.result and not self.stopped else "".join(self.pieces)

    @property
    def reasoning(self) -> str | None:
        if self.result and not self.stopped:
            return self.result.reasoning
        return "".join(self.thinking) if self.thinking else None


class Chat:
    def __init__(
        self,
        engine: Engine,
        config: RunConfig,
        loop: asyncio.AbstractEventLoop,
        commands: Mapping[str, Command],
        aliases: Mapping[str, Command],
        *,
        system: str | None = None,
        markdown: bool = False,
        interactive: bool = True,
        debug: bool = False,
        out: TextIO | None = None,
        info: TextIO | None = None,
    ):
        self.engine = engine
        self.config = config
        self.params = config.generation
        self.loop = loop
        self.commands = commands
        self.aliases = aliases  # other names for some of them, left out of listings
        self.debug = debug  # tracebacks for engine bugs (--debug)
        self.conversation = Conversation(system=system)
        self.markdown = markdown
        self.interactive = interactive
        self.out = out or sys.stdout
        self.style = Style(info or sys.stderr)
        self.show_thinking = True  # /think on|off
        self.failures = 0
        self.turns = 0

    # --- the loop ------------------------------------------------------------------------

    def run(self, lines: Iterator[str]) -> int:
        """Handle each message or command; return the exit code (1 if anything failed)."""
        previous = None
        if self.interactive and signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
            # Started with Ctrl-C ignored (a shell's background job, a test runner's child),
            # Python raises no KeyboardInterrupt: Ctrl-C at the prompt would do nothing.
            previous = signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            for line in lines:
                try:
                    self.handle(line)
                except LeaveChat:
                    break
                except KeyboardInterrupt:  # between a reply's end and the next prompt
                    if not self.interactive:
                        raise
                    self.style.note("(Ctrl-C stops a reply; Ctrl-D or /exit leaves)")
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)
        return 1 if self.failures else 0

    def handle(self, line: str) -> None:
        if line.startswith("/") and not line.startswith("//") and "\n" not in line:
            name, _, arg = line[1:].strip().partition(" ")
            command = self.commands.get(name.lower()) or self.aliases.get(name.lower())
            if command is None:
                listed = " ".join(f"/{known}" for known in self.commands)
                self.fail(f"unknown command '/{name}'. Commands: {listed}")
                return
            try:
                command.run(self, arg.strip())
            except LmpressError as exc:
                self.fail(str(exc))
            return
        if self.interactive and line.lower() in ("exit", "quit"):
            raise LeaveChat  # what newcomers type to leave; " exit" sends the word itself
        text = line[1:] if line.startswith("//") else line
        if text.strip():
            self.send(self.conversation.user_message(text))

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
        reply = Message("assistant", turn.text, reasoning=turn.reasoning)
        if turn.result and not turn.stopped and turn.result.samples:
            # A provider's signed thinking blocks, which it wants back with a later tool call.
            reply.reasoning_details = turn.result.samples[0].reasoning_details
        conversation.messages += [message, reply]
        if turn.result and not turn.stopped:
            for i, sample in enumerate(turn.result.samples[1:], start=2):
                self.out.write(f"--- sample {i} ---\n{sample.text}\n")
            self.out.flush()
        self.style.status(status_line(turn, self.params))

    def _run_turn(self, request: Request) -> Turn:
        turn = Turn()
        task = self.loop.create_task(self._stream(request, turn))
        if not self.interactive:  # piped: Ctrl-C ends the whole run, once the reply is freed
            try:
                self.loop.run_until_complete(task)
            except (KeyboardInterrupt, Terminated):
                task.cancel()
                self.loop.run_until_complete(task)
                raise
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
        except Terminated:  # SIGTERM ends the chat: the reply is freed, the terminal restored
            task.cancel()
            self.loop.run_until_complete(task)
            raise
        finally:
            signal.signal(signal.SIGINT, previous)
        turn.elapsed = time.perf_counter() - turn.started
        return turn

    async def _stream(self, request: Request, turn: Turn) -> None:
        thinking = ThinkingView(self.style.stream, self.show_thinking)
        renderer = None

        def answer() -> PlainReply | MarkdownReply:
            # Made when the answer starts: a Markdown view takes the terminal over until done.
            nonlocal renderer
            if renderer is None:
                thinking.end()
                renderer = reply_renderer(self.out, self.markdown)
            return renderer

        stream = None
        try:
            stream = self.engine.stream(request)
            async for item in stream:
                if isinstance(item, Delta) and item.index == 0 and item.reasoning:
                    turn.thinking.append(item.text)
                    thinking.add(item.text)
                elif isinstance(item, Delta) and item.index == 0:
                    turn.pieces.append(item.text)
                    answer().add(item.text)
                elif isinstance(item, Result):
                    turn.result = item
                    if item.error:
                        turn.error = item.error.message
                    elif not turn.pieces and item.text:  # an engine that sends no deltas
                        if not turn.thinking:
                            thinking.add(item.reasoning or "")
                        answer().add(item.text)
                    break
        except asyncio.CancelledError:
            turn.stopped = True
        except (LmpressError, RequestError) as exc:
            turn.error = str(exc)
        except Exception as exc:  # an engine bug must not end the chat
            if self.debug:
                traceback.print_exc()
            turn.error = f"internal error: {exception_line(exc)} (--debug shows more)"
        finally:
            answer().finish(empty_line=not (turn.error or turn.stopped))
            close = getattr(stream, "aclose", None)  # closing the stream frees the request
            if close is not None:
                await close()
        if turn.result is None and not turn.stopped and not turn.error:
            turn.error = f"engine {self.engine.name} ended the reply without a result"


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
    if usage.reasoning_tokens:
        parts.append(f"thinking {usage.reasoning_tokens} of the {tokens}")
    cut = why_cut(turn.result, params)
    if cut:
        parts.append(cut.text + ("; /reset starts a new conversation" if cut.by_context else ""))
    return "[" + " · ".join(parts) + "]"
