"""lmpress: run language models over data, on any engine.

Importing this package imports no backend library; engines load theirs on first use.
`from lmpress import LLM` is the Python front (lmpress/llm.py).
"""

from typing import TYPE_CHECKING

from lmpress.version import __version__

__all__ = ["LLM", "__version__"]

if TYPE_CHECKING:
    from lmpress.llm import LLM


def __getattr__(name: str):
    if name == "LLM":  # loaded on use, so `lmpress --help` stays light
        from lmpress.llm import LLM

        return LLM
    raise AttributeError(f"module 'lmpress' has no attribute {name!r}")
