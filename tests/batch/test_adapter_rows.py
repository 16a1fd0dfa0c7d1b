"""Rows that choose a LoRA adapter, as a user of `lmpress batch` meets them (issue 54): the
`adapter` column and an OpenAI Batch line's `model` choose one of `model.adapters` (any name of
the base model, or none, the base); an unknown name fails that row alone with vLLM's 404 line; a
reply says the adapter that answered; the response cache keys a row on its adapter's content,
and a resumed job refuses an adapter whose files changed. Real weights: SmolLM2 and the two
adapters made offline for it (builtin_models/lora.py), each of which changes the replies."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from lmpress.builtin_models.lora import smollm2_adapters
from tests.conftest import run_lmpress

pytestmark = pytest.mark.timeout(600)

QUESTION = "Name three colours."
BASE = "smollm2:135m-instruct"


def chat(rid: str, **more) -> dict:
    return {"id": rid, "messages": [{"role": "user", "content": QUESTION}], **more}


def line(custom_id: str, model: str) -> dict:
    body = {"model": model, "messages": [{"role": "user", "content": QUESTION}], "max_tokens": 12}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


ROWS = [
    chat("base"),
    chat("a", adapter="lora-a"),
    {"id": "b", "prompt": QUESTION, "adapter": "lora-b"},  # a prompt row takes it too
    {"id": "named-base", "prompt": QUESTION, "adapter": BASE},  # the base, by its name
    {"id": "typo", "prompt": QUESTION, "adapter": "lora-c"},
    {"id": "bad", "prompt": QUESTION, "adapter": 7},
    line("line-a", "lora-a"),
    line("line-x", "gpt-4o-mini"),
]


@pytest.fixture(scope="module")
def adapters(tmp_path_factory) -> dict[str, Path]:
    """The two adapters, copied where a test may change one's weights."""
    root = tmp_path_factory.mktemp("adapters")
    return {
        name: Path(shutil.copytree(path, root / name)) for name, path in smollm2_adapters().items()
    }


def batch(tmp_path: Path, out: str, adapters: dict[str, Path], *more: str):
    src = tmp_path / "in.jsonl"
    if not src.exists():
        src.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    names = [
        arg for name, path in adapters.items() for arg in (f"--model.adapters.{name}", str(path))
    ]
    run = run_lmpress(
        "batch", "-i", str(src), "-o", str(tmp_path / out), "-c", "smollm2", "--engine", "NATIVE",
        "--generation.max_new_tokens", "12", "--cache-dir", str(tmp_path / "cache"), *names, *more,
    )  # fmt: skip
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
    return run


def outputs(path: Path) -> tuple[dict[str, dict], dict[str, dict]]:
    """Output rows and error lines, each by its row's id."""
    rows = [json.loads(text) for text in path.read_text().splitlines()]
    errors = [json.loads(text) for text in Path(f"{path}.errors.jsonl").read_text().splitlines()]
    by_id = {
        row.get("id") if "id" in row and "messages" in row else row["custom_id"]: row
        for row in rows
    }
    return by_id, {error.get("custom_id") or error["id"]: error for error in errors}


def text(row: dict) -> str:
    if "custom_id" in row:
        return row["response"]["body"]["choices"][0]["message"]["content"]
    return row["response"]["text"]


def test_rows_choose_adapters_fail_alone_on_unknown_names_and_cache_by_content(tmp_path, adapters):
    first = batch(tmp_path, "first.jsonl", adapters)
    assert first.returncode == 1, first.stderr[-3000:]  # the failed rows, and only those
    done, failed = outputs(tmp_path / "first.jsonl")
    assert sorted(done) == ["a", "b", "base", "line-a", "named-base"]
    # Each adapter changes the reply; the base by its name is the base; a line naming lora-a
    # gets lora-a's reply, and says so as vLLM does (the adapter's name as the model).
    assert len({text(done[rid]) for rid in ("base", "a", "b")}) == 3
    assert text(done["named-base"]) == text(done["base"])
    assert text(done["line-a"]) == text(done["a"])
    assert done["line-a"]["response"]["body"]["model"] == "lora-a"
    assert done["a"]["response"]["model"] == "lora-a" and done["a"]["adapter"] == "lora-a"
    assert done["b"]["response"]["model"] == "lora-b"
    assert done["base"]["response"]["model"] not in {"lora-a", "lora-b"}
    # An unknown name fails alone with vLLM's 404; a line's as vLLM's error line.
    assert failed["typo"]["error"]["kind"] == "not_found"
    assert failed["typo"]["error"]["status"] == 404
    assert failed["typo"]["error"]["message"].startswith("The model 'lora-c' does not exist")
    assert failed["line-x"]["response"] == {
        "status_code": 404, "request_id": failed["line-x"]["response"]["request_id"], "body": None
    }  # fmt: skip
    assert failed["line-x"]["error"]["code"] == "not_found"
    assert "'gpt-4o-mini' does not exist" in failed["line-x"]["error"]["message"]
    assert failed["bad"]["error"] == {
        "kind": "invalid_row",
        "message": "'adapter' must be a string, the name of one of model.adapters (or null for "
        "the base model), got a number",
    }

    # Run again with a third adapter, lora-c (lora-b's files under a new name), and lora-b's
    # weights changed: the base and lora-a rows are answered as they were, lora-b's generated
    # again, and lora-c's row finds lora-b's old reply, a row being keyed on its adapter's
    # content.
    third = {**adapters, "lora-c": Path(shutil.copytree(adapters["lora-b"], tmp_path / "c"))}
    weights = adapters["lora-b"] / "adapter_model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # one bit of one weight
    weights.write_bytes(bytes(data))
    batch(tmp_path, "again.jsonl", third)
    again, failed = outputs(tmp_path / "again.jsonl")
    hits = {rid for rid, row in again.items() if row.get("cached") or row["response"].get("cached")}
    assert hits == {"base", "named-base", "a", "line-a", "typo"}
    assert {rid: text(again[rid]) for rid in hits - {"typo"}} == {
        rid: text(done[rid]) for rid in hits - {"typo"}
    }
    assert text(again["typo"]) == text(done["b"])
    assert set(failed) == {"bad", "line-x"}

    # The first output was made with lora-b's old weights: resuming it is refused, in a line.
    resumed = batch(tmp_path, "first.jsonl", adapters)
    assert resumed.returncode != 0
    assert "model.adapters.lora-b was" in resumed.stderr
    assert len(resumed.stderr.strip().splitlines()) == 1, resumed.stderr


def test_the_dry_run_counts_unknown_adapters_and_config_show_lists_them(tmp_path, adapters):
    dry = batch(tmp_path, "dry.jsonl", adapters, "--dry-run")
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert "not_found" in dry.stderr and "invalid_row" in dry.stderr
    assert not (tmp_path / "dry.jsonl").exists()
    shown = run_lmpress(
        "config", "show", "-c", "smollm2", "--engine", "NATIVE",
        "--model.adapters.lora-a", str(adapters["lora-a"]),
    )  # fmt: skip
    assert f"  adapters:\n    lora-a: {adapters['lora-a']}\n" in shown.stdout, shown.stderr
