"""Which model answers a line that names one (an OpenAI Batch line's `body.model`).

A one-model job answers every line with its model, as lmpress always has, and counts the lines
that named another (the summary says how many); `--strict-model` fails those lines alone with
vLLM's 404 error instead. In a `--models` job each model runs as a job of its own over the
same input: a line naming one of the models runs on that model only, a line naming none runs
on all, and a line naming a model the job does not run fails once, with the 404 error, in the
first model's part. What a name chooses within one model (its base or an adapter) is
`engines.adapters.adapter_for`'s to say; this module only asks it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from lmpress.configs.schema import RunConfig
from lmpress.engines.adapters import adapter_for, base_names, serves_several
from lmpress.vocabulary.errors import RequestError


class Route(str, Enum):
    RUN = "run"  # this job's model answers the line
    RUN_OTHER = "run_other"  # answered here, though the line named another model
    ELSEWHERE = "elsewhere"  # another model of a --models job answers it
    UNKNOWN = "unknown"  # no model of the job has that name: vLLM's 404 (NOT_FOUND)


@dataclass
class LineModels:
    """How one job routes the lines that name a model."""

    config: RunConfig
    strict: bool = False  # --strict-model: a line naming another model fails (404)
    label: str | None = None  # this model's name in a --models job (as given to --models)
    # The names of the job's other models (a --models job), and whether this model's part is
    # the one that writes the 404 lines (the first), so that each is written once.
    others: set[str] = field(default_factory=set)
    first: bool = True

    def route(self, name: str | None) -> tuple[Route, str]:
        """Where a line naming `name` runs, and for UNKNOWN the error's message."""
        if not name or self.answers(name):
            return Route.RUN, ""
        several = self.label is not None
        if several and name in self.others:
            return Route.ELSEWHERE, ""
        if not (self.strict or several or serves_several(self.config)):  # adapters: must name
            return Route.RUN_OTHER, ""
        if several and not self.first:
            return Route.ELSEWHERE, ""
        return Route.UNKNOWN, self._not_found(name)

    def answers(self, name: str) -> bool:
        """Whether `name` is one of this model's (its label, a name of its base, an adapter)."""
        if name == self.label:
            return True
        served = self.config.serve.served_model_name  # serve's /v1/batches: its name too
        try:
            adapter_for(self.config, name, served, strict=True)
        except RequestError:
            return False
        return True

    def _not_found(self, name: str) -> str:
        try:
            adapter_for(self.config, name, strict=True)
        except RequestError as exc:
            if self.label is None:
                return str(exc)
        known = sorted((model_names(self.config, self.label or "") | self.others) - {""})
        listed = ", ".join(repr(n) for n in known)
        return f"The model '{name}' does not exist; this job runs {listed}"


def model_names(config: RunConfig, label: str) -> set[str]:
    """Every name a line may give one model of a --models job: its label, its base's names and
    its adapters'."""
    return {label, *base_names(config), *config.model.adapters}
