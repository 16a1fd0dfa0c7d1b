"""The `lmpress` command: the typer app, each command registered from its own module, and
`main`, which turns user errors into one line on stderr.

One module per command (infer, batch, chat, serve, eval; listings for engines, recipes and config
show), each a thin function over the modules it fronts. Those import what a command needs
(omegaconf, asyncio, the batch runner, a backend) inside it, so `lmpress --help` loads only
typer.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import signal
import sys
import threading
import traceback
from collections.abc import Iterator
from typing import Annotated

import click
import typer

from lmpress.cli import batch, chat, eval, infer, listings, run, serve, view
from lmpress.cli.cache import cache_app
from lmpress.cli.options import OVERRIDES, OVERRIDES_HELP
from lmpress.version import __version__
from lmpress.vocabulary.errors import (
    DISK_ERRNOS,
    LmpressError,
    OutputWriteError,
    Terminated,
    exception_line,
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
app.add_typer(cache_app, name="cache")


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


with_overrides = app.command(context_settings=OVERRIDES, epilog=OVERRIDES_HELP)
app.command(
    context_settings=OVERRIDES, epilog=OVERRIDES_HELP, options_metavar="[OPTIONS] [PROMPT]"
)(infer.infer)
with_overrides(batch.batch)
app.command("run")(run.run)
with_overrides(chat.chat)
with_overrides(serve.serve)
app.command("eval", context_settings=OVERRIDES, epilog=OVERRIDES_HELP)(eval.evaluate)
app.command("view")(view.view)
app.command()(listings.engines)
app.command()(listings.recipes)
config_app.command("show", context_settings=OVERRIDES, epilog=OVERRIDES_HELP)(listings.config_show)


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
    # The one place --debug is read; commands that need it (the chat) get it from ctx.obj,
    # and processes lmpress starts (Ray's replicas) from LMPRESS_DEBUG.
    debug = "--debug" in args or bool(os.environ.get("LMPRESS_DEBUG"))
    if debug:
        os.environ["LMPRESS_DEBUG"] = "1"
    args = [a for a in args if a != "--debug"]
    _route_library_warnings(debug)
    try:
        with _signals():
            code = app(args=args, prog_name="lmpress", standalone_mode=False, obj={"debug": debug})
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
    except Terminated:
        print("lmpress: stopped by SIGTERM", file=sys.stderr)
        return 143
    except LmpressError as exc:
        if debug:
            traceback.print_exc()
        print(f"lmpress: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:
        if debug:
            traceback.print_exc()
        if exc.errno in DISK_ERRNOS:  # a write no command turned into its own error
            print(f"lmpress: error: {OutputWriteError(exc.filename, exc)}", file=sys.stderr)
        elif not debug:
            print(f"lmpress: internal error: {exception_line(exc)} (run with --debug for "
                  f"the traceback)", file=sys.stderr)  # fmt: skip
        return 1
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


def _route_library_warnings(debug: bool) -> None:
    """Python warnings (a library's FutureWarning about its own API, say) go to the log that
    --debug shows, never as raw lines into a reply, a chat or a batch's output."""
    logging.captureWarnings(True)
    logger = logging.getLogger("py.warnings")
    logger.propagate = False
    if debug:
        handler: logging.Handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("lmpress: debug: %(message)s"))
    else:
        handler = logging.NullHandler()
    logger.handlers[:] = [handler]


@contextlib.contextmanager
def _signals() -> Iterator[None]:
    """While a command runs: SIGTERM raises Terminated, so that cleanups run (a terminal's
    settings, an engine's close) and the command ends with one line and exit 143; commands
    with a stop of their own (batch, serve) take it over while they run. SIGXFSZ, sent for a
    write past `ulimit -f`, is ignored, so that the write fails as an OSError lmpress reports
    (as it does for a full disk) instead of killing the process."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminated(signum: int, frame: object) -> None:
        raise Terminated

    previous = {signal.SIGTERM: signal.signal(signal.SIGTERM, terminated)}
    if hasattr(signal, "SIGXFSZ"):
        previous[signal.SIGXFSZ] = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            if handler is not None:  # None: set outside Python, and not ours to put back
                signal.signal(sig, handler)


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
