"""The outputs the viewer reads beyond a batch job's (lmpress/view/layout.py, sources.py): a
pipeline's folder (the dataset, each step's rows, the rejects, the card's counts) and an eval's
results folder (each task's samples and metrics), both made by the real commands, with their
`--report`."""

from __future__ import annotations

import json
import re

import pytest

from tests.conftest import REPO, run_lmpress
from tests.view.conftest import all_rows, client, read_rows, write_rows

PIPELINE = """
models:
  w: {engine: LLAMACPP, model: "tiny-gguf:llama"}
steps:
  - {name: tip, kind: generate, model: w, prompt: "A tip for {{ task }}",
     generation: {max_new_tokens: 6, temperature: 0}}
  - {name: long, kind: filter, expr: "task | length > 22"}
  - {name: grade, kind: judge, model: w, judge: single, rubric: "Is it useful?",
     columns: {task: task, tip: tip}, scale: [1, 5], generation: {max_new_tokens: 12}}
"""
TASKS = ["learning to touch-type", "keeping houseplants alive", "packing for a weekend hike",
         "baking bread", "fixing a bicycle puncture"]  # fmt: skip


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    """A pipeline whose filter drops the short tasks and whose judge (a tiny random model,
    which writes no score) fails every row it gets: every kind of reject."""
    folder = tmp_path_factory.mktemp("pipeline")
    (folder / "p.yaml").write_text(PIPELINE)
    source = write_rows(folder / "tasks.jsonl", [{"task": t} for t in TASKS])
    out = folder / "out"
    run = run_lmpress(
        "run", str(folder / "p.yaml"), "-i", str(source), "-o", str(out), "--keep-steps",
        "--cache", "off", "--report",
    )  # fmt: skip
    assert run.returncode == 1, run.stderr  # the judge's rows failed
    return out


def test_a_pipeline_folder_shows_its_steps_and_rejects(pipeline):
    rejects = read_rows(pipeline / "rejects.jsonl")
    dropped = [r for r in rejects if "dropped" in r]
    failed = [r for r in rejects if "failed" in r]
    assert dropped and failed  # the filter dropped some, the judge failed the others
    viewer = client(pipeline)
    (source,) = viewer.get("/api/sources").json()["sources"]
    assert source["kind"] == "pipeline"
    assert [p["name"] for p in source["parts"]] == ["tip", "long", "grade"]
    overview = viewer.get("/api/overview").json()
    assert overview["rows"]["ok"] == len(read_rows(pipeline / "dataset.jsonl")) == 0
    assert overview["rows"]["failed"] == len(failed)
    assert overview["rows"]["dropped"] == len(dropped)
    assert {(e["kind"], e["count"]) for e in overview["errors_by_kind"]} == {
        ("dropped at long", len(dropped)),
        ("failed at grade", len(failed)),
    }
    parts = {p["name"]: p for p in overview["by_part"]}
    assert parts["tip"]["ok"] == len(TASKS) and parts["tip"]["tokens"] > 0  # the card's
    assert parts["grade"]["failed"] == len(failed)
    tips = all_rows(viewer, step="tip")
    assert [
        json.loads(viewer.get("/api/row", params={"n": r["n"]}).json()["raw"]) for r in tips
    ] == (read_rows(pipeline / "steps" / "tip.jsonl"))
    dropped_rows = all_rows(viewer, status="dropped")
    assert {r["id"] for r in dropped_rows} == {r["key"] for r in dropped}
    one = viewer.get("/api/row", params={"n": dropped_rows[0]["n"]}).json()
    assert one["error"]["kind"] == "dropped at long" and one["response"]["task"] in TASKS


def test_a_pipeline_report(pipeline):
    report = (pipeline / "report.html").read_text()
    assert "failed at grade" in report and "<script" not in report


@pytest.fixture(scope="module")
def evaluation(tmp_path_factory):
    out = tmp_path_factory.mktemp("eval") / "results"
    run = run_lmpress(
        "eval", "--engine", "LLAMACPP", "--model.model_name", "tiny-gguf:llama",
        "--tasks", "lmpress_mc,lmpress_capitals", "--include-path", str(REPO / "tests/eval_tasks"),
        "--limit", "3", "-o", str(out), "--report",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    return out


def test_an_eval_folder_shows_each_tasks_samples_and_metrics(evaluation):
    (results,) = evaluation.glob("*/results_*.json")
    metrics = json.loads(results.read_text())["results"]
    viewer = client(evaluation)
    (source,) = viewer.get("/api/sources").json()["sources"]
    assert source["kind"] == "eval"
    assert source["parts"] == [
        {"name": "lmpress_capitals", "rows": 3},
        {"name": "lmpress_mc", "rows": 3},
    ]
    parts = {p["name"]: p for p in viewer.get("/api/overview").json()["by_part"]}
    assert parts["lmpress_mc"]["metrics"]["acc"] == metrics["lmpress_mc"]["acc,none"]
    (samples,) = evaluation.glob("*/samples_lmpress_capitals_*.jsonl")
    first = read_rows(samples)[0]
    capitals = all_rows(viewer, step="lmpress_capitals")
    row = viewer.get("/api/row", params={"n": capitals[0]["n"]}).json()
    assert row["id"] == f"lmpress_capitals/{first['doc_id']}"
    assert row["messages"] == [
        {"role": "user", "content": first["arguments"]["gen_args_0"]["arg_0"]}
    ]
    assert row["reply"]["text"] == first["filtered_resps"][0]
    assert row["judge"]["score"] == first["exact_match"]
    report = (evaluation / "report.html").read_text()
    assert re.search(r"<th>acc</th>", report) and "lmpress_mc" in report


GENERATE = """
models:
  w: {engine: LLAMACPP, model: "tiny-gguf:llama"}
steps:
  - {name: tip, kind: generate, model: w, prompt: "A tip for {{ task }}",
     generation: {max_new_tokens: 6, temperature: 0}}
"""


def test_a_pipelines_hugging_face_dataset_opens_with_its_folder_and_alone(tmp_path):
    """--format hf writes OUT/dataset as `save_to_disk` does: Arrow files the viewer reads
    by their record batches; the rows are those `datasets.load_from_disk` gives."""
    datasets = pytest.importorskip("datasets")
    (tmp_path / "p.yaml").write_text(GENERATE)
    source = write_rows(tmp_path / "tasks.jsonl", [{"task": t} for t in TASKS])
    out = tmp_path / "out"
    run = run_lmpress(
        "run", str(tmp_path / "p.yaml"), "-i", str(source), "-o", str(out), "--format", "hf",
        "--cache", "off",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    expected = datasets.load_from_disk(str(out / "dataset")).to_list()
    assert [row["task"] for row in expected] == TASKS
    for given in (out, out / "dataset"):
        viewer = client(given)
        rows = all_rows(viewer, step="dataset")
        assert len(rows) == len(TASKS)
        shown = [viewer.get("/api/row", params={"n": r["n"]}).json()["raw"] for r in rows]
        assert [json.loads(raw) for raw in shown] == expected
        assert viewer.get("/api/overview").json()["rows"]["ok"] == len(TASKS)
        hits = all_rows(viewer, q="HOUSEPLANTS")
        assert [json.loads(viewer.get("/api/row", params={"n": r["n"]}).json()["raw"])["task"]
                for r in hits] == ["keeping houseplants alive"]  # fmt: skip


def test_a_dataset_of_several_arrow_files_and_batches_is_read_at_any_row(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = [{"id": f"r{i}", "n": i, "text": f"row number {i}"} for i in range(2500)]
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "d"), num_shards=3)
    assert len(list((tmp_path / "d").glob("*.arrow"))) == 3
    viewer = client(tmp_path / "d")
    assert viewer.get("/api/overview").json()["rows"]["ok"] == 2500
    for n in (0, 999, 1000, 1700, 2499):
        assert json.loads(viewer.get("/api/row", params={"n": n}).json()["raw"]) == rows[n]
    assert viewer.get("/api/rows", params={"q": "number 1713"}).json()["total"] == 1
