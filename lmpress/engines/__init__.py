"""Engines: one module per backend behind the interface in `base`; `registry` maps names to them."""

from lmpress.engines.base import Engine
from lmpress.engines.registry import create_engine, engine_names, load_engine_class

__all__ = ["Engine", "create_engine", "engine_names", "load_engine_class"]
