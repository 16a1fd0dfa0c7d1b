"""lmpress: run language models over data, on any engine.

Importing this package imports no backend library; engines load theirs on first use.
`from lmpress import LLM` is the Python front (lmpress/llm.py), with `compare` (prompts
through several models); `Pipeline` and its step builders (`generate`, `judge`, `filter`,
`map`, `dedupe`) build pipelines in Python (lmpress/pipeline/python.py); `view(path)` opens
the viewer on an output and returns its address (lmpress/view/).
"""

from typing import TYPE_CHECKING

from lmpress.version import __version__

# `filter` and `map` are left out of __all__ so that `from lmpress import *` does not hide
# Python's own; import them by name.
__all__ = ["LLM", "Pipeline", "__version__", "compare", "dedupe", "generate", "judge", "view"]
PIPELINE_NAMES = ("Pipeline", "generate", "judge", "filter", "map", "dedupe")

if TYPE_CHECKING:
    from lmpress.llm import LLM, compare
    from lmpress.pipeline.python import Pipeline, dedupe, generate, judge
    from lmpress.pipeline.python import filter as filter
    from lmpress.pipeline.python import map as map
    from lmpress.view import view as view


def __getattr__(name: str):
    if name in ("LLM", "compare"):  # loaded on use, so `lmpress --help` stays light
        from lmpress import llm

        return getattr(llm, name)
    if name in PIPELINE_NAMES:
        from lmpress.pipeline import python

        return getattr(python, name)
    if name == "view":  # the module, callable: `lmpress.view(path)`
        import importlib

        return importlib.import_module("lmpress.view")
    raise AttributeError(f"module 'lmpress' has no attribute {name!r}")
