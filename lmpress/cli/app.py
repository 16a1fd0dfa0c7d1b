"""The `lmpress` command. Each command is a thin function over the modules it fronts.

Config overrides are any `--section.key value` (or `--section.key=value`) words; typer passes
them through untouched and `configs.parse_overrides` reads them. Nothing here imports a
backend: `lmpress --help` stays fast.
"""

from __future__ import annotations

import inspect
import os
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import click
import typer

from lmpress import __version__
from lmpress.errors import ConfigError, InputError, LmpressError, exception_line

if TYPE_CHECKING:
    from lmpress.configs.schema import RunConfig

# Modules a command needs (omegaconf, asyncio, the batch runner) are imported inside it, so
# that `lmpress --help` loads only typer.

OVERRIDES = {"allow_extra_args": True, "ignore_unknown_options": True}
OVERRIDES_HELP = (
    "Any config key can be set as --section.key VALUE, e.g. --generation.temperature 0.7 "
    "or --model.model_name=PATH."
)

app = typer.Typer(
    name="lmpress",
    help="Run language models over data: one prompt, a JSONL file, a chat or a server, on any engine.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
)
config_app = typer.Typer(help="Inspect configuration.", no_args_is_help=True)
app.add_typer(config_app, name="config")

# A flag takes no value; shown without a type so that `--overwrite true` is not suggested.
FLAG = ""

RecipeOpt = Annotated[
    str | None,
    typer.Option("-c", "--config", help="Recipe: a YAML path or a bundled recipe name."),
]
EngineOpt = Annotated[
    str | None, typer.Option("--engine", help="Engine name (sets the top-level 'engine' key).")
]


def _version(value: bool) -> None:
    if value:
        print(f"lmpress {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Show the version.", metavar=""
        ),
    ] = False,
) -> None:
    """Run language models over data: one prompt, a JSONL file, a chat or a server, on any engine.

    Add --debug to any command to see a traceback on errors.
    """


def _config(
    ctx: typer.Context, recipe: str | None, engine: str | None
) -> tuple[RunConfig, list[str]]:
    from lmpress.configs import load_config, parse_overrides

    overrides, positional = parse_overrides(ctx.args)
    return load_config(recipe, overrides, engine=engine), positional


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def _list_recipes(value: bool) -> None:
    if value:
        recipes()
        raise typer.Exit()


@app.command(
    context_settings=OVERRIDES, epilog=OVERRIDES_HELP, options_metavar="[OPTIONS] [PROMPT]"
)
def infer(
    ctx: typer.Context,
    config: RecipeOpt = None,
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
    """
    _logging(log_level)
    cfg, words = _config(ctx, config, engine)
    if verbose:
        from lmpress.configs.loading import config_to_yaml

        print(config_to_yaml(cfg), file=sys.stderr, end="")
    if interactive:
        _refuse_chat_extras(words, image, raw)
        from lmpress.chat import run_chat

        raise typer.Exit(run_chat(cfg, system=system))
    if input or (cfg.input_path and not words):
        raise typer.Exit(_batch(cfg, input, output))
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

    from lmpress.infer import run_prompt

    raise typer.Exit(asyncio.run(run_prompt(cfg, prompt, system, raw=raw, image=image)))


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


@app.command(context_settings=OVERRIDES, epilog=OVERRIDES_HELP)
def batch(
    ctx: typer.Context,
    input: Annotated[
        str | None,
        typer.Option("-i", "--input", help="Input JSONL file (.gz .zst .bz2 .xz read too)."),
    ] = None,
    output: Annotated[
        str | None, typer.Option("-o", "--output", help="Output JSONL file, or - for stdout.")
    ] = None,
    config: RecipeOpt = None,
    engine: EngineOpt = None,
    overwrite: Annotated[
        bool,
        typer.Option(
            "--overwrite", help="Start over instead of resuming the output.", metavar=FLAG
        ),
    ] = False,
    on_error: Annotated[
        str, typer.Option("--on-error", help="skip: set failed rows aside and go on; fail: stop.")
    ] = "skip",
    no_retry_failed: Annotated[
        bool,
        typer.Option(
            "--no-retry-failed", help="Leave rows that failed before aside.", metavar=FLAG
        ),
    ] = False,
    max_errors: Annotated[
        int | None, typer.Option("--max-errors", help="Stop once this many rows failed.")
    ] = None,
    ordered: Annotated[
        bool,
        typer.Option("--ordered", help="Write rows in input order (bounded buffer).", metavar=FLAG),
    ] = False,
    shard: Annotated[
        str | None, typer.Option("--shard", help="I/N: every N-th row starting at I.")
    ] = None,
    output_format: Annotated[
        str, typer.Option("--output-format", help="auto (follow the input), lmpress or openai.")
    ] = "auto",
) -> None:
    """Run every row of a JSONL file through the model, writing each result as it completes.

    Re-running the same command resumes: rows already written are skipped. Failed rows go to
    OUT.errors.jsonl and are retried on the next run. Exit code 0 when every row succeeded,
    1 when any failed, 2 for a usage or config error, 130 when interrupted.
    """
    cfg, words = _config(ctx, config, engine)
    if words:
        raise ConfigError(_unexpected(words[0], "batch reads rows from -i FILE"))
    from lmpress.batch import BatchOptions, parse_shard
    from lmpress.data.formats import OUTPUT_FORMATS

    if on_error not in ("skip", "fail"):
        raise ConfigError(f"--on-error {on_error}: use skip or fail")
    if output_format not in OUTPUT_FORMATS:
        raise ConfigError(f"--output-format {output_format}: use {', '.join(OUTPUT_FORMATS)}")
    if max_errors is not None and max_errors < 1:
        raise ConfigError("--max-errors: must be at least 1")

    options = BatchOptions(
        input_path="",
        output_path="",
        overwrite=overwrite,
        on_error=on_error,
        retry_failed=not no_retry_failed,
        max_errors=max_errors,
        ordered=ordered,
        shard=parse_shard(shard) if shard else None,
        output_format=output_format,
        recipe=config,
    )
    raise typer.Exit(_batch(cfg, input, output, options))


def _unexpected(word: str, hint: str) -> str:
    """A stray word; `true`/`false` after a flag gets the flag's own spelling as the hint."""
    if word.lower() in ("true", "false", "yes", "no", "1", "0"):
        hint = "a flag such as --overwrite takes no value: give it alone to turn it on"
    return f"unexpected argument '{word}' ({hint})"


def _batch(cfg: RunConfig, input: str | None, output: str | None, options=None) -> int:
    import asyncio

    from lmpress.batch import BatchOptions, run_batch
    from lmpress.cli.progress import Progress, print_summary
    from lmpress.data.resume import JobFiles
    from lmpress.data.targets import check_input, resolve_output
    from lmpress.engines.registry import load_engine_class

    input_path = input or cfg.input_path
    output_path = output or cfg.output_path
    if not input_path:
        raise ConfigError("no input: give -i FILE or set input_path")
    if not output_path:
        raise ConfigError("no output: give -o FILE (or - for stdout) or set output_path")
    # Every path checked before anything is opened for writing or any model loads.
    check_input(input_path)
    files = JobFiles.beside(output_path)
    target = resolve_output(
        output_path, input_path, [files.errors, files.summary, files.fingerprint]
    )
    if not target.stream:
        _check_writable(output_path)
    options = options or BatchOptions("", "")
    options.input_path, options.output_path = input_path, output_path
    load_engine_class(cfg.engine)  # an engine that cannot load is refused before any work
    summary = asyncio.run(run_batch(cfg, options, progress=Progress()))
    print_summary(summary)
    return summary.exit_code


def _check_writable(path: str) -> None:
    """Fail before any work if the output cannot be created (access() lies to root)."""
    target = Path(path).expanduser()
    existed = target.exists()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with target.open("a"):
            pass
    except OSError as exc:
        raise InputError(f"{path}: cannot write output ({exc.strerror})") from exc
    if not existed:
        target.unlink()


@app.command(context_settings=OVERRIDES, epilog=OVERRIDES_HELP)
def chat(
    ctx: typer.Context,
    config: RecipeOpt = None,
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
    cfg, words = _config(ctx, config, engine)
    if words:
        raise ConfigError(
            f"unexpected argument '{words[0]}' (type messages at the chat prompt, or pipe them in)"
        )
    from lmpress.chat import run_chat

    raise typer.Exit(run_chat(cfg, system=system, markdown=markdown))


@app.command(context_settings=OVERRIDES, epilog=OVERRIDES_HELP)
def serve(
    ctx: typer.Context,
    config: RecipeOpt = None,
    engine: EngineOpt = None,
    host: Annotated[
        str | None,
        typer.Option("--host", help="Address to listen on (default 127.0.0.1: this machine only)."),
    ] = None,
    port: Annotated[
        int | None, typer.Option("--port", help="Port (default 8000; 0 picks a free one).")
    ] = None,
    api_key: Annotated[
        str | None,
        typer.Option(
            "--api-key",
            help="Require this key as 'Authorization: Bearer KEY' on /v1 routes. "
            "Default: $LMPRESS_API_KEY (safer: a flag shows in the process list).",
            show_default=False,
        ),
    ] = None,
    log_content: Annotated[
        bool,
        typer.Option("--log-content", help="Log each request's messages and reply.", metavar=FLAG),
    ] = False,
) -> None:
    """Serve the model over an OpenAI-compatible HTTP API; concurrent requests are batched.

    Routes: /v1/chat/completions, /v1/completions, /v1/models, /health.

    [bold]lmpress serve -c tiny-native --port 8000[/bold]
    """
    from lmpress.configs import load_config, parse_overrides

    overrides, words = parse_overrides(ctx.args)
    if words:
        raise ConfigError(f"unexpected argument '{words[0]}'")
    flags = [("serve.host", host), ("serve.port", port), ("serve.log_content", log_content or None)]
    overrides += [(key, value) for key, value in flags if value is not None]
    cfg = load_config(config, overrides, engine=engine)
    key = api_key or os.environ.get("LMPRESS_API_KEY") or None
    from lmpress.serve.server import run_server

    raise typer.Exit(run_server(cfg, key))


@app.command()
def engines() -> None:
    """List every engine, whether it can run here, and the generation parameters it supports."""
    import textwrap

    from lmpress.engines.registry import engine_names, engine_status

    for name in engine_names():
        status = engine_status(name)
        usable = "usable" if status.usable else f"not usable: {status.why}"
        if status.usable and status.why:
            usable += f", but {status.why}"
        print(f"{status.name:14} {status.summary}\n{'':14} {usable}")
        if status.supported_params:
            params = "parameters: " + ", ".join(sorted(status.supported_params))
            print(textwrap.fill(params, 92, initial_indent=" " * 15, subsequent_indent=" " * 27))
        print()


@app.command()
def recipes() -> None:
    """List the bundled recipes (use one with -c NAME)."""
    import shutil
    import textwrap

    from lmpress.configs.loading import bundled_recipes

    width = max(shutil.get_terminal_size((100, 20)).columns, 60)
    for name, path in bundled_recipes().items():
        about = " ".join(_leading_comment(path.read_text(encoding="utf-8")))
        print(textwrap.fill(f"{name:28} {about}", width, subsequent_indent=" " * 29))


def _leading_comment(text: str) -> list[str]:
    """The recipe's opening comment block, whole: its first line alone is often half a
    sentence."""
    lines = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("# ").strip())
    return lines


@config_app.command("show", context_settings=OVERRIDES, epilog=OVERRIDES_HELP)
def config_show(ctx: typer.Context, config: RecipeOpt = None, engine: EngineOpt = None) -> None:
    """Print the merged config (recipe + overrides) as YAML, secrets redacted."""
    from lmpress.configs.loading import config_to_yaml

    cfg, words = _config(ctx, config, engine)
    if words:
        raise ConfigError(f"unexpected argument '{words[0]}'")
    print(config_to_yaml(cfg), end="")


def _unwrap(doc: str) -> str:
    """A docstring as help text: each paragraph one line, so the help wraps to the terminal
    instead of keeping the source's line breaks (ragged at 80 columns)."""
    paragraphs = inspect.cleandoc(doc).split("\n\n")
    return "\n\n".join(" ".join(p.split("\n")) for p in paragraphs)


for _info in (*app.registered_commands, *config_app.registered_commands):
    if _info.callback is not None and _info.callback.__doc__:
        _info.help = _unwrap(_info.callback.__doc__)


def main(argv: list[str] | None = None) -> int:
    """The console script: run the app, turning user errors into one line on stderr."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args or bool(os.environ.get("LMPRESS_DEBUG"))
    args = [a for a in args if a != "--debug"]
    try:
        code = app(args=args, prog_name="lmpress", standalone_mode=False)
        return code if isinstance(code, int) else 0
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except (click.ClickException, typer.TyperException) as exc:
        return _usage_error(exc)
    except BrokenPipeError:  # `lmpress batch -o - | head`: the reader has all it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except (click.exceptions.Abort, KeyboardInterrupt):
        print("lmpress: interrupted", file=sys.stderr)
        return 130
    except LmpressError as exc:
        if debug:
            traceback.print_exc()
        print(f"lmpress: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except Exception as exc:
        if debug:
            traceback.print_exc()
        else:
            print(
                f"lmpress: internal error: {exception_line(exc)} (run with --debug for "
                f"the traceback)",
                file=sys.stderr,
            )
        return 1


def _usage_error(exc: Exception) -> int:
    """Something the user typed (no command, a typo'd one, a bad option): click's own message,
    exit 2 as the README promises. Typer bundles its own copy of click, so both are caught."""
    show = getattr(exc, "show", None)
    if callable(show):
        show()
    else:
        print(f"lmpress: error: {exc}", file=sys.stderr)
    code = getattr(exc, "exit_code", 2)
    return code if isinstance(code, int) and code != 1 else 2


if __name__ == "__main__":
    sys.exit(main())
