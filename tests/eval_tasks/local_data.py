"""The local tasks' data, read from the JSONL files beside this module, so the tasks run offline
and from any working directory (lm-eval's `custom_dataset` hook; a task YAML's `dataset_path:
json` would read `data_files` relative to the working directory)."""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).parent


def _split(name: str):
    from datasets import Dataset, DatasetDict

    rows = [json.loads(line) for line in (HERE / name).read_text().splitlines() if line]
    return DatasetDict({"test": Dataset.from_list(rows)})


def multiple_choice(**metadata) -> object:
    """40 general-knowledge questions, four choices each."""
    return _split("multiple_choice.jsonl")


def texts(**metadata) -> object:
    """Six short paragraphs for perplexity."""
    return _split("texts.jsonl")


def capitals(**metadata) -> object:
    """Eight countries, whose capital city the model names."""
    return _split("capitals.jsonl")
