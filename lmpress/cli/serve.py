"""`lmpress serve`: the OpenAI-compatible HTTP server (lmpress/serve/) over the recipe's engine."""

from __future__ import annotations

import os
from typing import Annotated

import typer

from lmpress.cli.options import (
    FLAG,
    STOP_GRACE_S,
    CacheDirOpt,
    EngineOpt,
    RecipeOpt,
    StopGraceOpt,
)
from lmpress.vocabulary.errors import ConfigError


def serve(
    ctx: typer.Context,
    recipe: RecipeOpt = None,
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
    state_dir: Annotated[
        str | None,
        typer.Option(
            "--state-dir",
            help="Keep /v1/files and /v1/batches here; a restart on it resumes unfinished "
            "batches. Without it the Files and Batch APIs are off.",
        ),
    ] = None,
    cache: Annotated[
        str | None,
        typer.Option(
            "--cache",
            help="The response cache (default off): on (greedy or seeded requests), all, "
            "refresh; replies kept are shared with lmpress batch and infer.",
            metavar="MODE",
        ),
    ] = None,
    cache_dir: CacheDirOpt = None,
    stop_grace: StopGraceOpt = STOP_GRACE_S,
    allowed_media_domains: Annotated[
        list[str] | None,
        typer.Option(
            "--allowed-media-domains",
            help="Fetch image URLs only from these hosts (exact names, comma-separated or "
            "repeated). Default: any host at a public address.",
            metavar="HOSTS",
        ),
    ] = None,
    allow_private_media: Annotated[
        bool,
        typer.Option(
            "--allow-private-media",
            help="Also fetch images from loopback, private and link-local addresses "
            "(a trusted network only).",
            metavar=FLAG,
        ),
    ] = False,
) -> None:
    """Serve the model over an OpenAI-compatible HTTP API; concurrent requests are batched.

    Routes: /v1/chat/completions, /v1/completions, /v1/models, /health; /v1/files and
    /v1/batches with --state-dir.

    Ctrl-C or SIGTERM stops it: no new requests, those in flight finish (--stop-grace).

    [bold]lmpress serve -c tiny-native --port 8000[/bold]
    """
    from lmpress.configs import load_config, parse_overrides

    overrides, words = parse_overrides(ctx.args)
    if words:
        raise ConfigError(f"unexpected argument '{words[0]}'")
    flags = [
        ("serve.host", host),
        ("serve.port", port),
        ("serve.log_content", log_content or None),
        ("serve.state_dir", state_dir),
        ("serve.cache", cache),
        ("serve.cache_dir", cache_dir),
        ("serve.allow_private_media", allow_private_media or None),
    ]
    if allowed_media_domains:
        hosts = [h.strip() for value in allowed_media_domains for h in value.split(",")]
        flags.append(("serve.allowed_media_domains", [h for h in hosts if h]))
    overrides += [(key, value) for key, value in flags if value is not None]
    from lmpress.engines.registry import check_engine, with_model_task

    config = load_config(recipe, overrides, engine=engine)
    check_engine(config)
    config = with_model_task(config)
    key = api_key or os.environ.get("LMPRESS_API_KEY") or None
    from lmpress.serve.server import run_server

    raise typer.Exit(run_server(config, key, stop_grace))
