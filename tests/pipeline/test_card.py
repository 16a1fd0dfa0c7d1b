"""The dataset card of a made-up two-step run: the hub's own card parser reads its front matter,
`datasets` loads the dataset through it, and the Markdown holds every figure of the run."""

from __future__ import annotations

import re

import pytest
import yaml

from lmpress.configs.schema import ModelParams, RunConfig
from lmpress.pipeline.card import (
    CardFacts,
    StepFacts,
    model_facts,
    step_cost,
    write_card,
)
from lmpress.pipeline.export import write_dataset

PIPELINE = """\
models:
  writer: {engine: NATIVE, model: ./weights}
steps:
  - name: ask
    kind: generate
    model: writer
    prompt: "Write a question about {topic}. Use `code` | pipes: ```"
  - name: good_only
    kind: filter
    expr: len(question) > 20
"""


@pytest.fixture
def weights(tmp_path, monkeypatch):
    """A model directory with a weights file; the digests table in the test's own cache."""
    monkeypatch.setenv("LMPRESS_CACHE", str(tmp_path / "lmpress-cache"))
    directory = tmp_path / "weights"
    directory.mkdir()
    (directory / "model.safetensors").write_bytes(b"\x00weights v1")
    return directory


def writer_config(weights) -> RunConfig:
    return RunConfig(
        engine="NATIVE", model=ModelParams(model_name=str(weights), torch_dtype_str="float32")
    )


def two_step_facts(weights, rows: int, data_path: str, data_format: str) -> CardFacts:
    return CardFacts(
        pipeline_path="pipeline.yaml",
        pipeline_text=PIPELINE,
        command="lmpress run pipeline.yaml -i topics.jsonl -o out/",
        data_path=data_path,
        data_format=data_format,
        rows=rows,
        input_path="topics.jsonl",
        rejects_path="rejects.jsonl",
        seconds=93.25,
        created="2026-11-29T18:00:00+00:00",
        models=[model_facts("writer", writer_config(weights))],
        steps=[
            StepFacts(
                name="ask", kind="generate", model="writer", seed=1234,
                settings={"temperature": 0.7, "max_new_tokens": 64}, rows_in=40, rows_out=37,
                failed=3, prompt_tokens=5120, completion_tokens=2048, cost_usd=0.0123,
                seconds=81.5,
            ),
            StepFacts(
                name="good_only", kind="filter", rows_in=37, rows_out=rows,  # 26 + 11 dropped
                dropped={"len(question) > 20 is false": 9, "score | missing": 2}, seconds=0.25,
            ),
        ],
    )  # fmt: skip


def read_card(path):
    text = path.read_text()
    match = re.match(r"---\n(.*?)\n---\n(.*)", text, re.S)
    assert match, text[:200]
    return yaml.safe_load(match.group(1)), match.group(2)


def table_row(markdown: str, first: str) -> list[str]:
    line = next(line for line in markdown.splitlines() if line.startswith(f"| {first} |"))
    return [cell.strip() for cell in line.strip("|").split(" | ")]


def test_the_card_holds_every_figure_of_the_run(tmp_path, weights):
    out = tmp_path / "out"
    facts = two_step_facts(weights, 26, "dataset.jsonl", "jsonl")
    assert write_card(out, facts) == out / "README.md"
    front, markdown = read_card(out / "README.md")
    hub = pytest.importorskip("huggingface_hub").DatasetCard.load(out / "README.md")
    assert hub.data.to_dict() == front
    assert hub.text == markdown

    assert front["configs"] == [
        {"config_name": "default", "data_files": [{"split": "train", "path": "dataset.jsonl"}]}
    ]
    assert front["dataset_info"] == {"splits": [{"name": "train", "num_examples": 26}]}
    assert front["size_categories"] == ["n<1K"]
    assert front["tags"] == ["lmpress", "synthetic"]

    assert table_row(markdown, "ask") == [
        "ask", "generate", "writer", "40", "37", "0", "3", "5120", "2048", "0.0123", "81.5 s",
    ]  # fmt: skip
    assert table_row(markdown, "good_only") == [
        "good_only", "filter", "", "37", "26", "11", "0", "0", "0", "–", "0.2 s",
    ]  # fmt: skip
    assert table_row(markdown, "**total**") == [
        "**total**", "", "", "", "", "11", "3", "5120", "2048", "0.0123", "",
    ]  # fmt: skip
    assert "- `good_only`: 9 × len(question) > 20 is false" in markdown
    assert "- `good_only`: 2 × score \\| missing" in markdown

    identity = model_facts("writer", writer_config(weights)).identity
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", identity)
    assert f"- identity (the response cache's): `{identity}`" in markdown
    assert "- engine: NATIVE" in markdown
    assert "torch_dtype_str: float32" in markdown
    settings = re.search(r"### `ask`\n\n```yaml\n(.*?)```", markdown, re.S).group(1)
    assert yaml.safe_load(settings) == {"max_new_tokens": 64, "seed": 1234, "temperature": 0.7}

    assert "26 rows in `dataset.jsonl` (jsonl)" in markdown
    assert "made by lmpress 0.1.0 on 2026-11-29T18:00:00+00:00 in 93.2 s" in markdown
    assert "```sh\nlmpress run pipeline.yaml -i topics.jsonl -o out/\n```" in markdown
    assert "`rejects.jsonl`" in markdown
    # The pipeline file verbatim, in a fence longer than its own backticks.
    assert f"\n````yaml\n{PIPELINE}````\n" in markdown


def test_the_card_names_a_model_by_its_weights_content(weights):
    before = model_facts("writer", writer_config(weights)).identity
    (weights / "model.safetensors").write_bytes(b"\x00weights v2")
    assert model_facts("writer", writer_config(weights)).identity != before


def test_a_remote_model_is_named_by_its_name_and_priced_from_the_list():
    config = RunConfig(engine="OPENAI", model=ModelParams(model_name="gpt-4o-mini"))
    facts = model_facts("judge", config)
    assert (facts.identity, facts.endpoint) == ("gpt-4o-mini", "https://api.openai.com/v1")
    assert facts.price == ("$0.15 in, $0.6 out per million tokens (OPENAI price list, gpt-4o-mini)")
    assert step_cost(config, 1_000_000, 2_000_000) == pytest.approx(0.15 + 1.2)
    assert step_cost(writer_config("/nowhere"), 10, 10) is None  # a local model, unpriced


@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "hf"])
def test_the_hub_loads_the_dataset_through_the_card(tmp_path, weights, fmt):
    """`datasets.load_dataset` on the output directory finds the data by the card's configs
    and, for Parquet and Arrow, types it by the card's features."""
    datasets = pytest.importorskip("datasets")
    from tests.pipeline.test_export import made_rows

    out = tmp_path / "out"
    path = write_dataset(iter(made_rows()), out, fmt)
    # Other rows beside the dataset, as a run may leave a step's: without the card's configs
    # the hub's loader would read them as data too (and fail on their other columns).
    write_dataset(iter([{"step": "ask", "reason": "too short"}]), out / "steps", fmt)
    write_card(out, two_step_facts(weights, 25, path.name, fmt))
    front, _ = read_card(out / "README.md")
    loaded = datasets.load_dataset(str(out), split="train", cache_dir=str(tmp_path / "hf"))
    assert list(loaded) == made_rows()
    if fmt != "jsonl":
        assert [f["name"] for f in front["dataset_info"]["features"]] == list(made_rows()[0])
        written = datasets.load_from_disk(str(path)) if fmt == "hf" else None
        expected = (
            written.features
            if written
            else datasets.Dataset.from_parquet(str(path), cache_dir=str(tmp_path / "hf")).features
        )
        assert loaded.features == expected


def test_a_readme_lmpress_did_not_write_is_left_alone(tmp_path, weights):
    out = tmp_path / "out"
    out.mkdir()
    mine = "# My dataset\n\nNotes I wrote by hand.\n"
    (out / "README.md").write_text(mine)
    facts = two_step_facts(weights, 26, "dataset.jsonl", "jsonl")
    assert write_card(out, facts) == out / "DATASET_CARD.md"
    assert write_card(out, facts) == out / "DATASET_CARD.md"  # ours: rewritten in place
    assert (out / "README.md").read_text() == mine
    assert "| ask | generate |" in (out / "DATASET_CARD.md").read_text()

    (out / "DATASET_CARD.md").write_text("mine too\n")
    assert write_card(out, facts) is None
    assert (out / "DATASET_CARD.md").read_text() == "mine too\n"


def test_a_card_lmpress_wrote_is_replaced(tmp_path, weights):
    out = tmp_path / "out"
    write_card(out, two_step_facts(weights, 26, "dataset.jsonl", "jsonl"))
    assert write_card(out, two_step_facts(weights, 1500, "dataset.jsonl", "jsonl")) == (
        out / "README.md"
    )
    front, _ = read_card(out / "README.md")
    assert front["size_categories"] == ["1K<n<10K"]
    assert not (out / "DATASET_CARD.md").exists()
