"""One quantized GGUF file through the real CLI on both CPU engines: raw-text rows, chat rows,
and a base model (no chat template) whose chat rows fail alone."""

from __future__ import annotations

import json

import pytest

from lmpress.builtin_models.tiny_gguf import tiny_gguf
from tests.conftest import run_lmpress

ROWS = [
    {"id": "raw-1", "text": "The river ran past the"},
    {"id": "chat-1", "messages": [{"role": "user", "content": "Why is the sky blue?"}]},
    {"id": "raw-2", "text": "Once upon a time"},
    {"id": "chat-2", "prompt": "Name three colours."},
]


ENGINES = ["LLAMACPP", "NATIVE"]


def run_batch(tmp_path, engine: str, model: str):
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    out = tmp_path / f"{engine}.jsonl"
    run = run_lmpress(
        "batch", "--engine", engine, "--model.model_name", model,
        "--generation.max_new_tokens", "8", "-i", str(source), "-o", str(out),
    )  # fmt: skip
    done = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    errors = out.with_name(out.name + ".errors.jsonl")
    failed = [json.loads(line) for line in errors.read_text().splitlines()] if errors.exists() else []  # fmt: skip
    return run, {row["id"]: row for row in done}, {row["id"]: row for row in failed}


@pytest.mark.parametrize("engine", ENGINES)
def test_a_quantized_qwen2_runs_raw_and_chat_rows(tmp_path, engine):
    run, done, failed = run_batch(tmp_path, engine, str(tiny_gguf("qwen2-q4k")))
    assert run.returncode == 0, run.stderr
    assert not failed and set(done) == {"raw-1", "chat-1", "raw-2", "chat-2"}
    assert done["raw-1"]["text"] == "The river ran past the"  # raw rows keep their text
    assert "messages" not in done["raw-1"] and done["raw-1"]["response"]["text"]
    assert done["chat-1"]["messages"][-1]["role"] == "assistant"
    assert all(row["response"]["usage"]["completion_tokens"] > 0 for row in done.values())


@pytest.fixture(scope="module")
def base_model_runs(tmp_path_factory) -> dict:
    """The base model's job on each engine, run once for the tests below (a NATIVE start
    costs seconds of CPU): by engine, the run and its written and failed rows by id."""
    model = str(tiny_gguf("qwen2-q4k-base"))
    return {e: run_batch(tmp_path_factory.mktemp(e), e, model) for e in ENGINES}


@pytest.mark.parametrize("engine", ENGINES)
def test_a_base_model_runs_raw_rows_and_fails_chat_rows_alone(base_model_runs, engine):
    run, done, failed = base_model_runs[engine]
    assert run.returncode == 1  # some rows failed
    assert set(done) == {"raw-1", "raw-2"} and set(failed) == {"chat-1", "chat-2"}
    assert all("model.chat_template" in row["error"]["message"] for row in failed.values())
    assert "Traceback" not in run.stderr


def test_raw_text_gets_no_chat_template_the_same_on_both_engines(base_model_runs):
    """`infer --raw` prints what each engine wrote for the same raw row of the base model's
    job, and `infer` of a chat prompt fails as that job's chat rows did on both engines (infer
    is one front over either engine: LLAMACPP, which starts in a second, shows it)."""
    model = str(tiny_gguf("qwen2-q4k-base"))
    replies = {e: base_model_runs[e][1]["raw-2"]["response"]["text"] for e in ENGINES}
    assert replies["LLAMACPP"] == replies["NATIVE"] != ""
    run = run_lmpress(
        "infer", "--raw", "--engine", "LLAMACPP", "--model.model_name", model,
        "--generation.max_new_tokens", "8", "Once upon a time",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert run.stdout == replies["LLAMACPP"] + "\n"
    chat = run_lmpress("infer", "--engine", "LLAMACPP", "--model.model_name", model, "hello")
    assert chat.returncode == 1 and "model.chat_template" in chat.stderr


def test_raw_and_system_do_not_mix():
    run = run_lmpress("infer", "--raw", "--system", "Be brief.", "-c", "tiny-native", "hi")
    assert run.returncode == 2 and "--raw" in run.stderr
