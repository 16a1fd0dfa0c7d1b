"""What the viewer's tests share: real outputs made by real `lmpress batch` runs on the tiny
GGUF model (LLAMACPP starts without NATIVE's torch import), and a client on the viewer's app.

The input has rows that fail alone, as tests/batch/test_job.py makes them: a message with an
unknown role (invalid_row, refused before the model) and a prompt longer than the context
(context_length_exceeded); and rows whose text is HTML and a script, which the viewer must hand
back as text.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from lmpress.view.app import Viewer, create_app
from tests.conftest import run_lmpress

# Greedy, 8 new tokens, no response cache: a run's replies are the model's, every time.
GGUF = [
    "--engine", "LLAMACPP", "--model.model_name", "tiny-gguf:llama",
    "--generation.max_new_tokens", "8", "--generation.batch_size", "4", "--cache", "off",
]  # fmt: skip
HOSTILE = "<b>bold</b> <script>alert('row')</script> & <img src=x onerror=alert(1)>"
BAD_ROLE = "<script>alert(1)</script>"


def input_rows(good: int = 10) -> list[dict]:
    rows: list[dict] = [{"id": f"g{i}", "prompt": f"tell me about number {i}"} for i in range(good)]
    rows.insert(3, {"id": "bad-role", "messages": [{"role": BAD_ROLE, "content": "x"}]})
    rows.insert(6, {"id": "too-long", "prompt": "word " * 3000})
    rows.append({"id": "html", "prompt": HOSTILE})
    return rows


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_batch(folder: Path, rows: list[dict], output: str, *extra: str) -> Path:
    """`lmpress batch` on `rows` into folder/output; its rows failing alone exit 1."""
    source = write_rows(folder / f"{output}.in.jsonl", rows)
    out = folder / output
    run = run_lmpress("batch", "-i", str(source), "-o", str(out), *GGUF, *extra)
    assert run.returncode in (0, 1), run.stderr
    return out


def client(*paths: Path | str, api_key: str | None = None) -> TestClient:
    # The address a browser on this machine names (TestClient's own, testserver, is no
    # address of this machine, and a viewer without a key refuses it).
    app = create_app(Viewer([str(p) for p in paths]), api_key)
    return TestClient(app, base_url="http://127.0.0.1:8765")


def all_rows(viewer: TestClient, **params: str) -> list[dict]:
    """Every row /api/rows gives for these filters, a page at a time."""
    rows: list[dict] = []
    while True:
        page = viewer.get("/api/rows", params={**params, "offset": len(rows), "limit": 7})
        assert page.status_code == 200, page.text
        body = page.json()
        rows += body["rows"]
        if not body["rows"] or len(rows) >= body["total"]:
            assert len(rows) == body["total"]
            return rows


# --- an output written by a script, and its facts read behind the page ---------------------------

MODELS = ("tiny:llama", "tiny:qwen")
KINDS = ("context_length_exceeded", "invalid_row", "rate_limited")


def write_output(folder: Path, rows: int, other_model_from: int = 0) -> Path:
    """OUT.jsonl and OUT.errors.jsonl as `lmpress batch` writes them, one row in 40 failed;
    the rows from `other_model_from` on alternate between two models (before it: the first)."""
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / "out.jsonl"
    with open(out, "w") as done, open(folder / "out.jsonl.errors.jsonl", "w") as failed:
        for i in range(rows):
            if i % 40 == 39:
                error = {"kind": KINDS[i % 3], "message": f"row {i} failed"}
                failed.write(json.dumps({"line": i + 1, "id": f"row-{i}", "error": error}) + "\n")
                continue
            model = MODELS[i % 2] if i >= other_model_from else MODELS[0]
            text = f"reply {i}" + (" zanzibar" if i % 100 == 0 else "")
            response = {
                "text": text,
                "finish_reason": "length" if i % 5 == 0 else "stop",
                "usage": {"prompt_tokens": 20 + i % 37, "completion_tokens": 12 + i % 30},
                "model": model,
                "latency_s": round(0.05 + (i % 97) / 100, 4),
                **({"cached": True} if i % 50 == 0 else {}),
            }
            row = {"id": f"row-{i}", "prompt": f"question {i}", "response": response}
            done.write(json.dumps(row) + "\n")
    return out


class FactsGate:
    """Holds the thread that reads a file's facts after its first block (lmpress/view/index.py
    reads them in blocks of BLOCK_ROWS, behind the page), until `open()`: a test sees a file
    whose facts are part read, for as long as it looks."""

    def __init__(self, monkeypatch, path: Path):
        from lmpress.view import index as index_module

        self.path, self.blocks = path, 0
        self.held = threading.Event()  # the second block waits: the first is in the index
        self.opened = threading.Event()
        real = index_module.read_facts

        def gated(where: Path, *args):
            if where == self.path:
                self.blocks += 1
                if self.blocks > 1 and not self.opened.is_set():
                    self.held.set()
                    self.opened.wait(120)
            return real(where, *args)

        monkeypatch.setattr(index_module, "read_facts", gated)

    def hold(self) -> None:
        """Wait until the first block is in and the second is held."""
        assert self.held.wait(60), "the facts thread never came to its second block"

    def open(self) -> None:
        self.opened.set()


@pytest.fixture
def facts_behind(monkeypatch):
    """Facts read behind the page even for a small file (past 100 new rows, in blocks of 500),
    and a gate to hold that reading on a file: `facts_behind(path)`. Gates open at the end."""
    from lmpress.view import index as index_module

    monkeypatch.setattr(index_module, "INLINE_ROWS", 100)
    monkeypatch.setattr(index_module, "BLOCK_ROWS", 500)
    gates: list[FactsGate] = []

    def gate(path: Path) -> FactsGate:
        gates.append(FactsGate(monkeypatch, path))
        return gates[-1]

    yield gate
    for made in gates:
        made.open()
