"""The real `lmpress` command in a subprocess, as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from lmpress.cli.report import SHOWN_FAILURES
from tests.conftest import REPO, run_lmpress, with_plugin

TINY = ["--model.model_name", "tiny:llama", "--generation.max_new_tokens", "6"]
TINY_GGUF = ["--model.model_name", "tiny-gguf:llama", "--generation.max_new_tokens", "6"]
# Where the engine is incidental (row formats, side files, flags), ECHO: a CLI run on it costs
# about 1 s of CPU where NATIVE costs 5-7 s to import torch. Pass `env=with_plugin(...)`.
ECHO = ["--engine", "ECHO", "--generation.max_new_tokens", "6"]


HEAVY = (
    "torch",
    "transformers",
    "llama_cpp",
    "vllm",
    "openai",
    "anthropic",
    "fastapi",
    "ray",
    "lm_eval",
)


def main_in_a_process(argv: list[str], env: dict, modules=HEAVY) -> subprocess.CompletedProcess:
    """`main(argv)` in a fresh Python, its output as a user sees it; stdout ends with
    `EXIT <code>` and `HEAVY [<those of modules it imported>]`."""
    code = (
        "import sys\n"
        "from lmpress.cli.app import main\n"
        f"try:\n    code = main({argv!r})\nexcept SystemExit as exc:\n    code = exc.code\n"
        "print('EXIT', code)\n"
        f"print('HEAVY', sorted(m for m in {tuple(modules)!r} if m in sys.modules))\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, **env}
    )


def test_help_imports_no_backend():
    out = main_in_a_process(["--help"], {"PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr
    assert "HEAVY []" in out.stdout
    assert "infer" in out.stdout and "batch" in out.stdout


def test_a_batch_job_on_a_plugin_engine_imports_no_backend_and_no_sdk(tmp_path, echo_plugin):
    # A job's start is paid per run: the openai package alone takes most of a second, and
    # only a job whose rows are OpenAI Batch lines, or a remote engine, needs it.
    src = tmp_path / "in.jsonl"
    src.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    argv = ["batch", *ECHO, "-i", str(src), "-o", str(tmp_path / "out.jsonl")]
    out = main_in_a_process(argv, with_plugin(echo_plugin))
    assert out.returncode == 0, out.stderr
    assert "EXIT 0" in out.stdout and "HEAVY []" in out.stdout
    assert json.loads((tmp_path / "out.jsonl").read_text())["response"]["text"].startswith("ECHO")


def test_a_missing_input_is_refused_before_a_checkpoint_s_backend_is_imported(tmp_path):
    # Reading a checkpoint's task (does it embed?) imports transformers and torch, seconds
    # that a mistyped path should not cost.
    missing = tmp_path / "missing.jsonl"
    argv = ["batch", "--engine", "NATIVE", "--model.model_name", "tiny:llama"]
    argv += ["-i", str(missing), "-o", str(tmp_path / "out.jsonl")]
    out = main_in_a_process(argv, {"PYTHONPATH": str(REPO)}, ("torch", "transformers"))
    assert out.stderr.strip() == f"lmpress: error: {missing}: no such input file"
    assert "EXIT 2" in out.stdout and "HEAVY []" in out.stdout
    assert not (tmp_path / "out.jsonl").exists()


def test_every_command_has_help():
    for command in (["infer"], ["batch"], ["engines"], ["recipes"], ["config", "show"]):
        run = run_lmpress(*command, "--help")
        assert run.returncode == 0, run.stderr
        assert "Usage" in run.stdout


def test_infer_prints_the_reply():
    # The tiny GGUF on LLAMACPP, which starts in a second: printing the reply is infer's, and
    # greedy the default settings', on any engine. NATIVE's infer runs in test_first_hour.py.
    args = ["infer", "--engine", "LLAMACPP", *TINY_GGUF, "Why is the sky blue?"]
    run = run_lmpress(*args)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip()
    again = run_lmpress(*args)
    assert again.stdout == run.stdout  # greedy by default


def test_infer_reads_stdin_and_system_prompt(echo_plugin):
    env = with_plugin(echo_plugin)
    run = run_lmpress(
        "infer", "--engine", "ECHO", "--system", "be brief", input="from stdin\n", env=env
    )
    assert run.returncode == 0, run.stderr
    sent = json.loads(run.stdout.removeprefix("ECHO ").strip())
    assert sent == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "from stdin"},
    ]


def test_library_warnings_reach_the_debug_log_not_the_terminal(echo_plugin):
    env = {**with_plugin(echo_plugin), "ECHO_WARN": "1"}
    quiet = run_lmpress("infer", "--engine", "ECHO", "hello", env=env)
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stdout == 'ECHO [{"role": "user", "content": "hello"}]\n'
    assert "Warning" not in quiet.stderr and "deprecated" not in quiet.stderr
    debug = run_lmpress("infer", "--debug", "--cache", "off", "--engine", "ECHO", "hello", env=env)
    assert debug.stdout == quiet.stdout
    assert "FutureWarning: ECHO's `transcript` is deprecated" in debug.stderr


def test_infer_with_input_path_runs_the_batch_path(tmp_path, echo_plugin):
    # Oumi's spelling; -i means --interactive in `infer`, as in `oumi infer`.
    src = tmp_path / "in.jsonl"
    src.write_text('{"id": "a", "prompt": "hi"}\n')
    out = tmp_path / "out.jsonl"
    run = run_lmpress(
        "infer", *ECHO, "--input_path", str(src), "--output_path", str(out),
        env=with_plugin(echo_plugin),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert json.loads(out.read_text())["id"] == "a"


def mixed_rows(count: int) -> list[dict]:
    rows = []
    for i in range(count):
        kind = i % 4
        if kind == 0:
            rows.append(
                {
                    "id": f"chat-{i}",
                    "messages": [{"role": "user", "content": f"question {i}"}],
                    "metadata": {"i": i},
                }
            )
        elif kind == 1:
            rows.append(
                {
                    "conversation_id": f"oumi-{i}",
                    "messages": [
                        {"role": "user", "content": [{"type": "text", "content": f"q {i}"}]}
                    ],
                    "metadata": {"i": i},
                }
            )
        elif kind == 2:
            rows.append({"id": f"prompt-{i}", "prompt": f"prompt number {i}", "metadata": {"i": i}})
        else:
            rows.append(
                {
                    "custom_id": f"custom-{i}",
                    "messages": [
                        {"role": "system", "content": "hi"},
                        {"role": "user", "content": f"{i}"},
                    ],
                    "metadata": {"i": i},
                }
            )
    return rows


def test_batch_of_200_mixed_rows(tmp_path, echo_plugin):
    # The row formats and what a row carries through are the engine's no concern: ECHO.
    # NATIVE's own batching runs end to end in test_a_failed_generation_fails_its_row_only.
    rows = mixed_rows(200)
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out.jsonl"
    run = run_lmpress(
        "batch", "-i", str(src), "-o", str(out), *ECHO, "--generation.batch_size", "16",
        env=with_plugin(echo_plugin),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(written) == 200

    def ident(r):
        return r.get("id") or r.get("conversation_id") or r.get("custom_id")

    assert sorted(ident(r) for r in written) == sorted(ident(r) for r in rows)
    by_id = {ident(r): r for r in written}
    for row in rows:
        got = by_id[ident(row)]
        assert got["metadata"] == row["metadata"]
        assert got["messages"][-1]["role"] == "assistant"
        assert got["response"]["usage"]["completion_tokens"] > 0
    assert "rows ok" in run.stderr and "200" in run.stderr


BAD_LINES = [
    ("not json at all", "not valid JSON"),
    ('{"messages": [{"role": "user", "content": "ok"}]', "not valid JSON"),
    ("[1, 2, 3]", "expected a JSON object"),
    ('{"txt": "no messages"}', "row has no 'messages', 'prompt'"),
    ('{"messages": []}', "'messages' is empty"),
    ('{"messages": [{"role": "wizard", "content": "hi"}]}', 'unknown role "wizard"'),
    ('{"messages": [{"role": "user", "content": 42}]}', "content must be a string or a list"),
    ('{"prompt": ["a"]}', "'prompt' must be a string"),
    ('{"prompt": "x", "generation": {"temperature": -3}}', "generation.temperature"),
    ('{"prompt": "x", "generation": {"num_beams": 4}}', "does not support generation.num_beams"),
]


def test_bad_rows_are_reported_and_good_rows_complete(tmp_path, echo_plugin):
    # Reading and checking rows happens before any engine sees them: ECHO.
    src = tmp_path / "in.jsonl"
    lines = [json.dumps({"id": "good-0", "prompt": "hi"})]
    for text, _ in BAD_LINES:
        lines.append(text)
        lines.append(json.dumps({"id": f"good-{len(lines)}", "prompt": "hello"}))
    src.write_bytes(("\n".join(lines) + "\n").encode() + b'{"prompt": "\xff\xfe"}\n')
    out = tmp_path / "out.jsonl"
    run = run_lmpress("batch", "-i", str(src), "-o", str(out), *ECHO, env=with_plugin(echo_plugin))
    assert run.returncode == 1
    assert "Traceback" not in run.stderr
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(written) == len(BAD_LINES) + 1
    assert all(r["id"].startswith("good-") for r in written)
    errors = [
        json.loads(line) for line in (tmp_path / "out.jsonl.errors.jsonl").read_text().splitlines()
    ]
    assert len(errors) == len(BAD_LINES) + 1
    assert {e["line"] for e in errors} == {2 * i for i in range(1, len(BAD_LINES) + 1)} | {
        len(lines) + 1
    }
    reasons = {e["line"]: e["error"]["message"] for e in errors}  # every one in the file
    for line_no, (_, expected) in enumerate(BAD_LINES, start=1):
        assert expected in reasons[2 * line_no]
        if line_no <= SHOWN_FAILURES:  # the first few on the terminal too
            assert f"{src}:{2 * line_no}: " in run.stderr and expected in run.stderr
    assert "not valid UTF-8" in reasons[len(lines) + 1]
    assert f"{len(errors) - SHOWN_FAILURES} more failed rows not shown" in run.stderr


def test_a_failed_generation_fails_its_row_only(tmp_path):
    src = tmp_path / "in.jsonl"
    rows = [
        {"id": "ok-1", "prompt": "hi"},
        {"id": "huge", "prompt": "word " * 3000},
        {"id": "ok-2", "prompt": "yo"},
    ]
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out.jsonl"
    run = run_lmpress("batch", "-i", str(src), "-o", str(out), *TINY)
    assert run.returncode == 1
    assert sorted(json.loads(line)["id"] for line in out.read_text().splitlines()) == [
        "ok-1",
        "ok-2",
    ]
    (error,) = [
        json.loads(line) for line in (tmp_path / "out.jsonl.errors.jsonl").read_text().splitlines()
    ]
    assert error["id"] == "huge" and error["line"] == 2
    assert error["error"]["kind"] == "context_length_exceeded"
    assert f"{src}:2: prompt is" in run.stderr


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["batch", "-i", "{tmp}/missing.jsonl", "-o", "{tmp}/o.jsonl", *ECHO],
            "missing.jsonl: no such input file",
        ),
        (
            ["batch", "-i", "{tmp}/in.jsonl", "-o", "/proc/forbidden/o.jsonl", *ECHO],
            "cannot write output",
        ),
        (["batch", "-i", "{tmp}/in.jsonl", "-o", "{tmp}", *ECHO], "is a directory"),
        (
            ["batch", "-i", "{tmp}/in.jsonl", "-o", "{tmp}/o.jsonl", "--engine", "GPT5"],
            "unknown engine 'GPT5'",
        ),
        (
            ["batch", "-c", "no-such-recipe", "-i", "{tmp}/in.jsonl", "-o", "{tmp}/o.jsonl"],
            "recipe 'no-such-recipe'",
        ),
        (
            [
                "batch",
                "-i",
                "{tmp}/in.jsonl",
                "-o",
                "{tmp}/o.jsonl",
                "--model.model_name",
                "./nowhere",
            ],
            "'./nowhere' does not exist",
        ),
        (
            [
                "batch",
                "-i",
                "{tmp}/in.jsonl",
                "-o",
                "{tmp}/o.jsonl",
                "--generation.temprature",
                "1",
            ],
            "--generation.temprature: unknown key (did you mean '--generation.temperature'?)",
        ),
        (["batch", "-o", "{tmp}/o.jsonl", *ECHO], "no input"),
        (["infer", "--generation.top_p", "2", "hi"], "generation.top_p"),
    ],
)
def test_usage_errors_are_one_line(tmp_path, echo_plugin, args, expected):
    # Errors in the files and flags are the engine's no concern; those that would otherwise
    # import torch before failing run on ECHO. './nowhere' stays NATIVE's local model path.
    (tmp_path / "in.jsonl").write_text('{"prompt": "hi"}\n')
    args = [a.format(tmp=tmp_path) for a in args]
    run = run_lmpress(*args, env=with_plugin(echo_plugin))
    assert run.returncode == 2, run.stderr
    assert expected in run.stderr
    assert "Traceback" not in run.stderr
    errors = [x for x in run.stderr.strip().splitlines() if not x.startswith("lmpress: loading")]
    assert len(errors) == 1


def test_debug_shows_the_traceback(tmp_path, echo_plugin):
    run = run_lmpress(
        "batch", "-i", str(tmp_path / "missing.jsonl"), "-o", str(tmp_path / "o"), "--debug",
        *ECHO, env=with_plugin(echo_plugin),
    )  # fmt: skip
    assert "Traceback" in run.stderr and "no such input file" in run.stderr


def test_empty_input_file(tmp_path, echo_plugin):
    (tmp_path / "in.jsonl").write_text("\n\n")
    run = run_lmpress(
        "batch", "-i", str(tmp_path / "in.jsonl"), "-o", str(tmp_path / "o.jsonl"), *ECHO,
        env=with_plugin(echo_plugin),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr  # nothing to do is no error (issue 31)
    assert "in.jsonl: the input has no rows; nothing to do" in run.stderr
    assert (tmp_path / "o.jsonl").read_bytes() == b""


def test_engines_lists_every_reserved_name():
    run = run_lmpress("engines")
    assert run.returncode == 0
    for name in ("NATIVE", "VLLM", "LLAMACPP", "OPENAI", "ANTHROPIC", "REMOTE", "REMOTE_VLLM", "GEMINI",
                 "GOOGLE_VERTEX", "TOGETHER", "PARASAIL", "DEEPSEEK", "OPENROUTER", "FIREWORKS",
                 "SGLANG", "SAMBANOVA", "CEREBRAS", "HUGGING_FACE_ROUTER", "BEDROCK"):  # fmt: skip
        assert name in run.stdout
    native = run.stdout.split("NATIVE", 1)[1].split("\n\n", 1)[0]
    assert "usable" in native and "temperature" in native


def test_config_show_prints_merged_yaml():
    run = run_lmpress("config", "show", "-c", "tiny-native", "--generation.temperature", "0.3")
    assert run.returncode == 0, run.stderr
    assert "temperature: 0.3" in run.stdout
    assert "model_name: tiny:llama" in run.stdout


def test_recipes_lists_bundled_ones():
    run = run_lmpress("recipes")
    assert "tiny-native" in run.stdout
