"""Run configuration: the typed schema and how recipes and overrides become one RunConfig."""

from lmpress.configs.loading import load_config, parse_overrides, resolve_recipe
from lmpress.configs.schema import ModelParams, RemoteParams, RunConfig

__all__ = [
    "ModelParams",
    "RemoteParams",
    "RunConfig",
    "load_config",
    "parse_overrides",
    "resolve_recipe",
]
