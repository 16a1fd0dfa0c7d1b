"""What the pipeline tests share: a pipeline file written beside its input, run by the real
`lmpress run` against the loopback OpenAI server."""

from __future__ import annotations

import json
from pathlib import Path

from lmpress.data.file_formats import FileFormat
from lmpress.pipeline.export import DATASET_NAMES
from tests.conftest import run_lmpress

DATA = DATASET_NAMES[FileFormat.JSONL]  # the dataset's file in the output directory

KEY_ENV = {"OPENAI_API_KEY": "test-key"}


def remote_model(server) -> str:
    return f"{{engine: OPENAI, model: test-model, api_url: '{server.openai_url}'}}"


def write(tmp: Path, pipeline: str, rows: list[dict]) -> tuple[Path, Path]:
    (tmp / "pipe.yaml").write_text(pipeline)
    (tmp / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp / "pipe.yaml", tmp / "in.jsonl"


def run(tmp: Path, out: str, *more: str):
    return run_lmpress(
        "run", str(tmp / "pipe.yaml"), "-i", str(tmp / "in.jsonl"), "-o", str(tmp / out), *more,
        env=KEY_ENV, cwd=tmp,
    )  # fmt: skip


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]
