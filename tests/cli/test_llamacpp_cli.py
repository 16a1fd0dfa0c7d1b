"""`lmpress infer` and `lmpress batch` on the LLAMACPP engine, through the real command, on tiny
GGUF files of both tokenizer families; `infer`, `chat` and `batch` on the bundled SmolLM2
recipe where a row needs more than an equal share of its context."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from lmpress.builtin_models.tiny_gguf import tiny_gguf
from lmpress.configs import load_config
from lmpress.data.row_shapes import parse_row, row_id
from lmpress.engines.registry import create_engine
from lmpress.vocabulary.types import GenerationParams, Message, Request
from tests.chat.test_chat import STATUS
from tests.cli.test_cli import mixed_rows
from tests.conftest import run_lmpress

TOKENIZERS = ["llama", "gpt2"]


def expected_replies(path: str, requests: list[Request], **overrides) -> list[str]:
    """What the engine answers in-process, to compare with what the command prints."""
    config = load_config(overrides={"engine": "LLAMACPP", "model.model_name": path, **overrides})
    engine = create_engine(config)
    try:
        return [r.text for r in engine.generate(requests)]
    finally:
        asyncio.run(engine.aclose())


def as_printed(text: str) -> str:
    """Text read back from a pipe in text mode: any line ending becomes '\\n'."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


@pytest.mark.parametrize("tokenizer", TOKENIZERS)
def test_infer_prints_the_reply(tokenizer):
    path = str(tiny_gguf(tokenizer))
    run = run_lmpress(
        "infer", "--engine", "LLAMACPP", "--model.model_name", path,
        "--generation.max_new_tokens", "12", "Why is the sky blue?",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    params = GenerationParams(max_new_tokens=12)
    request = Request("prompt", [Message("user", "Why is the sky blue?")], params)
    [reply] = expected_replies(path, [request])
    assert reply.strip()
    assert run.stdout == as_printed(reply) + "\n"


@pytest.mark.parametrize("tokenizer", TOKENIZERS)
def test_batch_writes_every_row_and_reports_the_one_too_long(tmp_path, tokenizer):

    path = str(tiny_gguf(tokenizer))
    rows = mixed_rows(12)
    rows.insert(5, {"id": "too-long", "prompt": "word " * 400})
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = tmp_path / "out.jsonl"
    run = run_lmpress(
        "batch", "--engine", "LLAMACPP", "--model.model_name", path, "-i", str(src),
        "-o", str(out), "--model.model_kwargs.n_ctx", "256", "--generation.batch_size", "4",
        "--generation.max_new_tokens", "10",
    )  # fmt: skip
    assert run.returncode == 1, run.stderr  # one row failed, the job went on
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(written) == 12
    assert all(r["response"]["engine"] == "LLAMACPP" for r in written)
    errors = (tmp_path / "out.jsonl.errors.jsonl").read_text()
    assert "too-long" in errors and "context_length_exceeded" in errors

    # Each reply is what the engine gives for that row on its own.
    parsed = [parse_row(row, i) for i, row in enumerate(rows, 1) if row.get("id") != "too-long"]
    params = GenerationParams(max_new_tokens=10)
    expected = expected_replies(
        path, [p.request(params) for p in parsed], **{"model.model_kwargs": {"n_ctx": 256}}
    )
    replies = {row_id(r, 0): r["response"]["text"] for r in written}
    assert replies == {p.id: text for p, text in zip(parsed, expected, strict=True)}


def test_bundled_recipe_runs():
    run = run_lmpress("infer", "-c", "tiny-llamacpp", "--generation.max_new_tokens", "6", "hi")
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip()


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--model.model_name", "./no/such.gguf"], "'./no/such.gguf' does not exist"),
        (["--model.model_name", "pyproject.toml"], "'pyproject.toml' is not a GGUF file"),
        (
            ["--model.model_name", "tiny-gguf:llama", "--model.model_kwargs.n_ctxx", "512"],
            "model.model_kwargs.n_ctxx: not a llama-cpp-python Llama parameter; "
            "did you mean 'n_ctx'?",
        ),
        (
            [
                "--model.model_name",
                "tiny-gguf:llama",
                "--generation.num_beams",
                "2",
                "--generation.temperature",
                "0.7",
            ],
            "generation.temperature does not go with generation.num_beams 2",
        ),
    ],
)
def test_bad_input_is_one_line(args, expected):
    from tests.conftest import REPO

    run = run_lmpress("infer", "--engine", "LLAMACPP", *args, "hi", cwd=REPO)
    assert run.returncode == 2, run.stderr
    assert expected in run.stderr
    assert "Traceback" not in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1


def oumi_gguf_run(model_name: str, filename: str, env: dict | None = None):
    return run_lmpress(
        "infer", "--engine", "LLAMACPP", "--model.model_name", model_name,
        "--model.model_kwargs.filename", filename,
        "--generation.max_new_tokens", "8", "Why is the sky blue?", env=env,
    )  # fmt: skip


def test_oumi_form_directory_and_filename_loads_the_file():
    path = tiny_gguf("llama")
    run = oumi_gguf_run(str(path.parent), path.name)
    assert run.returncode == 0, run.stderr
    params = GenerationParams(max_new_tokens=8)
    request = Request("prompt", [Message("user", "Why is the sky blue?")], params)
    assert run.stdout == as_printed(expected_replies(str(path), [request])[0]) + "\n"


def test_oumi_form_hub_repo_and_filename_reads_the_hub_cache(tmp_path):
    path = tiny_gguf("llama")
    snapshot = tmp_path / "models--someone--tiny-GGUF" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "tiny.gguf").write_bytes(path.read_bytes())
    (tmp_path / "models--someone--tiny-GGUF" / "refs").mkdir()
    (tmp_path / "models--someone--tiny-GGUF" / "refs" / "main").write_text("abc123")
    env = {"HF_HUB_CACHE": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    run = oumi_gguf_run("someone/tiny-GGUF", "tiny.gguf", env)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip()
    missing = oumi_gguf_run("someone/tiny-GGUF", "other.gguf", env)
    assert missing.returncode != 0
    assert "'other.gguf' of 'someone/tiny-GGUF' is neither in a local directory" in missing.stderr
    assert "downloads nothing" in missing.stderr


def test_random_weights_are_refused_on_llamacpp():
    run = run_lmpress(
        "infer", "--engine", "LLAMACPP", "--model.model_name", str(tiny_gguf("llama")),
        "--model.load_pretrained_weights", "false", "hi",
    )  # fmt: skip
    assert run.returncode != 0
    assert "LLAMACPP reads its weights from the GGUF file" in run.stderr


# --- the bundled SmolLM2 recipe: the whole context for one conversation ------------------------
#
# The recipe's batch_size 8 sequences share one KV cache of n_ctx cells (kv_unified). These tests
# run it with n_ctx 2,048, where a split cache would give each sequence 256 cells: a prompt or
# conversation of 500+ tokens is one the split cache refused, and llama.cpp reads it in about a
# tenth of the time the recipe's full 8,192 would take on these CPUs (prompt time grows faster
# than the prompt: attention is quadratic in it).

CITIES = ["Lisbon", "Denver", "Krakow", "Osaka", "Quito", "Tunis", "Perth"]
SMALL_CONTEXT = ["-c", "smollm2", "--model.model_kwargs.n_ctx", "2048"]
SPLIT_PART = 2048 // 8  # what each of the recipe's 8 sequences had of the cache, split


def long_report(days: int, start: int = 1) -> str:
    """A log to summarise, about 19 SmolLM2 tokens a day: `days=40` is about 800."""
    lines = [
        f"Day {d}: the team in {CITIES[d % 7]} packed {40 + d * 7 % 90} boxes of tea."
        for d in range(start, start + days)
    ]
    return "Here is our packing log.\n" + "\n".join(lines) + "\nWhich city packed the most boxes?"


@pytest.mark.slow
def test_infer_answers_a_prompt_longer_than_a_split_cache_part_on_the_bundled_recipe():
    """One prompt may use the shared cache whole: split eight ways, a sequence had a part of
    256 cells, and this prompt of some 600 tokens was refused."""
    run = run_lmpress(
        "infer", *SMALL_CONTEXT, "--generation.max_new_tokens", "16", long_report(30)
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip()
    assert "error" not in run.stderr


@pytest.mark.slow
def test_a_piped_chat_answers_every_message_past_a_split_cache_part():
    """Three turns, each a log of some 200 tokens with a short reply, are some 700 tokens of
    conversation: each turn is answered (the second went over a 256-cell part of a split
    cache, and the third over two)."""
    messages = [long_report(10, start=1 + 10 * turn).replace("\n", " ") for turn in range(3)]
    run = run_lmpress(
        "chat", *SMALL_CONTEXT, "--generation.max_new_tokens", "16",
        input="".join(m + "\n" for m in messages),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    prompts = [int(m.group(2)) for m in re.finditer(STATUS, run.stderr)]
    assert len(prompts) == 3, run.stderr
    assert prompts[-1] > 2 * SPLIT_PART  # the last turn read the whole conversation before it
    assert "error" not in run.stderr


@pytest.mark.slow
def test_batch_with_one_long_row_among_short_ones_writes_every_row(tmp_path):
    rows = [{"id": f"q{i}", "prompt": f"What is the capital of {c}?"} for i, c in enumerate(
        ["France", "Japan", "Spain", "Peru", "Italy", "Chile", "Kenya", "Egypt", "Cuba"]
    )]  # fmt: skip
    rows.insert(4, {"id": "long", "prompt": long_report(30)})
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("".join(json.dumps(row) + "\n" for row in rows))
    run = run_lmpress(
        "batch", *SMALL_CONTEXT, "-i", str(src), "-o", str(out),
        "--generation.max_new_tokens", "16",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    written = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert sorted(written) == sorted(row["id"] for row in rows)
    assert all(r["response"]["text"].strip() for r in written.values())
    assert written["long"]["response"]["usage"]["prompt_tokens"] > 2 * SPLIT_PART
