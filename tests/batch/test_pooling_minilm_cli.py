"""What issue 34 promised a user of real weights: `lmpress batch --task embed` on MiniLM (NATIVE)
writes sentence-transformers' own vectors, to JSONL and to Parquet; a job killed with kill -9
resumes with every row once; and `lmpress serve`, with no --task, answers the openai client with
the same vectors and turns chat away. Everything goes through the real commands, each in a process
of its own."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import openai
import pyarrow.parquet as pq
import pytest

from lmpress.builtin_models.packaged import resolve_packaged_name
from tests.conftest import REPO, lmpress_process, run_lmpress
from tests.growing_files import whole_lines
from tests.serve.conftest import Served

pytestmark = pytest.mark.timeout(300)

NATIVE_MINILM = ["--engine", "NATIVE", "--model.model_name", "minilm", "--task", "embed"]
# Mixed lengths, an empty text and one past MiniLM's 256-token limit among them.
TEXTS = [
    "",
    "The sky is blue.",
    "Grass is green, and in spring it grows fast.",
    "Snow is white. " * 3,
    "A much longer paragraph about the sea, the wind and the boats that sail on it. " * 40,
    *(f"Sentence number {i} says something about item {i * 7}." for i in range(35)),
]


@pytest.fixture(scope="module")
def expected() -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(resolve_packaged_name("minilm"), device="cpu")
    return model.encode(TEXTS, batch_size=32, convert_to_numpy=True)


def cosines(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    return (got * want).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))


def write_rows(path: Path) -> Path:
    rows = [{"id": f"t{i}", "input": text} for i, text in enumerate(TEXTS)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def by_id(rows: list[dict], key: str = "embedding") -> np.ndarray:
    found = {row["id"]: row[key] for row in rows}
    return np.array([found[f"t{i}"] for i in range(len(TEXTS))], dtype=np.float32)


def test_batch_writes_sentence_transformers_vectors_to_jsonl_and_parquet(tmp_path, expected):
    src = write_rows(tmp_path / "in.jsonl")
    run = run_lmpress("batch", "-i", str(src), "-o", str(tmp_path / "out.jsonl"), *NATIVE_MINILM)
    assert run.returncode == 0, run.stderr[-2000:]
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert len(rows) == len(TEXTS)
    assert cosines(by_id(rows), expected).min() >= 0.9999
    long_row = next(row for row in rows if row["id"] == "t4")
    assert long_row["response"]["truncated"] is True

    run = run_lmpress(
        "batch", "-i", str(src), "-o", str(tmp_path / "out.parquet"), *NATIVE_MINILM
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    table = pq.read_table(tmp_path / "out.parquet")
    assert str(table.schema.field("embedding").type) == "fixed_size_list<element: float>[384]"
    assert cosines(by_id(table.to_pylist()), expected).min() >= 0.9999


def test_kill_9_mid_job_then_resume_writes_every_row_once(tmp_path):
    many = [
        {"id": f"r{i}", "input": f"Row {i}: " + "words and more words " * 3} for i in range(400)
    ]
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in many), encoding="utf-8")
    out = tmp_path / "out.jsonl"
    # One text a batch, so the job writes row by row and a kill lands between two rows.
    args = ["batch", "-i", str(src), "-o", str(out), *NATIVE_MINILM, "--generation.batch_size", "1"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = lmpress_process(*args, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the job ended before the kill"
        if len(whole_lines(out)) >= 20:
            break
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = out.read_bytes().count(b"\n")
    assert 20 <= before < len(many)

    # The batch size changes no output, so the rest may run 32 at a time.
    run = run_lmpress(*args[:-1], "32")
    assert run.returncode == 0, run.stderr[-2000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(row["id"] for row in rows) == sorted(r["id"] for r in many)  # each once
    assert all(len(row["embedding"]) == 384 for row in rows)


def test_serve_answers_the_openai_client_with_the_same_vectors(expected):
    # No --task: MiniLM is an embedding model, so serve picks the embed task itself.
    served = Served(["--engine", "NATIVE", "--model.model_name", "minilm",
                     "--serve.served_model_name", "minilm"])  # fmt: skip
    try:
        client = served.client(api_key="unused")
        reply = client.embeddings.create(model="minilm", input=TEXTS, encoding_format="float")
        got = np.array([item.embedding for item in reply.data], dtype=np.float32)
        assert cosines(got, expected).min() >= 0.9999
        # The client's default asks for base64 and decodes it itself.
        decoded = client.embeddings.create(model="minilm", input=TEXTS[1])
        assert np.allclose(decoded.data[0].embedding, got[1], atol=1e-6)
        with pytest.raises(openai.BadRequestError) as chat:
            client.chat.completions.create(
                model="minilm", messages=[{"role": "user", "content": "hi"}]
            )
        assert chat.value.body["message"].startswith(
            "/v1/chat/completions: this server runs the embed task"
        )
    finally:
        served.stop()
