"""The code a pipeline file may name: a filter expression, evaluated in Jinja's immutable
sandbox over the row's columns, or a Python function `module:function` the user wrote.

A YAML file is data, so an expression must not reach Python: the sandbox refuses unsafe
attributes at run time, the environment has no globals (no `range`, `dict`, `lipsum`), and a
name or attribute starting with `_` (`__class__`, `__import__`) is refused when the pipeline
loads. What an expression names is otherwise a column, checked like a template's.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lmpress.vocabulary.errors import ConfigError


class Expression:
    """A compiled filter expression; `names`: the columns it reads."""

    def __init__(self, text: str, where: str):
        import jinja2
        from jinja2 import meta, nodes
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(undefined=jinja2.StrictUndefined)
        env.globals.clear()
        try:
            tree = env.parse("{{ (" + text + ") }}")
            self._evaluate = env.compile_expression(text, undefined_to_none=False)
        except jinja2.TemplateSyntaxError as exc:
            raise ConfigError(f"{where}: not a valid expression ({exc.message})") from None
        hidden = [n.attr for n in tree.find_all(nodes.Getattr) if n.attr.startswith("_")]
        hidden += [n.name for n in tree.find_all(nodes.Name) if n.name.startswith("_")]
        hidden += [
            n.arg.value
            for n in tree.find_all(nodes.Getitem)
            if isinstance(n.arg, nodes.Const) and str(n.arg.value).startswith("_")
        ]
        if hidden:
            raise ConfigError(
                f"{where}: '{hidden[0]}' is not allowed: an expression reads columns only "
                f"(write a `function: module:function` for more)"
            )
        self.text = text
        self.names: set[str] = set(meta.find_undeclared_variables(tree))

    def __call__(self, row: dict[str, Any]) -> Any:
        """The expression's value on the row; raises ValueError with one line on a failure
        (a column the row lacks, a comparison of wrong types, the sandbox refusing)."""
        import jinja2

        try:
            return self._evaluate(**row)
        except jinja2.UndefinedError as exc:
            raise ValueError(f"`{self.text}`: {exc.message}") from None
        except (jinja2.TemplateError, TypeError, ValueError, ArithmeticError) as exc:
            raise ValueError(f"`{self.text}`: {type(exc).__name__}: {exc}") from None


def import_function(target: str, where: str) -> Callable[[dict[str, Any]], Any]:
    """`module:function` imported, the current directory first on the path as Python's own
    `python -m` would have it, so a pipeline beside the user's module finds it."""
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"{where}: '{target}' is not module:function")
    cwd = str(Path.cwd())
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    # A step's fingerprint is its module's source (function_digest), so the code that runs must
    # be that source, never bytecode Python cached for an earlier version: it checks only the
    # source's size and its mtime to the second, so an edit of the same size within a second of
    # the last run would run the old code under the new fingerprint. lmpress writes none.
    writes_bytecode, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"{where}: cannot import module '{module_name}' ({exc})") from None
    except Exception as exc:  # the user's module failed as it ran its own top level
        raise ConfigError(
            f"{where}: importing '{module_name}' failed ({type(exc).__name__}: {exc})"
        ) from None
    finally:
        sys.dont_write_bytecode = writes_bytecode
    function = getattr(module, attr, None)
    if not callable(function):
        raise ConfigError(f"{where}: module '{module_name}' has no function '{attr}'")
    return function


def function_digest(target: str, where: str) -> str:
    """A digest of the source of the module `module:function` lives in, so that editing the
    function re-runs its step as editing a step's settings does."""
    import hashlib
    import inspect

    function = import_function(target, where)
    try:
        source = inspect.getsource(inspect.getmodule(function) or function)
    except (OSError, TypeError):  # no source to read (a C extension, a frozen module)
        return target
    return hashlib.sha256(source.encode()).hexdigest()[:16]
