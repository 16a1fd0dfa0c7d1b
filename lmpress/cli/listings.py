"""`lmpress engines`, `lmpress recipes` and `lmpress config show`: what is here to use."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from lmpress.cli.options import EngineOpt, RecipeOpt, load_run_config
from lmpress.vocabulary.errors import ConfigError

if TYPE_CHECKING:
    from lmpress.engines.registry import EngineStatus


def engines(
    name: Annotated[
        str | None,
        typer.Argument(metavar="NAME", help="An engine: list its model.model_kwargs settings too."),
    ] = None,
) -> None:
    """List every engine, whether it can run here, the tasks it answers and the generation
    parameters it supports; with NAME, that engine alone and its model.model_kwargs settings."""
    from lmpress.engines.registry import engine_names, engine_status, get_spec

    for one in [get_spec(name).name] if name else engine_names():
        _print_status(engine_status(one))
        if name:
            _print_settings(one)


def _print_status(status: EngineStatus) -> None:
    import textwrap

    from lmpress.vocabulary.embeddings import TASKS

    usable = "usable" if status.usable else f"not usable: {status.why}"
    if status.usable and status.why:
        usable += f", but {status.why}"
    print(f"{status.name:14} {status.summary}\n{'':14} {usable}")
    print(f"{'':14} tasks: {', '.join(t for t in TASKS if t in status.tasks)}")
    if status.supported_params:
        params = "parameters: " + ", ".join(sorted(status.supported_params))
        print(textwrap.fill(params, 92, initial_indent=" " * 15, subsequent_indent=" " * 27))
    print()


def _print_settings(name: str) -> None:
    """The engine's typed model.model_kwargs settings: name, type, default, what it does."""
    import json

    from lmpress.engines.registry import engine_settings

    found = engine_settings(name)
    if found is None:
        print(f"{name} declares no model.model_kwargs settings.")
        return
    settings, passes_to = found
    print(f"model.model_kwargs settings of {name}:")
    for s in settings:
        print(f"  {s.name}: {s.type} = {json.dumps(s.default)}\n      {s.description}")
    if passes_to:
        print(f"Other keys go to {passes_to}; one it does not take is refused before loading.")


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


def config_show(ctx: typer.Context, recipe: RecipeOpt = None, engine: EngineOpt = None) -> None:
    """Print the merged config (recipe + overrides) as YAML, secrets redacted."""
    from lmpress.configs.loading import config_to_yaml

    config, words = load_run_config(ctx, recipe, engine)
    if words:
        raise ConfigError(f"unexpected argument '{words[0]}'")
    print(config_to_yaml(config), end="")
    from lmpress.engines.registry import engine_class

    dtype = engine_class(config.engine).dtype_in_use(config.model)
    if dtype:
        print(
            f"# {config.engine} loads the model in {dtype} here "
            f"(model.torch_dtype_str: {config.model.torch_dtype_str})"
        )
