"""`lmpress chat`: the terminal chat (lmpress/chat/) over the recipe's engine."""

from __future__ import annotations

from typing import Annotated

import typer

from lmpress.cli.options import FLAG, EngineOpt, RecipeOpt, debug_wanted, load_run_config
from lmpress.vocabulary.errors import ConfigError


def chat(
    ctx: typer.Context,
    recipe: RecipeOpt = None,
    engine: EngineOpt = None,
    system: Annotated[str | None, typer.Option("--system", help="A system prompt.")] = None,
    markdown: Annotated[
        bool, typer.Option("--markdown", help="Render replies as Markdown.", metavar=FLAG)
    ] = False,
) -> None:
    """Chat with a model in the terminal: multi-turn, streamed, with slash commands (/help).

    [bold]lmpress chat -c tiny-native[/bold]

    In the chat: /help /reset /system /set /retry /undo /save /load /exit; Ctrl-C stops a
    reply, Ctrl-D leaves.

    Piped, each line of stdin is a message and each reply is printed:
    [bold]lmpress chat -c tiny-native < questions.txt[/bold]
    """
    config, words = load_run_config(ctx, recipe, engine)
    if words:
        raise ConfigError(
            f"unexpected argument '{words[0]}' (type messages at the chat prompt, or pipe them in)"
        )
    from lmpress.chat.main import run_chat

    raise typer.Exit(run_chat(config, system=system, markdown=markdown, debug=debug_wanted(ctx)))
