"""`lmpress view`: the local web page over an output (lmpress/view/), bound to this machine
by default; FastAPI, uvicorn and numpy are imported once the command runs."""

from __future__ import annotations

import os
from typing import Annotated

import typer

from lmpress.cli.options import FLAG
from lmpress.vocabulary.errors import ConfigError, EngineUnavailableError


def view(
    path: Annotated[
        str,
        typer.Argument(
            help="A batch output (JSONL, compressed or not, Parquet, OpenAI Batch lines), its "
            ".errors.jsonl, a --models output, a pipeline's output folder or its Hugging Face "
            "dataset folder, or an eval's results folder.",
            metavar="PATH",
            show_default=False,
        ),
    ],
    other: Annotated[
        str | None,
        typer.Argument(help="A second output to compare with, by row id.", metavar="PATH2"),
    ] = None,
    host: Annotated[
        str,
        typer.Option(
            "--host",
            help="Address to listen on (default 127.0.0.1: this machine only).",
            show_default=False,
        ),
    ] = "127.0.0.1",
    port: Annotated[
        int, typer.Option("--port", help="Port (default 0: a free one).", show_default=False)
    ] = 0,
    api_key: Annotated[
        str | None,
        typer.Option(
            "--api-key",
            help="Require this key on every request (needed with a --host beyond this "
            "machine); open the page as /?key=KEY. Default: $LMPRESS_API_KEY.",
            show_default=False,
        ),
    ] = None,
    no_browser: Annotated[
        bool,
        typer.Option(
            "--no-browser",
            help="Accepted for scripts; the viewer never opens a browser itself.",
            metavar=FLAG,
            hidden=True,
        ),
    ] = False,
) -> None:
    """Look at an output in a web page: rows, failures, plots, search, and two outputs compared.

    Prints the page's address (http://127.0.0.1:PORT/) and serves it until Ctrl-C. A job still
    writing the output is followed as it goes; the viewer never writes into the output or its
    side files (its index is kept as PATH.view-index).

    [bold]lmpress view results.jsonl[/bold]
    """
    key = api_key or os.environ.get("LMPRESS_API_KEY") or None
    try:
        from lmpress.view.app import Viewer, is_loopback, listen, serve
    except ModuleNotFoundError as exc:
        if exc.name not in ("fastapi", "uvicorn", "numpy", "starlette"):
            raise
        raise EngineUnavailableError(
            f"lmpress view needs {exc.name}: pip install 'lmpress[view]'"
        ) from None
    if not is_loopback(host) and not key:
        raise ConfigError(
            f"view: --host {host}: a viewer open beyond this machine needs --api-key KEY "
            f"(or $LMPRESS_API_KEY)"
        )
    viewer = Viewer([p for p in (path, other) if p is not None])
    raise typer.Exit(serve(viewer, listen(host, port), key))
