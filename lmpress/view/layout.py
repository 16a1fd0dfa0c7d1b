"""Which files make up what the user pointed `lmpress view` at, found from the names lmpress
gives them (`data.resume.JobFiles`, `batch.model_parts`, `pipeline/job.py`, lm-eval's):

- a batch output OUT (JSONL or OpenAI Batch lines, plain or compressed: index.py reads a
  compressed one through a plain copy): OUT, then OUT.errors.jsonl;
- a Parquet output: OUT.parquet once written, else its journal (the job still runs);
- OUT.errors.jsonl alone;
- a --models output (OUT.models/ beside it): each model's part and its errors, in model order
  (the parts are the record the merged OUT is copied from, and exist while the job runs);
- a pipeline's folder: the dataset (JSONL, Parquet or a `save_to_disk` folder of Arrow
  files, which also opens alone), the rejects, and each step's rows (--keep-steps);
- an eval's folder (or its results or samples file): each task's samples of the latest run.

Found again each time the viewer looks, so a job that started, finished or was replaced since
is seen as it is now. Nothing here writes.
"""

from __future__ import annotations

import json
import os
import re
import socket
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from lmpress.batch.model_parts import part_suffix
from lmpress.data.file_formats import FileFormat
from lmpress.data.resume import JobFiles
from lmpress.data.targets import open_read
from lmpress.view.parquet import is_arrow_dataset
from lmpress.view.records import RowKind
from lmpress.vocabulary.errors import InputError

WHAT = (
    "give a batch output (JSONL, compressed or not, or Parquet), its .errors.jsonl, a "
    "pipeline's output folder or its Hugging Face dataset folder, a --models output or an "
    "eval's results folder"
)
PARQUET_SUFFIXES = (".parquet", ".pq")
DATASET = "dataset"  # the part a pipeline's dataset rows are shown under


class SourceKind(str, Enum):
    BATCH = "batch"
    ERRORS = "errors"
    PIPELINE = "pipeline"
    MODELS = "models"
    EVAL = "eval"
    OPENAI_BATCH = "openai_batch"


@dataclass(frozen=True)
class Segment:
    """One file of a source: its rows' kind, and the part (step, model or task) it is."""

    path: Path
    kind: RowKind
    part: str | None = None
    parquet: bool = False
    arrow: bool = False  # a save_to_disk folder of Arrow files (parquet.ArrowIndex)
    step: str | None = None
    model: str | None = None
    id_column: str | None = None  # the job's --id-column: its rows' ids


@dataclass
class Layout:
    kind: SourceKind
    segments: list[Segment]
    summary: Path | None = None  # OUT.summary.json
    locks: list[Path] = field(default_factory=list)  # held while a job writes
    card: Path | None = None  # a pipeline's README.md
    results: Path | None = None  # an eval's results JSON
    steps: list[str] = field(default_factory=list)  # a pipeline's steps, in order


def find(given: str | Path) -> Layout:
    """What `given` is made of, or an InputError in one line saying why it is nothing the
    viewer reads."""
    path = Path(given).expanduser()
    if path.is_dir():
        if (path / ".lmpress").is_dir() or (path / "rejects.jsonl").exists():
            return _pipeline(path)
        if _eval_files(path):
            return _eval(path)
        if is_arrow_dataset(path):  # a pipeline's --format hf dataset, opened alone
            segment = Segment(path, RowKind.PIPELINE, DATASET, True, step=DATASET, arrow=True)
            return Layout(SourceKind.PIPELINE, [segment], steps=[DATASET])
        raise InputError(f"view: {given}: a folder lmpress did not write; {WHAT}")
    name = path.name
    if name.startswith(("results_", "samples_")) and path.exists():
        return _eval(path.parent, path)
    if name.endswith(".errors.jsonl"):
        _exists(path, given)
        return Layout(SourceKind.ERRORS, [Segment(path, RowKind.ERRORS)])
    parquet = path.suffix in PARQUET_SUFFIXES
    files = JobFiles.found(path, FileFormat.PARQUET if parquet else FileFormat.JSONL)
    folder = path.with_name(f"{name}.models")
    id_column = _id_column(files)
    if folder.is_dir():
        return _models(path, files, folder, parquet, id_column)
    # A job that has just started holds its lock before it writes a row: its output is on
    # its way, and is shown as it comes.
    if not (path.exists() or files.fingerprint.exists() or files.lock.exists()):
        _exists(path, given)
    segments = _job_segments(files, parquet, id_column=id_column)
    return Layout(_batch_kind(path), segments, files.summary, [files.lock])


def _exists(path: Path, given: str | Path) -> None:
    if not path.exists():
        raise InputError(f"view: {given}: no such file; {WHAT}")


def _id_column(files: JobFiles) -> str | None:
    """The column the job took its rows' ids from (`--id-column`), as its fingerprint says."""
    found = read_json(files.fingerprint)
    settings = found.get("settings") if isinstance(found, dict) else None
    rows = settings.get("rows") if isinstance(settings, dict) else None
    column = rows.get("id_column") if isinstance(rows, dict) else None
    return column if isinstance(column, str) else None


def _job_segments(
    files: JobFiles, parquet: bool, part: str | None = None, id_column: str | None = None
) -> list[Segment]:
    """A batch job's rows: its output then its errors (a Parquet output holds its failures:
    the Parquet file once written, its journal while the job runs)."""
    if parquet:
        journal = files.journal
        if (
            journal is not None
            and journal.exists()
            and (not files.output.exists() or holder(files.lock) is not None)
        ):
            return [Segment(journal, RowKind.JOURNAL, part, model=part, id_column=id_column)]
        return [
            Segment(
                files.output, RowKind.PARQUET, part, parquet=True, model=part, id_column=id_column
            )
        ]
    kind = RowKind.OPENAI if _openai_lines(files.output) else RowKind.BATCH
    return [
        Segment(files.output, kind, part, model=part, id_column=id_column),
        Segment(files.errors, RowKind.ERRORS, part, model=part, id_column=id_column),
    ]


def _batch_kind(path: Path) -> SourceKind:
    return SourceKind.OPENAI_BATCH if _openai_lines(path) else SourceKind.BATCH


def _openai_lines(path: Path) -> bool:
    """Whether the file's first line is an OpenAI Batch output line."""
    try:
        with open_read(path) as handle:
            first = handle.readline(1 << 16)
        line = json.loads(first.decode("utf-8", "replace"))
    except (OSError, EOFError, ValueError):  # (EOFError: a compressed file cut short)
        return False
    return (
        isinstance(line, dict)
        and "custom_id" in line
        and "response" in line
        and ("messages" not in line)
    )


def _models(
    path: Path, files: JobFiles, folder: Path, parquet: bool, id_column: str | None
) -> Layout:
    """A --models output: its parts, labelled as the summary names them (else by file)."""
    labels: dict[str, str] = {}
    summary = read_json(files.summary)
    for model in summary.get("models", []) if isinstance(summary, dict) else []:
        if isinstance(model, dict) and isinstance(model.get("output"), str):
            labels[Path(model["output"]).name] = str(model.get("model"))
    suffix = part_suffix(path)
    segments: list[Segment] = []
    errors: list[Segment] = []
    locks = [files.lock]
    for part in sorted(folder.glob(f"[0-9][0-9]-*{suffix}")):
        if part.name.endswith((".errors.jsonl", ".journal.jsonl")):
            continue
        label = labels.get(part.name) or re.sub(r"^\d+-", "", part.name.removesuffix(suffix))
        found = JobFiles.found(part, FileFormat.PARQUET if parquet else FileFormat.JSONL)
        own = _job_segments(found, parquet, label, id_column)
        segments += own[:1]
        errors += own[1:]
        locks.append(found.lock)
    return Layout(SourceKind.MODELS, segments + errors, files.summary, locks)


def _pipeline(folder: Path) -> Layout:
    steps = _card_steps(folder / "README.md")
    segments = []
    for name in ("dataset.jsonl", "dataset.parquet"):
        if (folder / name).exists():
            parquet = name.endswith(".parquet")
            segments.append(
                Segment(folder / name, RowKind.PIPELINE, DATASET, parquet, step=DATASET)
            )
    if is_arrow_dataset(folder / DATASET):  # --format hf
        segments.append(
            Segment(folder / DATASET, RowKind.PIPELINE, DATASET, True, step=DATASET, arrow=True)
        )
    segments.append(Segment(folder / "rejects.jsonl", RowKind.REJECTS))
    kept = {p.stem: p for p in (folder / "steps").glob("*.jsonl")}
    for name in [*[s for s in steps if s in kept], *sorted(set(kept) - set(steps))]:
        segments.append(Segment(kept[name], RowKind.PIPELINE, name, step=name))
    card = folder / "README.md"
    return Layout(
        SourceKind.PIPELINE,
        segments,
        locks=[folder / ".lmpress" / "lock"],
        card=card if card.exists() else None,
        steps=steps or sorted(kept),
    )


def _card_steps(card: Path) -> list[str]:
    return [row["step"] for row in card_steps(card)]


def card_steps(card: Path | None) -> list[dict[str, str]]:
    """The dataset card's table of steps (pipeline/card.py writes it), one dict a step."""
    try:
        text = card.read_text(encoding="utf-8") if card is not None else ""
    except OSError:
        return []
    lines = text.split("## Steps", 1)[-1].splitlines() if "## Steps" in text else []
    table = [line for line in lines if line.startswith("|")]
    if len(table) < 3:
        return []
    head = [cell.strip() for cell in table[0].strip("|").split("|")]
    rows = []
    for line in table[2:]:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if cells and not cells[0].startswith("**"):
            rows.append(dict(zip(head, cells, strict=False)))
    return rows


def _eval(folder: Path, chosen: Path | None = None) -> Layout:
    """An eval's samples, of the run `chosen` names (a results or samples file) or the
    latest run in the folder."""
    stamp = re.compile(r"_(\d{4}-\d{2}-\d{2}T[\d.-]+)\.jsonl?$")
    files = _eval_files(folder)
    runs = sorted({m.group(1) for p in files if (m := stamp.search(p.name))})
    picked = stamp.search(chosen.name) if chosen is not None else None
    run = picked.group(1) if picked else (runs[-1] if runs else "")
    results = next((p for p in files if p.name == f"results_{run}.json"), None)
    segments = []
    for sample in sorted(p for p in files if p.name.startswith("samples_") and run in p.name):
        task = sample.name.removeprefix("samples_").removesuffix(f"_{run}.jsonl")
        segments.append(Segment(sample, RowKind.EVAL, task, step=task))
    return Layout(SourceKind.EVAL, segments, results=results)


def _eval_files(folder: Path) -> list[Path]:
    """lm-eval's results and samples in a folder or its model's folder inside it (lm-eval
    writes OUT/<model>/results_<date>.json)."""
    return [
        path
        for pattern in (
            "results_*.json",
            "samples_*.jsonl",
            "*/results_*.json",
            "*/samples_*.jsonl",
        )
        for path in folder.glob(pattern)
    ]


def read_json(path: Path | None) -> Any:
    """A JSON file's content; None where it is missing or not JSON (being replaced)."""
    if path is None:
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def holder(lock: Path) -> dict[str, Any] | None:
    """The record of the job holding a lock (data/output_lock.py writes it), if that job still
    runs on this machine; read only: the viewer never takes the lock."""
    try:
        record = json.loads(lock.read_bytes() or b"null")
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or not isinstance(record.get("pid"), int):
        return None
    if record.get("host") != socket.gethostname():
        return None
    try:
        os.kill(record["pid"], 0)
    except ProcessLookupError:
        return None  # killed: the kernel dropped its lock, the file still names it
    except PermissionError:
        pass  # another user's process: alive
    return record
