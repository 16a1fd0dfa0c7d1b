"""lmpress's version, in a module of its own so that any module can read it without importing
the package root (which offers the Python front, and so imports nearly everything)."""

__version__ = "0.1.0"
