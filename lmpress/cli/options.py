"""What every command shares: the recipe and engine options, the pass-through of dotted
config overrides, and loading the RunConfig they make."""

from __future__ import annotations

import typing
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from lmpress.configs.schema import RunConfig

# Config overrides are any `--section.key value` (or `--section.key=value`) words; typer passes
# them through untouched and `configs.parse_overrides` reads them.
OVERRIDES = {"allow_extra_args": True, "ignore_unknown_options": True}
OVERRIDES_HELP = (
    "Any config key can be set as --section.key VALUE, e.g. --generation.temperature 0.7 "
    "or --model.model_name=PATH."
)

# A flag takes no value; shown without a type so that `--overwrite true` is not suggested.
FLAG = ""

RecipeOpt = Annotated[
    str | None,
    typer.Option("-c", "--config", help="Recipe: a YAML path or a bundled recipe name."),
]
EngineOpt = Annotated[
    str | None, typer.Option("--engine", help="Engine name (sets the top-level 'engine' key).")
]

CacheOpt = Annotated[
    str,
    typer.Option(
        "--cache",
        help="The response cache: on (reproducible requests: greedy or seeded), all (sampled "
        "too), refresh (generate again and replace), off.",
        metavar="MODE",
    ),
]
CacheDirOpt = Annotated[
    str | None,
    typer.Option(
        "--cache-dir",
        help="The response cache's directory (default: $LMPRESS_RESPONSE_CACHE, else "
        "~/.cache/lmpress/responses).",
    ),
]


def check_cache_mode(mode: str) -> str:
    from lmpress.cache.responses import CACHE_MODES
    from lmpress.vocabulary.errors import ConfigError

    if mode not in CACHE_MODES:
        raise ConfigError(f"--cache {mode}: use {', '.join(CACHE_MODES)}")
    return mode


StopGraceOpt = Annotated[
    float,
    typer.Option(
        "--stop-grace",
        help="Seconds that work in flight may take to finish after Ctrl-C or SIGTERM; a "
        "second signal stops at once.",
        metavar="SECONDS",
        min=0,
    ),
]
STOP_GRACE_S = 10.0  # long enough for a remote row or a reply to end; Slurm and Kubernetes
# wait 30 s between SIGTERM and SIGKILL, which leaves time for the output to be written


ReportOpt = Annotated[
    bool,
    typer.Option(
        "--report",
        help="When the run ends, write its overview and plots as one self-contained HTML "
        "file: OUT.report.html (report.html in an output folder).",
        metavar=FLAG,
    ),
]


def check_report(output: str | None) -> None:
    """--report is refused before any work where it could not be written."""
    import importlib.util

    from lmpress.vocabulary.errors import ConfigError, EngineUnavailableError

    if output == "-":
        raise ConfigError("--report: the output goes to stdout; give -o FILE for a report")
    if importlib.util.find_spec("numpy") is None:
        raise EngineUnavailableError("--report needs numpy: pip install 'lmpress[view]'")


def write_report(output: str) -> None:
    """The report of a finished run (lmpress/view/report.py), and one line saying where."""
    import sys

    from lmpress.view.report import write_report

    print(f"lmpress: report: {write_report(output)}", file=sys.stderr)


def load_run_config(
    ctx: typer.Context, recipe: str | None, engine: str | None
) -> tuple[RunConfig, list[str]]:
    """The recipe with the command line's overrides merged in, its engine and engine settings
    checked, and the words left over."""
    from lmpress.configs import load_config, parse_overrides
    from lmpress.engines.registry import check_engine

    overrides, positional = parse_overrides(ctx.args)
    config = load_config(recipe, overrides, engine=engine)
    check_engine(config)
    return config, positional


def debug_wanted(ctx: typer.Context) -> bool:
    """Whether `--debug` (or LMPRESS_DEBUG) was given; `main` reads it once for every command."""
    root = ctx.find_root()
    return bool(isinstance(root.obj, dict) and root.obj.get("debug"))


def declared_flags(command: Callable[..., Any]) -> set[str]:
    """Every option name a command declares (`--overwrite`, `-o`), read from its signature."""
    names: set[str] = set()
    for hint in typing.get_type_hints(command, include_extras=True).values():
        for info in getattr(hint, "__metadata__", ()):
            if not isinstance(info, typer.models.OptionInfo):
                continue
            # typer takes an Annotated option's first name where its default would be
            first = (info.default,) if isinstance(info.default, str) else ()
            names.update(d for d in (*first, *(info.param_decls or ())) if d.startswith("-"))
    return names


def unexpected(word: str, hint: str) -> str:
    """A stray word; `true`/`false` after a flag gets the flag's own spelling as the hint."""
    if word.lower() in ("true", "false", "yes", "no", "1", "0"):
        hint = "a flag such as --overwrite takes no value: give it alone to turn it on"
    return f"unexpected argument '{word}' ({hint})"
