"""What a new user met in their first hour (issue 13), as they would see it from the shell."""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import os
from pathlib import Path

import pytest
import zstandard

from tests.conftest import run_lmpress, with_plugin

ROWS = "".join(json.dumps({"id": f"r{i}", "prompt": f"hello {i}"}) + "\n" for i in range(5))


@pytest.fixture
def echo(echo_plugin, tmp_path):
    def run(*args: str, **kwargs):
        return run_lmpress(*args, env={**with_plugin(echo_plugin), **kwargs.pop("env", {})},
                           cwd=tmp_path, **kwargs)  # fmt: skip

    return run


@pytest.mark.parametrize("extra", [[], ["--overwrite"]])
@pytest.mark.parametrize("out", ["same.jsonl", "./same.jsonl"])
def test_output_onto_the_input_is_refused_and_the_input_kept(echo, tmp_path, out, extra):
    (tmp_path / "same.jsonl").write_text(ROWS)
    run = echo("batch", "--engine", "ECHO", "-i", "same.jsonl", "-o", out, *extra)
    assert run.returncode == 2
    assert "is the input file (same.jsonl)" in run.stderr
    assert (tmp_path / "same.jsonl").read_text() == ROWS
    assert sorted(p.name for p in tmp_path.iterdir()) == ["same.jsonl"]


def test_dash_output_streams_to_stdout_without_side_files(echo, tmp_path):
    (tmp_path / "in.jsonl").write_text(ROWS)
    run = echo("batch", "--engine", "ECHO", "-i", "in.jsonl", "-o", "-")
    assert run.returncode == 0, run.stderr
    assert sorted(json.loads(line)["id"] for line in run.stdout.splitlines()) == [
        f"r{i}" for i in range(5)
    ]
    assert "rows ok" in run.stderr and "stdout" in run.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]


def test_dev_stdout_is_written_to_never_replaced(echo, tmp_path):
    (tmp_path / "in.jsonl").write_text(ROWS)
    before = os.lstat("/dev/stdout")
    run = echo("batch", "--engine", "ECHO", "-i", "in.jsonl", "-o", "/dev/stdout")
    assert run.returncode == 0, run.stderr
    assert len(run.stdout.splitlines()) == 5
    assert os.lstat("/dev/stdout").st_mode == before.st_mode
    assert not Path("/dev/stdout.summary.json").exists()
    assert not Path("/dev/stdout.fingerprint.json").exists()


@pytest.mark.parametrize("args", [[], ["bacth"]])
def test_usage_errors_exit_2_not_internal_error(echo, args):
    run = echo(*args)
    assert run.returncode == 2
    assert "internal error" not in run.stderr


def test_a_byte_order_mark_is_read(echo, tmp_path):
    (tmp_path / "in.jsonl").write_bytes(b"\xef\xbb\xbf" + ROWS.encode())
    run = echo("batch", "--engine", "ECHO", "-i", "in.jsonl", "-o", "out.jsonl")
    assert run.returncode == 0, run.stderr
    assert len((tmp_path / "out.jsonl").read_text().splitlines()) == 5


def _zstd_read(path: Path) -> bytes:
    with path.open("rb") as raw:
        return zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True).read()


READERS = {".gz": gzip.decompress, ".bz2": bz2.decompress, ".xz": lzma.decompress}
WRITERS = {".gz": gzip.compress, ".bz2": bz2.compress, ".xz": lzma.compress,
           ".zst": zstandard.ZstdCompressor().compress}  # fmt: skip


@pytest.mark.parametrize("suffix", [".gz", ".zst", ".bz2", ".xz"])
def test_compressed_jsonl_in_and_out(echo, tmp_path, suffix):
    (tmp_path / f"in.jsonl{suffix}").write_bytes(WRITERS[suffix](ROWS.encode()))
    run = echo("batch", "--engine", "ECHO", "-i", f"in.jsonl{suffix}", "-o", f"out.jsonl{suffix}")
    assert run.returncode == 0, run.stderr
    out = tmp_path / f"out.jsonl{suffix}"
    data = _zstd_read(out) if suffix == ".zst" else READERS[suffix](out.read_bytes())
    assert sorted(json.loads(line)["id"] for line in data.splitlines()) == [
        f"r{i}" for i in range(5)
    ]
    again = echo("batch", "--engine", "ECHO", "-i", f"in.jsonl{suffix}", "-o", f"out.jsonl{suffix}")
    assert "resuming" in again.stderr and "5 rows done" in again.stderr


def test_csv_rows_run_each_as_a_prompt(echo, tmp_path):
    (tmp_path / "data.csv").write_text("id,prompt\na,hi\nb,there\n")
    run = echo("batch", "--engine", "ECHO", "--model.model_name", "m", "-i", "data.csv", "-o", "o")
    assert run.returncode == 0, run.stderr
    replies = {
        row["id"]: row["response"]["text"]
        for row in map(json.loads, (tmp_path / "o").read_text().splitlines())
    }
    assert replies == {"a": 'ECHO [{"role": "user", "content": "hi"}]',
                       "b": 'ECHO [{"role": "user", "content": "there"}]'}  # fmt: skip


@pytest.mark.parametrize("name", ["data.xlsx", "data.orc"])
def test_a_format_lmpress_does_not_read_is_refused_before_the_model_loads(echo, tmp_path, name):
    (tmp_path / name).write_bytes(b"PK\x03\x04")
    run = echo("batch", "--engine", "ECHO", "--model.model_name", "m", "-i", name, "-o", "o")
    assert run.returncode == 2
    assert f"{name}: " in run.stderr and "files are not supported as input" in run.stderr
    assert "loading" not in run.stderr and len(run.stderr.strip().splitlines()) == 1


def test_unreachable_server_is_named_and_stops_the_job(tmp_path):
    (tmp_path / "in.jsonl").write_text(ROWS * 1 + "".join(
        json.dumps({"id": f"x{i}", "prompt": "hi"}) + "\n" for i in range(20)))  # fmt: skip
    run = run_lmpress(
        "batch", "--engine", "REMOTE", "--remote_params.api_url", "http://127.0.0.1:9/v1",
        "--model.model_name", "m", "--remote_params.max_retries", "0",
        "--remote_params.num_workers", "1", "-i", "in.jsonl", "-o", "out.jsonl", cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 1
    assert "connection refused" in run.stderr
    assert "http://127.0.0.1:9/v1 cannot be reached" in run.stderr
    assert "re-run the same command to resume" in run.stderr
    summary = json.loads((tmp_path / "out.jsonl.summary.json").read_text())
    assert summary["rows_ok"] + summary["rows_failed"] < summary["rows_total"]


@pytest.mark.parametrize(
    "env, name",
    [
        # a bare hub id far from any bundled name (not even tiny:gpt2's) gets no suggestion
        ({"HF_HUB_OFFLINE": "1"}, "gpt2"),
        ({"HTTPS_PROXY": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9"},
         "someorg/not-here"),
    ],
)  # fmt: skip
def test_offline_hub_model_fails_with_one_line(tmp_path, env, name):
    run = run_lmpress(
        "infer", "--engine", "NATIVE", "--model.model_name", name, "hi",
        env={"HF_HOME": str(tmp_path), "HF_HUB_OFFLINE": "", **env}, timeout=40,
    )  # fmt: skip
    assert run.returncode == 2
    [line] = run.stderr.strip().splitlines()
    assert f"'{name}' is not on this machine" in line
    assert "local model directory" in line
    assert "did you mean" not in line


def test_batch_says_what_it_loads(echo, tmp_path):
    (tmp_path / "in.jsonl").write_text(ROWS)
    run = echo(
        "batch", "--engine", "ECHO", "--model.model_name", "m1", "-i", "in.jsonl", "-o", "o.jsonl"
    )
    assert "loading m1 on ECHO…" in run.stderr


def test_a_trailing_assistant_turn_is_regenerated(echo, tmp_path):
    row = {"id": "c", "messages": [{"role": "user", "content": "hi"},
                                   {"role": "assistant", "content": "old reply"}]}  # fmt: skip
    (tmp_path / "in.jsonl").write_text(json.dumps(row) + "\n")
    run = echo("batch", "--engine", "ECHO", "-i", "in.jsonl", "-o", "out.jsonl")
    assert run.returncode == 0, run.stderr
    out = json.loads((tmp_path / "out.jsonl").read_text())
    assert [m["role"] for m in out["messages"]] == ["user", "assistant"]
    assert "old reply" not in out["response"]["text"]


def test_openai_batch_output_names_the_model_that_generated(echo, tmp_path):
    line = {"custom_id": "q", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "gpt-3.5-turbo-0125", "messages": [{"role": "user", "content": "x"}]}}  # fmt: skip
    (tmp_path / "in.jsonl").write_text(json.dumps(line) + "\n")
    run = echo(
        "batch",
        "--engine",
        "ECHO",
        "--model.model_name",
        "tiny-echo",
        "-i",
        "in.jsonl",
        "-o",
        "out.jsonl",
    )
    assert run.returncode == 0, run.stderr
    out = json.loads((tmp_path / "out.jsonl").read_text())
    assert out["response"]["body"]["model"] == "tiny-echo"


def test_tiny_llamacpp_recipe_takes_a_long_prompt(tmp_path):
    run = run_lmpress("infer", "-c", "tiny-llamacpp", "word " * 400, cwd=tmp_path)
    assert run.returncode == 0, run.stderr


# --- smaller rough edges ------------------------------------------------------------------------


def test_help_shows_flags_without_a_type_and_infer_shows_prompt():
    batch = run_lmpress("batch", "--help", env={"COLUMNS": "80"})
    assert "<bool>" not in batch.stdout.split("--help")[0]
    assert "rows go to OUT.errors.jsonl" in batch.stdout  # one paragraph, wrapped, not ragged
    assert "[OPTIONS] [PROMPT]" in run_lmpress("infer", "--help").stdout


def test_override_errors_name_the_key_once_and_suggest_with_dashes():
    run = run_lmpress("config", "show", "--generation.temperature", "hot")
    assert run.stderr.count("generation.temperature") == 1
    typo = run_lmpress("config", "show", "--generation.temprature", "1")
    assert "did you mean '--generation.temperature'?" in typo.stderr


def test_recipes_are_described_in_full():
    shown = " ".join(run_lmpress("recipes").stdout.split())
    assert "Point model.model_name at any .gguf file to run a real model." in shown


def test_engines_says_a_remote_key_is_missing():
    run = run_lmpress("engines", env={"OPENAI_API_KEY": ""})
    assert "usable, but the API key is missing: export OPENAI_API_KEY=..." in run.stdout


def test_infer_with_empty_stdin_is_refused(echo):
    run = echo("infer", "--engine", "ECHO", input="")
    assert run.returncode == 2
    assert "no prompt" in run.stderr


def test_the_tiny_gguf_builder_has_help():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "lmpress.builtin_models.tiny_gguf", "--help"],
                         capture_output=True, text=True)  # fmt: skip
    assert out.returncode == 0 and "usage: python -m lmpress.builtin_models.tiny_gguf" in out.stdout


# --- issue 48: model names that fail fast and say what was meant; replies that say why they end


OFFLINE = [
    {"HF_HUB_OFFLINE": "1"},  # switched off
    {"HTTPS_PROXY": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9"},  # unreachable
]


@pytest.mark.parametrize("env", OFFLINE, ids=["HF_HUB_OFFLINE", "unreachable"])
@pytest.mark.parametrize(
    "engine, name",
    [
        ("NATIVE", "smollm2"),  # the recipe's name given as a model
        ("NATIVE", "smollm2:135m-instruc"),
        ("NATIVE", "HuggingFaceTB/SmolLM2-135M-Instruct"),  # not in this (empty) hub cache
        ("LLAMACPP", "smollm2"),
        ("LLAMACPP", "smollm2:135m-instruc"),
    ],
)
def test_a_name_near_a_bundled_one_fails_at_once_and_says_which(tmp_path, env, engine, name):
    """Offline, NATIVE once retried such a name for about 50 s ("Retrying in 8s") before its
    own error; the timeout here is well under that, and far over what the check takes."""
    run = run_lmpress(
        "infer", "--engine", engine, "--model.model_name", name, "hi",
        env={"HF_HOME": str(tmp_path), "HF_HUB_OFFLINE": "", **env}, timeout=40,
    )  # fmt: skip
    assert run.returncode == 2, run.stderr
    [line] = run.stderr.strip().splitlines()
    assert f"'{name}'" in line
    assert "did you mean the bundled 'smollm2:135m-instruct'?" in line


def test_infer_says_the_reply_was_cut_by_max_new_tokens():
    run = run_lmpress("infer", "-c", "smollm2", "--generation.max_new_tokens", "5",
                      "Why is the sky blue?")  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip()  # the five tokens, on stdout alone
    assert (
        "note: the reply was cut at generation.max_new_tokens=5; "
        "raise it with --generation.max_new_tokens N"
    ) in run.stderr


# tiny:llama on NATIVE with a 40-token context: the reply runs into the context's end long
# before max_new_tokens (min_tokens keeps the random model from ending it first).
SHORT_CONTEXT = ["--engine", "NATIVE", "--model.model_name", "tiny:llama",
                 "--model.model_max_length", "40", "--generation.max_new_tokens", "200",
                 "--generation.min_tokens", "200"]  # fmt: skip


def test_infer_names_the_context_when_it_cut_the_reply():
    run = run_lmpress("infer", *SHORT_CONTEXT, "hello there")
    assert run.returncode == 0, run.stderr
    assert "note: the reply was cut at the end of the model's context (prompt " in run.stderr
    assert "max_new_tokens=" not in run.stderr


# The tiny GGUF on LLAMACPP with one sequence in a 256-cell cache (llama.cpp's least): the
# chat's words are the front's, from the engine's "length" short of max_new_tokens, which
# NATIVE's run above shows; LLAMACPP starts seconds sooner.
SHORT_CACHE = ["--engine", "LLAMACPP", "--model.model_name", "tiny-gguf:llama",
               "--model.model_kwargs.n_ctx", "256", "--generation.batch_size", "1",
               "--generation.max_new_tokens", "400", "--generation.min_tokens", "400"]  # fmt: skip


def test_chat_names_the_context_not_max_new_tokens_when_the_context_cut_the_reply():
    run = run_lmpress("chat", *SHORT_CACHE, input="hello there\n")
    assert run.returncode == 0, run.stderr
    assert "cut at the end of the model's context (prompt " in run.stderr
    assert "cut at generation.max_new_tokens" not in run.stderr


def test_a_misspelt_setting_of_llm_suggests_the_setting():
    from lmpress import LLM
    from lmpress.vocabulary.errors import ConfigError

    with pytest.raises(ConfigError) as caught:
        LLM("smollm2", max_new_tokenz=5)
    assert "did you mean max_new_tokens=..., generation.max_new_tokens?" in str(caught.value)
    assert "model.max_new_tokenz" not in str(caught.value)


def test_a_json_error_names_its_column_once(echo, tmp_path):
    (tmp_path / "in.jsonl").write_text(ROWS + '{"id": "bad", "prompt": "unterminated\n')
    run = echo("batch", "--engine", "ECHO", "-i", "in.jsonl", "-o", "out.jsonl")
    assert "in.jsonl:6: not valid JSON (Invalid control character at column 38)" in run.stderr
    assert "at at" not in run.stderr
