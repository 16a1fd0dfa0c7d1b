"""The names one run's model answers to: its own, and each of its LoRA adapters'.

A row, an OpenAI Batch line or a server request chooses what generates its reply by name: the
`adapter` column, or the `model` of a line or request. `model.adapters` maps each adapter's
name to its files; any name of the base model (`model.model_name`, or the name a server
publishes) chooses the base. A run that serves several (adapters, or several models) answers
an unknown name with vLLM's 404 error; a run of one model answers it with that model.
"""

from __future__ import annotations

from lmpress.configs.schema import RunConfig
from lmpress.vocabulary.errors import ErrorKind, RequestError


def base_names(config: RunConfig, served_name: str | None = None) -> set[str]:
    """The names that choose `config`'s base model: the one it is served as, its model_name,
    and that name's last path part (a line names `model.gguf`, not the path to it)."""
    names = {n for n in (served_name, config.model.model_name) if n}
    names |= {n.rstrip("/").rsplit("/", 1)[-1] for n in list(names)}
    return names


def serves_several(config: RunConfig) -> bool:
    """Whether a name must choose among several things this run serves."""
    return bool(config.model.adapters)


def adapter_for(
    config: RunConfig, name: str | None, served_name: str | None = None, *, strict: bool = False
) -> str | None:
    """The adapter `name` chooses: an adapter's name, or None for the base model (a name of
    it, or no name at all). Raises RequestError (NOT_FOUND, as vLLM's 404) for a name that is
    neither, where the run serves several or is `strict` (`batch --strict-model`); a run of
    one model otherwise answers any name with it."""
    if not name or name in base_names(config, served_name):
        return None
    if name in config.model.adapters:
        return name
    if not (strict or serves_several(config)):
        return None
    known = sorted(base_names(config, served_name) | set(config.model.adapters))
    raise RequestError(
        f"The model '{name}' does not exist; this run serves {', '.join(repr(n) for n in known)}",
        ErrorKind.NOT_FOUND,
        status=404,
    )
