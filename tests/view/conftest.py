"""What the viewer's tests share: real outputs made by real `lmpress batch` runs on the tiny
GGUF model (LLAMACPP starts without NATIVE's torch import), and a client on the viewer's app.

The input has rows that fail alone, as tests/batch/test_job.py makes them: a message with an
unknown role (invalid_row, refused before the model) and a prompt longer than the context
(context_length_exceeded); and rows whose text is HTML and a script, which the viewer must hand
back as text.
"""

from __future__ import annotations

import json
from pathlib import Path

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
