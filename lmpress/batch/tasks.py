"""Which rows a batch run answers: the task follows the lines, and what the model can do.

An OpenAI Batch line says what it asks by its url (`/v1/chat/completions` and
`/v1/completions` generate, `/v1/embeddings` embeds, `/v1/score` and `/score` score,
`/v1/rerank`, `/rerank` and `/v2/rerank` rerank, `/classify` classifies and `/pooling` gives
a reward model's values), as `vllm run-batch` reads it; any other row
asks the run's task. A run whose task nobody chose (no `--task`, none in the recipe) takes the
task its model is made for (`registry.with_model_task`: an embedding model embeds, a
cross-encoder scores, anything else generates) and runs every line the engine started for it answers
(`Engine.answered_tasks`), so one file may mix them. A line it cannot answer fails alone, saying
why. A run whose task was chosen runs only lines of that task (score and rerank being one) and
refuses the others, line by line.
"""

from __future__ import annotations

from dataclasses import dataclass

from lmpress.configs.schema import RunConfig
from lmpress.data.pooling_rows import run_of
from lmpress.data.row_shapes import ParsedRow, RowShape
from lmpress.engines.base import Engine
from lmpress.vocabulary.embeddings import LIKELIHOOD_TASKS, tasks_like

# What a line of each task needs of the model, said when the run's cannot.
_NEEDS = {
    "generate": "a model that generates text",
    "embed": "an embedding model",
    "score": "a cross-encoder or an embedding model",
    "rerank": "a cross-encoder or an embedding model",
    "classify": "a sequence-classification model (--task classify)",
    "reward": "a reward model (--task reward)",
    "loglikelihood": "a model that generates text, on an engine that scores prompts",
    "perplexity": "a model that generates text, on an engine that scores prompts",
}


@dataclass(frozen=True)
class RunTasks:
    """The tasks a run's rows may ask, and why a row asking another does not run."""

    task: str  # the run's: what the model was loaded for, and what plain rows ask
    answered: frozenset[str]  # what the engine started for the run answers, as chosen
    chosen: bool  # by --task or the recipe: rows asking another task are refused
    model: str  # who answers, for the reason a row is refused
    engine: str

    @classmethod
    def of(cls, config: RunConfig, engine_class: type[Engine]) -> RunTasks:
        answered = engine_class.answered_tasks(config)
        if config.task in LIKELIHOOD_TASKS:  # a generating model answers it as it is
            answered = frozenset({config.task}) & engine_class.tasks
        chosen = config.task_chosen()
        if chosen:
            answered &= tasks_like(config.task)
        model = config.model.model_name or "the model"
        return cls(config.task, answered, chosen, model, engine_class.name)

    def refusal(self, row: ParsedRow) -> str | None:
        """Why this run does not run `row` (None: it does)."""
        task = row.task
        if task in self.answered:
            return None
        what = f"a {row.url} line" if row.shape is RowShape.OPENAI_BATCH else f"a {task} row"
        if self.chosen:
            return (
                f"{what} in {run_of(self.task)} (task {self.task} was chosen, by --task or the "
                f"recipe); leave the task out to run each line by its url"
            )
        answers = ", ".join(sorted(self.answered))
        return (
            f"{what} asks to {task}, which '{self.model}' on {self.engine} cannot (it answers "
            f"{answers}); run these lines with {_NEEDS[task]}"
        )
