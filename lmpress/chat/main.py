"""`run_chat`: the engine, the event loop and the terminal set up around one Chat, with the
slash commands handed to it."""

from __future__ import annotations

import asyncio
import sys

from lmpress.chat.commands import ALIASES, COMMANDS
from lmpress.chat.session import Chat
from lmpress.chat.terminal import Style, read_messages, setup_readline
from lmpress.configs.schema import RunConfig
from lmpress.engines.registry import create_engine
from lmpress.vocabulary.errors import ConfigError


def run_chat(
    config: RunConfig, system: str | None = None, markdown: bool = False, debug: bool = False
) -> int:
    """Chat on stdin/stdout until Ctrl-D or /exit; returns the exit code."""
    if config.task != "generate":
        raise ConfigError(
            f"task: the chat generates text; {config.task} runs through lmpress infer, batch "
            f"or serve (--task {config.task})"
        )
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
        engine = create_engine(config)  # refuses unsupported generation settings
        chat = Chat(engine, config, loop, COMMANDS, ALIASES, system=system, markdown=markdown,
                    interactive=interactive, debug=debug)  # fmt: skip
        try:
            if interactive:
                save_history = setup_readline([f"/{c}" for c in [*COMMANDS, *ALIASES]])
                what = f"{model} on {engine.name}" if model else engine.name
                style.info(
                    f"Chatting with {what}.\n"
                    f"Type a message and press Enter; /help lists commands; Ctrl-D or /exit leaves."
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
