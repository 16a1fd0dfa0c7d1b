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
from lmpress.configs.schema import RunConfig, ServedModel
from lmpress.vocabulary.errors import ConfigError, LmpressError


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
            help="Require this key as 'Authorization: Bearer KEY' on every route but /health. "
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
    models: Annotated[
        list[str] | None,
        typer.Option(
            "--model",
            help="Serve this model as NAME (RECIPE: a recipe name or path, as -c takes); "
            "repeat for several, each loaded on first use. -c then gives the serve settings.",
            metavar="NAME=RECIPE",
        ),
    ] = None,
    max_loaded_models: Annotated[
        int | None,
        typer.Option(
            "--max-loaded-models",
            help="With several models: keep at most this many local ones loaded, unloading "
            "the least recently used idle one (default: no limit).",
        ),
    ] = None,
    allow_runtime_lora: Annotated[
        bool,
        typer.Option(
            "--allow-runtime-lora",
            help="Turn on /v1/load_lora_adapter and /v1/unload_lora_adapter (they read "
            "paths a client names from this machine's disk).",
            metavar=FLAG,
        ),
    ] = False,
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

    Several models: --model NAME=RECIPE, repeated (or serve.models in a recipe); a request's
    model chooses, each loads on first use (--max-loaded-models bounds how many stay loaded).

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
        ("serve.max_loaded_models", max_loaded_models),
        ("serve.allow_runtime_lora", allow_runtime_lora or None),
    ]
    if allowed_media_domains:
        hosts = [h.strip() for value in allowed_media_domains for h in value.split(",")]
        flags.append(("serve.allowed_media_domains", [h for h in hosts if h]))
    overrides += [(key, value) for key, value in flags if value is not None]
    config = load_config(recipe, overrides, engine=engine)
    served = [*config.serve.models, *(_named_recipe(text) for text in models or [])]
    several = None
    if served:
        own = [(k, v) for k, v in overrides if not k.startswith("serve.")]
        several = served_models(served, own, engine)
        if config.serve.state_dir:
            raise ConfigError(
                "serve.state_dir: the Files and Batch APIs serve one model; drop --state-dir "
                "or serve one model"
            )
    else:
        config = _checked(config)
    key = api_key or os.environ.get("LMPRESS_API_KEY") or None
    from lmpress.serve.server import run_server

    raise typer.Exit(run_server(config, key, stop_grace, several))


def _named_recipe(text: str) -> ServedModel:
    name, sep, recipe = text.partition("=")
    if not sep or not name.strip() or not recipe.strip():
        raise ConfigError(f"--model {text}: give NAME=RECIPE (a recipe name or path, as -c takes)")
    return ServedModel(name.strip(), recipe.strip())


def served_models(
    served: list[ServedModel], overrides: list[tuple[str, str]], engine: str | None
) -> list[tuple[str, RunConfig]]:
    """Each model's name and config: its recipe, the command line's overrides, its own."""
    from lmpress.configs import load_config

    out: dict[str, RunConfig] = {}
    for model in served:
        where = f"serve.models: '{model.name}'"
        if not model.name or not model.recipe:
            raise ConfigError(f"serve.models: each entry needs a name and a recipe ({model})")
        if model.name in out:
            raise ConfigError(f"{where} is named twice; give each model its own name")
        try:
            mine = [*overrides, *dict(model.overrides).items()]
            out[model.name] = _checked(load_config(model.recipe, mine, engine=engine))
        except LmpressError as exc:  # the config's, or the engine's refusal of it
            raise ConfigError(f"{where}: {exc}") from exc
    return list(out.items())


def _checked(config: RunConfig) -> RunConfig:
    from lmpress.engines.registry import check_engine, with_model_task

    check_engine(config)
    return with_model_task(config)
