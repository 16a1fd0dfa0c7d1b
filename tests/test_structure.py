"""The package's shape, as issues 15 and 33 left it: no module over 500 lines, no import cycle
among lmpress's modules, counting every import (module level, deferred and TYPE_CHECKING), the
rest of lmpress reaching engines only through their contract, so that a new engine is its own
folder plus one registry row and no other module knows its name, and a closed vocabulary: no
error kind is spelled as a bare string; and, since issue 51, no module imports from a higher
layer of the package (LAYERS)."""

from __future__ import annotations

import ast
from pathlib import Path

from lmpress.vocabulary.errors import ErrorKind

PACKAGE = Path(__file__).resolve().parent.parent / "lmpress"
MAX_LINES = 500


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def imports(path: Path, known: dict[str, Path]) -> set[str]:
    """The lmpress modules `path` imports anywhere in its body."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        else:
            continue
        out.update(name for name in names if name in known)
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_module_is_over_500_lines():
    sizes = {name: len(path.read_text().splitlines()) for name, path in modules().items()}
    assert {name: n for name, n in sizes.items() if n > MAX_LINES} == {}


def test_no_import_cycle_even_through_deferred_imports():
    known = modules()
    graph = {name: imports(path, known) - {name} for name, path in known.items()}
    assert cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


# lmpress's packages from the bottom up: a module imports from its own layer and the layers
# below it, never from one above (deferred and TYPE_CHECKING imports count, as for cycles).
# Within a layer the packages may import each other, as long as the imports between packages
# form no cycle (the package cycle test). A new package fails `test_every_module_sits_in_a_layer`
# until it is placed here. Inside engines/, the contract's own rule is the last test of this
# group; the rules for the families come after it.
LAYERS: tuple[tuple[str, ...], ...] = (
    # The words every part speaks (Request, Result, the error kinds), the version and the
    # progress bar: they import nothing of lmpress, so anything may read them.
    ("lmpress.vocabulary", "lmpress.version", "lmpress.progress"),
    # The typed schema of a run, its loading and overrides: everything that runs reads a
    # config, and a config knows no engine (the registry checks an engine's name and settings).
    ("lmpress.configs",),
    # What engines and fronts both read: rows and files (data), each protocol's bodies and
    # replies (wire), the models lmpress ships (builtin_models). data reads OpenAI's batch
    # lines through the wire types.
    ("lmpress.data", "lmpress.wire", "lmpress.builtin_models"),
    # The engine contract, the registry of names and the engine families.
    ("lmpress.engines",),
    # The response cache: it names a model by its files as the engines find them and keys
    # answers by the registry's names, and the fronts read and fill it.
    ("lmpress.cache",),
    # The fronts others build on: a batch job (run by the dry run's reader, serve's Batches
    # API and LLM), and the terminal chat (infer draws with its terminal).
    ("lmpress.batch", "lmpress.chat"),
    # The fronts built on those, and other tools' APIs over the engines (integrations: lm-eval's
    # model class, which keys its answers database as the response cache keys a model).
    # pipeline: steps over rows, each step's model through the response cache. view: the
    # viewer and the report over any of their outputs, read from their files (it takes serve's
    # key check).
    (
        "lmpress.dryrun",
        "lmpress.serve",
        "lmpress.infer",
        "lmpress.llm",
        "lmpress.integrations",
        "lmpress.pipeline",
        "lmpress.view",
    ),
    # The entry points: the commands, `python -m lmpress`, and the package root, which offers
    # the Python front (`from lmpress import LLM`).
    ("lmpress.cli", "lmpress.__main__", "lmpress"),
)
LAYER = {package: level for level, packages in enumerate(LAYERS) for package in packages}


def package_of(module: str) -> str:
    """The package a module belongs to in LAYERS: lmpress.batch for lmpress.batch.job."""
    return ".".join(module.split(".")[:2])


def upward_imports(graph: dict[str, set[str]]) -> dict[str, list[str]]:
    """Each module's imports of a module in a higher layer than its own."""
    found = {}
    for name, targets in graph.items():
        level = LAYER[package_of(name)]
        up = sorted(m for m in targets if LAYER[package_of(m)] > level)
        if up:
            found[name] = up
    return found


def import_graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(path, known) - {name} for name, path in known.items()}


def test_every_module_sits_in_a_layer():
    assert sorted({package_of(name) for name in modules()} - set(LAYER)) == []


def test_no_module_imports_a_module_of_a_higher_layer():
    assert upward_imports(import_graph()) == {}


def test_no_import_cycle_between_packages():
    packages: dict[str, set[str]] = {}
    for name, targets in import_graph().items():
        packages.setdefault(package_of(name), set()).update(package_of(m) for m in targets)
    assert cycles({name: found - {name} for name, found in packages.items()}) == []


def test_the_layer_check_finds_an_upward_import(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from lmpress.engines.registry import engine_names\n")
    graph = {"lmpress.configs.m": imports(module, {**modules(), "m": module})}
    assert upward_imports(graph) == {"lmpress.configs.m": ["lmpress.engines.registry"]}


# The engine contract: what every engine implements and what the rest of lmpress asks of one.
# It imports no engine family (the registry, which maps names to families, is not part of it).
CONTRACT_MODULES = (
    "lmpress.engines.base",
    "lmpress.engines.options",
    "lmpress.engines.prompt_count",
)


def test_the_engine_contract_imports_no_engine_family():
    graph = import_graph()
    families = ("lmpress.engines.local", "lmpress.engines.remote")
    reaching = {
        name: sorted(m for m in graph[name] if m.startswith(families)) for name in CONTRACT_MODULES
    }
    assert {name: found for name, found in reaching.items() if found} == {}


# What the rest of lmpress may import from lmpress.engines: the interface and its checks, the
# registry of names, what a prompt counter returns, scoring text on any engine that returns
# prompt logprobs (issue 52), and the remote providers' one table (names, prices, tokenizers,
# batch limits: facts about the providers, not an engine's code), and the names a run's model
# and its adapters answer to (a line, a row or a request chooses by them).
ENGINE_CONTRACT = {
    "lmpress.engines",
    "lmpress.engines.adapters",
    "lmpress.engines.base",
    "lmpress.engines.registry",
    "lmpress.engines.prompt_count",
    "lmpress.engines.scoring",
    "lmpress.engines.remote.presets",
}
# Modules that reach further, and why.
ENGINE_CONTRACT_EXCEPTIONS = {
    # The response cache names a local model by its files' content, found where the local
    # engines find them (a path, a packaged or tiny name, the hub's cache).
    "lmpress.cache.identity": {"lmpress.engines.common.models"},
}


def engine_imports_outside_engines() -> dict[str, set[str]]:
    known = modules()
    found = {}
    for name, path in known.items():
        if name == "lmpress.engines" or name.startswith("lmpress.engines."):
            continue
        engines = {m for m in imports(path, known) if m.startswith("lmpress.engines")}
        if engines:
            found[name] = engines
    return found


def test_no_module_outside_engines_imports_a_local_engines_internals():
    reaching = {
        name: sorted(m for m in engines if m.startswith("lmpress.engines.local"))
        for name, engines in engine_imports_outside_engines().items()
    }
    assert {name: found for name, found in reaching.items() if found} == {}


def test_the_rest_of_lmpress_reaches_engines_only_through_their_contract():
    beyond = {
        name: sorted(engines - ENGINE_CONTRACT - ENGINE_CONTRACT_EXCEPTIONS.get(name, set()))
        for name, engines in engine_imports_outside_engines().items()
    }
    assert {name: found for name, found in beyond.items() if found} == {}


def test_the_contract_rules_see_an_import_of_an_engines_internals(tmp_path):
    module = tmp_path / "m.py"
    module.write_text(
        "def f():\n    from lmpress.engines.local.native.loading import load_tokenizer\n"
    )
    known = {**modules(), "m": module}
    assert "lmpress.engines.local.native.loading" in imports(module, known)


def engine_family(module: str) -> str | None:
    """The engine a module belongs to: 'local.native', 'remote', ...; None for the shared parts
    (engines.base, registry, common/, local/worker.py, local/guided.py)."""
    parts = module.split(".")
    if parts[:3] == ["lmpress", "engines", "remote"]:
        return "remote"
    if parts[:3] == ["lmpress", "engines", "local"] and len(parts) > 4:
        return f"local.{parts[3]}"
    return None


def test_no_engine_imports_another_engines_code():
    """What two engines share lives in engines/common/ (or local/worker.py, local/guided.py),
    never inside one of them: a piece another engine needs is moved to a module named for what
    it is, so that no engine's folder is a library for the others."""
    known = modules()
    crossing = {}
    for name, path in known.items():
        family = engine_family(name)
        if family is None:
            continue
        others = {m for m in imports(path, known) if engine_family(m) not in (None, family)}
        if others:
            crossing[name] = sorted(others)
    assert crossing == {}


def test_the_package_has_no_loose_rooms_and_the_tests_mirror_it():
    """The package root holds the fronts that are one module (llm.py, infer.py), the entry
    points and what every front shares (progress.py, version.py); everything else is in a
    folder a reader can name, and each folder has its tests in the same place under tests/."""
    loose = sorted(path.name for path in PACKAGE.glob("*.py"))
    assert loose == [
        "__init__.py", "__main__.py", "infer.py", "llm.py", "progress.py", "version.py",
    ]  # fmt: skip
    tests = Path(__file__).resolve().parent
    folders = sorted(path.name for path in PACKAGE.iterdir() if (path / "__init__.py").exists())
    assert [name for name in folders if not (tests / name / "__init__.py").exists()] == []


# Where a call takes an error kind by position: ErrorInfo(kind, ...), RequestError(message,
# kind), RowFailure(line, row_id, kind, ...), retry's Failure(kind, ...).
KIND_POSITION = {"ErrorInfo": 0, "RequestError": 1, "RowFailure": 2, "Failure": 0}
# Calls whose `kind` is no error kind: numpy's sort algorithm.
OTHER_KINDS = {"argsort", "sort"}
ERROR_KIND_VALUES = {kind.value for kind in ErrorKind}


def _callee(call: ast.Call) -> str:
    func = call.func
    return func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")


def _strings(node: ast.AST) -> list[str]:
    """The str constants an expression can evaluate to (through `a if c else b`)."""
    if isinstance(node, ast.IfExp):
        return _strings(node.body) + _strings(node.orelse)
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    return []


def bare_error_kinds(source: str) -> list[tuple[int, str]]:
    """(line, text) of each error kind spelled as a string rather than an `ErrorKind`: given
    as `kind=`, in a kind's place in a call that makes a failure, assigned to a `kind`, or
    redefined under a member's name (`CONNECTION_ERROR = "connection_error"`)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and _callee(node) not in OTHER_KINDS:
            values = [kw.value for kw in node.keywords if kw.arg == "kind"]
            position = KIND_POSITION.get(_callee(node))
            if position is not None and len(node.args) > position:
                values.append(node.args[position])
            if _callee(node) == "getattr" and len(node.args) == 3:
                values += [node.args[2]] if set(_strings(node.args[1])) == {"kind"} else []
            found += [(node.lineno, text) for value in values for text in _strings(value)]
        elif isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id in {"kind", *ErrorKind.__members__}
            for target in node.targets
        ):
            texts = [text for text in _strings(node.value) if text in ERROR_KIND_VALUES]
            found += [(node.lineno, text) for text in texts]
    return sorted(found)


def test_no_error_kind_is_a_bare_string():
    found = {
        f"{name}:{line}": text
        for name, path in modules().items()
        if name != ErrorKind.__module__  # where the kinds are defined
        for line, text in bare_error_kinds(path.read_text())
    }
    assert found == {}


def test_the_error_kind_scan_finds_each_spelling():
    source = """
RequestError("no", kind="invalid_request")
RequestError("no", "made_up")
ErrorInfo("engine_closed", "closed")
RowFailure(3, "r", "invalid_json", "bad")
kind = "context_length_exceeded" if long else "invalid_request"
kind = getattr(exc, "kind", "invalid_request")
np.argsort(values, kind="stable")
kind = "chat"
RequestError("fine", kind=ErrorKind.INVALID_REQUEST)
CONNECTION_ERROR = "connection_error"
"""
    assert bare_error_kinds(source) == [
        (2, "invalid_request"),
        (3, "made_up"),
        (4, "engine_closed"),
        (5, "invalid_json"),
        (6, "context_length_exceeded"),
        (6, "invalid_request"),
        (7, "invalid_request"),
        (11, "connection_error"),
    ]


def test_one_module_per_protocol_direction():
    """Each wire protocol lmpress speaks (OpenAI's, Anthropic's, Gemini's) is written once, in
    lmpress/wire/, both directions, and the engines, serve and batch's provider APIs read and
    write it from there (issue 51). Three checks hold that:
    - wire is below the engines and the fronts: no module under lmpress/wire/ imports one of
      them;
    - a reply parser is what makes a `Reply`, `EmbedReply` or `ScoreReply` out of a body, so
      nothing outside wire/ constructs one: an engine, serve or batch module that parses a
      provider's reply again fails here;
    - the modules that used to hold a protocol beside an engine or a route are gone."""
    known = modules()
    above = ("engines", "serve", "batch", "cli", "chat", "dryrun", "cache", "llm", "infer")
    upward = {
        name: sorted(m for m in imports(path, known) if m.split(".")[1] in above)
        for name, path in known.items()
        if name.startswith("lmpress.wire")
    }
    assert {name: found for name, found in upward.items() if found} == {}

    replies = {"Reply", "EmbedReply", "ScoreReply"}
    making = {}
    for name, path in known.items():
        if name.startswith("lmpress.wire"):
            continue
        calls = [
            node.lineno
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Call) and _callee(node) in replies
        ]
        if calls:
            making[name] = calls
    assert making == {}

    gone = {"lmpress.openai_wire", "lmpress.serve.anthropic_wire",
            "lmpress.engines.remote.gemini_wire", "lmpress.engines.remote.inline_images"}  # fmt: skip
    assert gone & set(known) == set()
