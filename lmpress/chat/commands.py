"""The slash commands of `lmpress chat`: each a function of the chat and the text after it."""

from __future__ import annotations

import dataclasses
import difflib
import shlex
from pathlib import Path

from lmpress.chat.conversation import Conversation, append_row, read_row
from lmpress.chat.session import Chat, Command, LeaveChat
from lmpress.configs.loading import parse_scalar, validate
from lmpress.configs.overrides import generation_with_overrides
from lmpress.configs.schema import RunConfig
from lmpress.engines.base import Engine, check_params
from lmpress.vocabulary.errors import ConfigError, InputError
from lmpress.vocabulary.images import image_part
from lmpress.vocabulary.types import GENERATION_FIELDS, SCHEDULING_FIELDS, GenerationParams


def help_command(chat: Chat, arg: str) -> None:
    chat.style.info(help_text())


def reset_command(chat: Chat, arg: str) -> None:
    chat.conversation.messages.clear()
    chat.conversation.unsent = None
    chat.conversation.attached.clear()
    chat.style.note("conversation forgotten; the system prompt and settings are kept")


def system_command(chat: Chat, arg: str) -> None:
    conversation = chat.conversation
    if not arg:
        if conversation.system:
            chat.style.note(f"system prompt: {conversation.system}")
        else:
            chat.style.note("no system prompt; set one with /system TEXT")
    elif arg.lower() in ("clear", "none", "off"):
        conversation.system = None
        chat.style.note("system prompt removed")
    else:
        conversation.system = arg
        chat.style.note("system prompt set; it applies from the next reply")


def set_command(chat: Chat, arg: str) -> None:
    if not arg:
        chat.style.note(settings_text(chat.params))
        return
    key, value = split_setting(arg)
    if value:
        chat.params = checked_params(chat.engine, chat.config, chat.params, key, value)
    chat.style.note(f"{key} = {getattr(chat.params, key.split('.')[1])!r}")


def retry_command(chat: Chat, arg: str) -> None:
    conversation = chat.conversation
    message = conversation.unsent or conversation.drop_last_exchange()
    if message is None:
        raise InputError("nothing to retry yet: send a message first")
    chat.style.note("(regenerating)")
    chat.send(message)


def undo_command(chat: Chat, arg: str) -> None:
    conversation = chat.conversation
    if conversation.unsent is not None:
        conversation.unsent = None
        chat.style.note("dropped your unanswered message")
    elif conversation.drop_last_exchange() is not None:
        left = conversation.exchanges
        chat.style.note(f"dropped the last exchange; {left} left")
    else:
        raise InputError("nothing to undo: the conversation is empty")


def save_command(chat: Chat, arg: str) -> None:
    if not arg:
        raise InputError("usage: /save FILE (the conversation is appended as one JSONL row)")
    conversation = chat.conversation
    if not conversation.messages:
        raise InputError("nothing to save yet: no message has had a reply")
    line = append_row(conversation, arg)
    unsent = " (not your unanswered message)" if conversation.unsent else ""
    chat.style.note(
        f"saved {conversation.exchanges} exchange(s){unsent} to {arg} (line {line}); "
        f"continue it with /load {arg}, replay it with lmpress batch -i {shlex.quote(arg)} "
        f"-o OUT.jsonl"
    )


def load_command(chat: Chat, arg: str) -> None:
    if not arg:
        raise InputError("usage: /load FILE [LINE] (the file's last row unless LINE is given)")
    path, wanted = arg, None
    if not Path(arg).expanduser().exists() and arg.rsplit(" ", 1)[-1].isdigit():
        path, number = arg.rsplit(" ", 1)
        wanted = int(number)
    row = read_row(path, wanted)
    conversation = chat.conversation = Conversation.from_messages(row.messages)
    note = f"loaded {conversation.exchanges} exchange(s) from {path} line {row.line}"
    if conversation.system:
        note += " with its system prompt"
    if conversation.unsent:
        note += "; its last message has no reply yet: /retry generates one"
    if row.overrides:
        note += "; its row's generation settings are not applied (use /set)"
    chat.style.note(note)
    last = conversation.messages[-1] if conversation.messages else conversation.unsent
    if last is not None:
        chat.style.note(f"last {last.role} message: {one_line(last.text())}")


def image_command(chat: Chat, arg: str) -> None:
    attached = chat.conversation.attached
    if not arg:
        if not attached:
            chat.style.note("no image attached; /image PATH attaches one to your next message")
        for part in attached:
            chat.style.note(f"attached: {part.image_url}")
    elif arg.lower() in ("clear", "none", "off"):
        attached.clear()
        chat.style.note("attached images dropped")
    else:
        attached.append(image_part(arg, "/image"))
        chat.style.note(f"{len(attached)} image(s) attached; they go with your next message")


def think_command(chat: Chat, arg: str) -> None:
    if arg.lower() in ("on", "off"):
        chat.show_thinking = arg.lower() == "on"
    elif arg:
        raise InputError(f"usage: /think on|off (not '{arg}')")
    shown = "shown" if chat.show_thinking else "hidden"
    chat.style.note(f"a reasoning model's thinking is {shown}; the history keeps it either way")


def exit_command(chat: Chat, arg: str) -> None:
    raise LeaveChat


COMMANDS: dict[str, Command] = {
    "help": Command(help_command, "/help", "show this help"),
    "reset": Command(reset_command, "/reset", "forget the conversation (system prompt, settings stay)"),
    "system": Command(system_command, "/system [TEXT]", "show or set the system prompt; '/system clear' drops it"),
    "set": Command(set_command, "/set [KEY=VALUE]", "list the generation settings, or change one:"),
    "retry": Command(retry_command, "/retry", "generate the last reply again"),
    "undo": Command(undo_command, "/undo", "drop the last exchange (your message and its reply)"),
    "image": Command(image_command, "/image [PATH]", "attach an image file (or http/data URL) to your next message"),
    "save": Command(save_command, "/save FILE", "append the conversation to FILE as a batch input row"),
    "load": Command(load_command, "/load FILE [LINE]", "continue a saved conversation (the last row, or LINE)"),
    "think": Command(think_command, "/think [on|off]", "show or hide a reasoning model's thinking (shown, dimmed, by default)"),
    "exit": Command(exit_command, "/exit", "leave (Ctrl-D too)"),
}  # fmt: skip
ALIASES = {"quit": COMMANDS["exit"], "?": COMMANDS["help"]}


def help_text() -> str:
    width = max(len(c.usage) for c in COMMANDS.values())
    lines = ["Type a message and press Enter to send it. Commands:"]
    for name, command in COMMANDS.items():
        lines.append(f"  {command.usage:<{width}}  {command.about}")
        if name == "set":
            lines.append(f"  {'':<{width}}    /set generation.temperature=0.2")
    lines += [
        'Several lines: end a line with \\ to go on, or put them between """ and """.',
        "Ctrl-C stops a reply (what came so far is kept); Up/Down recall typed lines.",
        "To send a message that starts with /, type // for its first /.",
    ]
    return "\n".join(lines)


def settings_text(params: GenerationParams) -> str:
    """Every generation setting, so that /set lists what /set can change."""
    import textwrap

    shown = [name for name in GENERATION_FIELDS if name != "batch_size"]
    values = ", ".join(f"{name}={getattr(params, name)!r}" for name in shown)
    text = textwrap.fill(f"generation: {values}", 100, subsequent_indent="  ")
    return f"{text}\nchange one with /set generation.KEY=VALUE"


def split_setting(arg: str) -> tuple[str, str]:
    """`generation.temperature=0.2`, `generation.temperature 0.2` or `temperature=0.2` as
    (`generation.temperature`, `0.2`); the value is empty when only a key is given."""
    key, eq, value = arg.partition("=")
    if not eq:
        key, _, value = arg.partition(" ")
    key, value = key.strip(), value.strip()
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
    updated = generation_with_overrides(params, {name: parse_scalar(value)}, source="generation")
    validate(dataclasses.replace(config, generation=updated))
    check_params(engine, updated)
    return updated


def one_line(text: str, limit: int = 100) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"
