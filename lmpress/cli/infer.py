"""`lmpress infer`: one prompt from the shell, with `oumi infer`'s flags (-i opens the chat,
--input_path runs a file as `lmpress batch` does)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from lmpress.cli.listings import recipes
from lmpress.cli.options import (
    FLAG,
    CacheDirOpt,
    CacheOpt,
    EngineOpt,
    RecipeOpt,
    check_cache_mode,
    debug_wanted,
    declared_flags,
    load_run_config,
)
from lmpress.vocabulary.embeddings import LIKELIHOOD_TASKS
from lmpress.vocabulary.errors import ConfigError

if TYPE_CHECKING:
    from lmpress.batch import BatchOptions
    from lmpress.configs.schema import RunConfig

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def _list_recipes(value: bool) -> None:
    if value:
        recipes()
        raise typer.Exit()


def infer(
    ctx: typer.Context,
    recipe: RecipeOpt = None,
    engine: EngineOpt = None,
    interactive: Annotated[
        bool,
        typer.Option("-i", "--interactive", help="Open the chat, as `lmpress chat`.", metavar=FLAG),
    ] = False,
    system: Annotated[
        str | None, typer.Option("--system-prompt", "--system", help="A system prompt.")
    ] = None,
    image: Annotated[
        str | None,
        typer.Option("--image", help="An image file (or http/data URL) to send with the prompt."),
    ] = None,
    raw: Annotated[
        bool,
        typer.Option(
            "--raw", help="Send the prompt as raw text to continue, without the chat template."
        ),
    ] = False,
    input: Annotated[
        str | None,
        typer.Option("--input_path", "--input", help="Run a JSONL file instead (the batch path)."),
    ] = None,
    output: Annotated[
        str | None,
        typer.Option("--output_path", "--output", "-o", help="Output JSONL (with --input_path)."),
    ] = None,
    documents: Annotated[
        list[str] | None,
        typer.Option(
            "--document", help="With --task score or rerank: a document to score (repeat it)."
        ),
    ] = None,
    json_out: Annotated[
        bool,
        typer.Option(
            "--json",
            help="With --task embed, score, rerank, classify or reward: print the result as JSON.",
            metavar=FLAG,
        ),
    ] = False,
    cache: CacheOpt = "on",
    cache_dir: CacheDirOpt = None,
    log_level: Annotated[
        str | None,
        typer.Option("-log", "--log-level", help=f"Logging level: {', '.join(LOG_LEVELS)}."),
    ] = None,
    verbose: Annotated[
        bool,
        typer.Option("-v", "--verbose", help="Print the merged config first.", metavar=FLAG),
    ] = False,
    list_recipes: Annotated[
        bool,
        typer.Option(
            "--list",
            callback=_list_recipes,
            is_eager=True,
            help="List the bundled recipes.",
            metavar=FLAG,
        ),
    ] = False,
) -> None:
    """Answer one prompt (an argument, or stdin), printing the reply as it streams.

    [bold]lmpress infer --engine NATIVE --model.model_name HuggingFaceTB/SmolLM2-135M-Instruct "Why is the sky blue?"[/bold]

    Takes `oumi infer`'s flags: -i opens the chat, --input_path/--output_path run a file.
    With --task embed it prints the text's vector (its size and first values; --json: all of
    it), with --task score or rerank each --document's score against the text, with --task
    classify its labels' probabilities, with --task reward its reward.
    """
    _logging(log_level)
    _refuse_batch_flags(ctx.args)
    check_cache_mode(cache)
    config, words = load_run_config(ctx, recipe, engine)
    if verbose:
        from lmpress.configs.loading import config_to_yaml

        print(config_to_yaml(config), file=sys.stderr, end="")
    if interactive:
        _refuse_chat_extras(words, image, raw)
        from lmpress.chat.main import run_chat

        raise typer.Exit(run_chat(config, system=system, debug=debug_wanted(ctx)))
    if input or (config.input_path and not words):
        from lmpress.batch import BatchOptions
        from lmpress.data.columns import RowMapping

        mapping = RowMapping(system=system)
        options = BatchOptions("", "", mapping=mapping, cache=cache, cache_dir=cache_dir)
        raise typer.Exit(_run_file(config, input, output, words, options, image, raw))
    if output:
        raise ConfigError("--output_path is where a file's rows go: give --input_path FILE too")
    if raw and (system or image):
        raise ConfigError("--system and --image need the chat template; --raw sends text as is")
    prompt = " ".join(words)
    if not prompt:
        if sys.stdin.isatty():
            raise ConfigError("no prompt: give it as an argument or on stdin")
        prompt = sys.stdin.read().strip()
        if not prompt:
            raise ConfigError("no prompt: stdin was empty; give the prompt as an argument")
    import asyncio

    if config.task in LIKELIHOOD_TASKS:
        raise ConfigError(
            f"--task {config.task} scores rows of text: run it with lmpress batch, or from "
            f"Python with LLM.loglikelihood or LLM.perplexity"
        )
    if config.task != "generate":
        raise typer.Exit(_run_pooled(config, prompt, documents or [], json_out, system, image))
    if documents or json_out:
        flag = "--document" if documents else "--json"
        raise ConfigError(
            f"{flag} is for --task embed, score, rerank, classify or reward (task is generate)"
        )
    from lmpress.infer import run_prompt

    reply = run_prompt(
        config, prompt, system, raw=raw, image=image, cache=cache, cache_dir=cache_dir
    )
    raise typer.Exit(asyncio.run(reply))


def _run_pooled(
    config: RunConfig,
    text: str,
    documents: list[str],
    as_json: bool,
    system: str | None,
    image: str | None,
) -> int:
    import asyncio

    from lmpress.infer import run_pooled

    if system or image:
        flag = "--system" if system else "--image"
        raise ConfigError(f"{flag} is for generating; a {config.task} run takes the text alone")
    scores = config.task in ("score", "rerank")
    if not scores and documents:
        raise ConfigError(
            f"--document is for --task score or rerank; {config.task} takes the text alone"
        )
    if scores and not documents:
        raise ConfigError(f"--task {config.task}: give the documents to score, --document TEXT")
    return asyncio.run(run_pooled(config, text, documents, as_json))


def _run_file(
    config: RunConfig,
    input: str | None,
    output: str | None,
    words: list[str],
    options: BatchOptions,
    image: str | None,
    raw: bool,
) -> int:
    """--input_path: the file run as `lmpress batch` runs it, with the flags both take (--system:
    a system turn for every row without one); one that means nothing there is refused."""
    from lmpress.cli.batch import run_file

    if words:
        hint = "--input_path runs the file's rows; give a prompt without it"
        raise ConfigError(f"unexpected argument '{words[0]}' ({hint})")
    if image or raw:
        raise ConfigError(f"{'--image' if image else '--raw'} is for one prompt, not --input_path")
    return run_file(config, input, output, options)


def _refuse_batch_flags(args: list[str]) -> None:
    """A flag of `lmpress batch` that infer lacks says where it belongs, rather than being
    taken for an unknown config key."""
    from lmpress.cli.batch import batch

    batch_only = declared_flags(batch) - declared_flags(infer)
    for word in args:
        if word == "--":
            return
        flag = word.partition("=")[0]
        if flag in batch_only:
            raise ConfigError(
                f"{flag} is a flag of lmpress batch, not of infer: run the file with "
                f"lmpress batch -i FILE -o OUT {flag} ..."
            )


def _logging(level: str | None) -> None:
    if level is None:
        return
    if level.upper() not in LOG_LEVELS:
        raise ConfigError(f"--log-level: '{level}' is not one of {', '.join(LOG_LEVELS)}")
    import logging

    logging.basicConfig(level=level.upper(), format="%(levelname)s %(name)s: %(message)s")


def _refuse_chat_extras(words: list[str], image: str | None, raw: bool) -> None:
    if words:
        hint = "type messages at the chat prompt, or pipe them in"
        if words[0].endswith((".jsonl", ".json")) or Path(words[0]).is_file():
            hint = (
                "-i opens the chat, as in `oumi infer`; run a file with --input_path FILE "
                "--output_path OUT, or lmpress batch -i FILE -o OUT"
            )
        raise ConfigError(f"unexpected argument '{words[0]}' ({hint})")
    if image or raw:
        raise ConfigError(f"{'--image' if image else '--raw'} is for one prompt, not the chat")
