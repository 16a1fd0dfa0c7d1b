"""lmpress: run language models over data, on any engine.

Importing this package imports no backend library; engines load theirs on first use.
"""

__version__ = "0.1.0"
