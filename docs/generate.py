"""Write the docs' generated pages from the code, so that they cannot drift from it:

- docs/reference/config.md: every config key, from the dataclasses of lmpress/configs/schema.py
  (and `GenerationParams` in lmpress/vocabulary/types.py): its type and default from the field,
  what it is from the comment on or above the field, the values allowed from `RANGE_CHECKS`;
  then each engine's typed `model.model_kwargs` settings, as `lmpress engines NAME` lists them.
- docs/reference/generation.md: each `generation.*` setting and the engines that take it, from
  the engines' `supported_params`.
- docs/reference/cli.md: the `--help` of every command, as `lmpress ... --help` prints it at a
  width of 100 columns.

`python docs/generate.py` rewrites them; `python docs/generate.py --check` exits 1 naming each
page that differs from what it would write (tests/test_doc_examples.py runs the same check).
"""

from __future__ import annotations

import ast
import dataclasses
import json
import sys
import tokenize
import typing
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

CONFIG_PAGE = REPO / "docs" / "reference" / "config.md"
GENERATION_PAGE = REPO / "docs" / "reference" / "generation.md"
CLI_PAGE = REPO / "docs" / "reference" / "cli.md"
HELP_WIDTH = 100


def field_comments(path: Path, class_name: str) -> dict[str, str]:
    """Each field of the class, with the comment on its line or, failing that, the comment
    block above it. A block speaks for the fields that follow it up to a blank line or the
    next block: the first shows it, the others point to the first."""
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    tree = ast.parse(source)
    found: dict[str, str] = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.ClassDef) and node.name == class_name):
            continue
        group, previous = "", 0  # the field the current block belongs to; its last line
        for item in node.body:
            if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)):
                continue
            above = []
            number = item.lineno - 2
            while number >= 0 and lines[number].strip().startswith("#"):
                above.insert(0, lines[number].strip().lstrip("#").strip())
                number -= 1
            section = ast.unparse(item.annotation)[:1].isupper()  # a section ends the block too
            if above:
                group, block = item.target.id, " ".join(above)
            elif section or any(not line.strip() for line in lines[previous : item.lineno - 1]):
                group, block = "", ""  # a blank line ends the block
            else:
                block = f"see `{group}`" if group else ""
            previous = item.end_lineno or item.lineno
            found[item.target.id] = _trailing_comment(lines[item.lineno - 1]) or block
    return found


def _trailing_comment(line: str) -> str:
    """The comment after the code on a line (a `#` inside a string does not count)."""
    try:
        tokens = list(tokenize.generate_tokens(iter([line.strip() + "\n"]).__next__))
    except Exception:  # a line that does not tokenize alone (a bracket left open)
        return ""
    comments = [t.string for t in tokens if t.type == tokenize.COMMENT]
    return comments[0].lstrip("#").strip() if comments else ""


def type_text(tp: object) -> str:
    text = tp if isinstance(tp, str) else getattr(tp, "__name__", str(tp))
    return str(text).replace("typing.", "").replace("NoneType", "None")


def default_text(field: dataclasses.Field) -> str:
    if field.default is not dataclasses.MISSING:
        value = field.default
    elif field.default_factory is not dataclasses.MISSING:
        value = field.default_factory()
    else:
        return ""
    if dataclasses.is_dataclass(value):
        return ""
    try:
        return json.dumps(value)
    except TypeError:
        return str(value)


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def section_rows(prefix: str, cls: type, source: Path) -> list[str]:
    from lmpress.configs.schema import RANGE_CHECKS

    comments = field_comments(source, cls.__name__)
    hints = typing.get_type_hints(cls)
    rows = []
    for field in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints.get(field.name)):
            continue  # a section: it has a table of its own
        key = f"{prefix}{field.name}"
        allowed = RANGE_CHECKS.get(key, (None, ""))[1]
        about = comments.get(field.name, "").replace("see `", f"see `{prefix}")
        rows.append(
            f"| `{key}` | `{cell(type_text(field.type))}` | `{cell(default_text(field))}` "
            f"| {cell(allowed)} | {cell(about)} |"
        )
    return rows


def config_page() -> str:
    from lmpress.configs import schema
    from lmpress.engines.registry import engine_names, engine_settings
    from lmpress.vocabulary import types

    header = ["| key | type | default | allowed | what it is |", "|---|---|---|---|---|"]
    out = [
        "# Config keys",
        "",
        "<!-- Written by `python docs/generate.py` from lmpress/configs/schema.py and the engines'"
        " options; edit those, not this page. -->",
        "",
        "Every key a recipe may set, as a `section.key` override on the command line takes it",
        "(`--generation.temperature 0.7`). The type and default are the field's; what it is, the",
        "comment the schema gives it; the allowed values, the check every recipe, row and",
        "request is held to ([recipes](../recipes.md) says how a run's config is put together).",
        "",
        "## Top level",
        "",
        *header,
        *section_rows("", schema.RunConfig, Path(schema.__file__)),
    ]
    sections = [
        ("model", schema.ModelParams, Path(schema.__file__)),
        ("generation", types.GenerationParams, Path(types.__file__)),
        ("remote_params", schema.RemoteParams, Path(schema.__file__)),
        ("serve", schema.ServeParams, Path(schema.__file__)),
        ("ray", schema.RayParams, Path(schema.__file__)),
    ]
    for name, cls, source in sections:
        out += ["", f"## {name}", "", *header, *section_rows(f"{name}.", cls, source)]
    out += [
        "",
        "## Engine settings (`model.model_kwargs`)",
        "",
        "What each engine reads from `model.model_kwargs`, as `lmpress engines NAME` lists it: a",
        "typo or a value of the wrong type is refused when the config loads, with the closest",
        "name ([engines](../engines/index.md)).",
    ]
    for name in engine_names():
        found = engine_settings(name)
        if found is None:
            continue
        settings, passes_to = found
        out += ["", f"### {name}", "", "| setting | type | default | what it does |"]
        out += ["|---|---|---|---|"]
        for s in settings:
            out.append(
                f"| `{s.name}` | `{cell(s.type)}` | `{cell(json.dumps(s.default))}` "
                f"| {cell(s.description)} |"
            )
        if passes_to:
            out += ["", f"Other keys go to {passes_to}; one it does not take is refused before"]
            out += ["any weights load."]
    return "\n".join(out) + "\n"


def generation_page() -> str:
    """Each generation setting and the engines that take it, from their `supported_params`."""
    from lmpress.engines.registry import LOCAL, REMOTE, engine_class
    from lmpress.vocabulary import types

    comments = field_comments(Path(types.__file__), "GenerationParams")
    local = [spec.name for spec in LOCAL]
    taken = {spec.name: engine_class(spec.name).supported_params for spec in LOCAL + REMOTE}
    out = [
        "# Generation settings by engine",
        "",
        "<!-- Written by `python docs/generate.py` from GenerationParams and each engine's"
        " supported_params; edit those, not this page. -->",
        "",
        "Every `generation.*` setting and the engines that take it. A setting an engine does not",
        "take, set away from its default, is refused before any row runs, in one line naming",
        "the engine and the setting; `lmpress engines NAME` lists what one engine takes. The",
        "scheduling fields (`batch_size`, `use_cache`, `exclude_prompt_from_response`),",
        "`use_sampling` (which acts through the temperature) and the tool fields (refused with",
        "the tools by an engine that cannot call them) are never refused, and not listed.",
        "[Config keys](config.md) gives each setting's type, default and allowed values.",
        "",
        f"| setting | what it is | {' | '.join(local)} | remote engines that take it |",
        "|---|---|" + "---|" * len(local) + "---|",
    ]
    for field in dataclasses.fields(types.GenerationParams):
        if field.name in types.NEVER_REFUSED:
            continue
        marks = ["yes" if field.name in taken[name] else "no" for name in local]
        remote = [spec.name for spec in REMOTE if field.name in taken[spec.name]]
        out.append(
            f"| `generation.{field.name}` | {cell(comments.get(field.name, ''))} "
            f"| {' | '.join(marks)} | {', '.join(remote) or 'none'} |"
        )
    out += [
        "",
        "## Beam search (`num_beams`)",
        "",
        "NATIVE and LLAMACPP search as transformers' `generate(num_beams=k)` does, token for",
        "token: at each step the k likeliest continuations of the beams run on, a beam that",
        "writes an end token (or its last) becomes a hypothesis scored by its summed",
        "log-probability over its length to the power `length_penalty`, and `early_stopping`",
        '(true, false or `"never"`) says when the hypotheses can no longer be beaten. VLLM runs',
        "vLLM's own search (the one `vllm serve` answers `use_beam_search` with), whose",
        "`length_penalty` divides by the whole sequence's length, prompt included, and which has",
        "no `early_stopping`. `n` returns the best n of the k. A request with beams holds k rows",
        "of the batch and shares its steps with every other row. The search is greedy, and",
        "refused in one line with what changes how a token is picked (a temperature, penalties,",
        "stop strings, a grammar, logprobs); a streamed reply comes whole when the search ends.",
        "`lmpress serve` takes vLLM's body: `use_beam_search` with `best_of` beams (else `n`),",
        "the best `n` back. REMOTE_VLLM sends `num_beams` as a vLLM server takes it",
        "(`use_beam_search` with `n` beams, each answered best first) and keeps the best `n`;",
        "the other remote engines have no beam search and refuse it in one line.",
        "",
        "## The KV cache's precision (`model.kv_cache_dtype`)",
        "",
        "A model setting rather than a generation one, taken or refused the same way: `auto` is",
        "each engine's own precision; the others are the engine's quantized caches",
        "(`benchmarks/kv_cache.py` measures what they cost and buy: [LLAMACPP](../engines/llamacpp.md),",
        "[NATIVE](../engines/native.md#modelkv_cache_dtype-int8), [VLLM](../engines/vllm.md)).",
        "",
        "| engine | takes |",
        "|---|---|",
    ]
    for spec in LOCAL + REMOTE:
        held = sorted(engine_class(spec.name).kv_cache_dtypes)
        if held:
            out.append(f"| {spec.name} | auto, {', '.join(held)} |")
    out += ["", "Every other engine takes `auto` only."]
    return "\n".join(out) + "\n"


def help_text(args: list[str]) -> str:
    """What `lmpress ARGS --help` prints at HELP_WIDTH columns, without colour, each line's
    trailing spaces dropped."""
    from typer.testing import CliRunner

    from lmpress.cli.app import app

    env = {"COLUMNS": str(HELP_WIDTH), "NO_COLOR": "1", "TERM": "dumb"}
    result = CliRunner().invoke(app, [*args, "--help"], env=env, prog_name="lmpress")
    if result.exit_code != 0:
        raise RuntimeError(f"lmpress {' '.join(args)} --help: exit {result.exit_code}")
    return "\n".join(line.rstrip() for line in result.output.splitlines()).strip("\n") + "\n"


def commands() -> list[list[str]]:
    """`lmpress` and every command under it that runs (groups such as `cache` are shown by
    their subcommands), in the order the CLI registers them: a new command is on the page
    without an edit here."""
    import typer.main

    from lmpress.cli.app import app

    def walk(command, path: list[str]) -> list[list[str]]:
        children = getattr(command, "commands", None)
        if children is None:
            return [path]
        return [
            found
            for name, child in children.items()
            if not getattr(child, "hidden", False)
            for found in walk(child, [*path, name])
        ]

    return [[], *walk(typer.main.get_command(app), [])]


def cli_page() -> str:
    out = [
        "# CLI reference",
        "",
        "<!-- Written by `python docs/generate.py` from the commands' own help; edit the"
        " commands, not this page. -->",
        "",
        "Every command's `--help`, as it prints it at 100 columns. `--debug` on any command",
        "shows the traceback behind an error ([troubleshooting](../troubleshooting.md)).",
    ]
    for args in commands():
        title = " ".join(["lmpress", *args])
        out += ["", f"## {title}", "", "```text", help_text(args).rstrip("\n"), "```"]
    return "\n".join(out) + "\n"


def pages() -> dict[Path, str]:
    return {
        CONFIG_PAGE: config_page(),
        GENERATION_PAGE: generation_page(),
        CLI_PAGE: cli_page(),
    }


def stale() -> list[Path]:
    """The generated pages whose committed text differs from what this script writes."""
    return [
        path
        for path, text in pages().items()
        if not path.exists() or path.read_text(encoding="utf-8") != text
    ]


def main(argv: list[str]) -> int:
    if "--check" in argv:
        differ = stale()
        for path in differ:
            print(f"{path.relative_to(REPO)} differs: run python docs/generate.py")
        return 1 if differ else 0
    for path, text in pages().items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
