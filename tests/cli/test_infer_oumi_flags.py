"""`lmpress infer` with `oumi infer`'s flags, meaning what they mean there."""

from __future__ import annotations

import base64
import json

import pytest

from tests.conftest import run_lmpress, with_plugin
from tests.servers.llm_server import LLMServer, reply_text

# These tests are about flags, not the engine: ECHO starts in about 1 s of CPU where NATIVE
# takes 5-7 s to import torch. NATIVE's own piped chat runs in tests/chat/test_chat.py.
ECHO = ["--engine", "ECHO", "--generation.max_new_tokens", "6"]


def test_dash_i_opens_the_chat_as_lmpress_chat_does(echo_plugin):
    lines = "first question\nsecond question\n"
    env = with_plugin(echo_plugin)
    chat = run_lmpress("chat", *ECHO, input=lines, env=env)
    infer = run_lmpress("infer", "-i", *ECHO, input=lines, env=env)
    assert chat.returncode == 0, chat.stderr
    assert infer.returncode == 0, infer.stderr
    assert infer.stdout == chat.stdout and len(infer.stdout.strip().splitlines()) >= 2


def test_the_old_dash_i_file_form_says_what_changed(tmp_path, echo_plugin):
    src = tmp_path / "in.jsonl"
    src.write_text('{"prompt": "hi"}\n')
    out = str(tmp_path / "out.jsonl")
    run = run_lmpress("infer", *ECHO, "-i", str(src), "-o", out, env=with_plugin(echo_plugin))
    assert run.returncode != 0
    assert "-i opens the chat, as in `oumi infer`; run a file with --input_path" in run.stderr


def test_system_prompt_and_its_alias_send_a_system_message(echo_plugin):
    env = with_plugin(echo_plugin)
    for flag in ("--system-prompt", "--system"):
        run = run_lmpress("infer", "--engine", "ECHO", flag, "be brief", "hi", env=env)
        assert run.returncode == 0, run.stderr
        sent = json.loads(run.stdout.removeprefix("ECHO ").strip())
        assert sent[0] == {"role": "system", "content": "be brief"}


def test_image_is_sent_with_the_prompt(tmp_path):
    image = tmp_path / "dot.png"
    image.write_bytes(b"\x89PNG\r\n\x1a\nnot-really-a-png")
    with LLMServer() as server:
        run = run_lmpress(
            "infer", "--engine", "REMOTE", "--remote_params.api_url", server.openai_url,
            "--model.model_name", "m", "--image", str(image), "What is this?",
        )  # fmt: skip
        assert run.returncode == 0, run.stderr
        assert run.stdout.strip() == reply_text("What is this?")
        (path, body), *_ = server.stats.bodies
    parts = body["messages"][-1]["content"]
    data = base64.b64encode(image.read_bytes()).decode()
    assert {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{data}"}} in parts
    assert {"type": "text", "text": "What is this?"} in parts


def test_a_missing_image_is_one_clear_line(echo_plugin):
    env = with_plugin(echo_plugin)
    run = run_lmpress("infer", *ECHO, "--image", "/no/such.png", "hi", env=env)
    assert run.returncode != 0
    assert run.stderr.strip() == "lmpress: error: --image: /no/such.png: no such file"


def test_verbose_prints_the_config_and_list_lists_recipes(echo_plugin):
    run = run_lmpress("infer", "-v", "--engine", "ECHO", "hi", env=with_plugin(echo_plugin))
    assert run.returncode == 0, run.stderr
    assert "engine: ECHO" in run.stderr
    listed = run_lmpress("infer", "--list")
    assert listed.returncode == 0 and "tiny-native" in listed.stdout


@pytest.mark.parametrize("level, ok", [("debug", True), ("loud", False)])
def test_log_level(level, ok, echo_plugin):
    run = run_lmpress(
        "infer", "-log", level, "--engine", "ECHO", "hi", env=with_plugin(echo_plugin)
    )
    assert (run.returncode == 0) is ok, run.stderr
    if not ok:
        assert "--log-level: 'loud' is not one of DEBUG" in run.stderr


def test_input_path_takes_system_as_lmpress_batch_does(tmp_path, echo_plugin):
    """`--system` means what `lmpress batch --system` means: a system turn for every row
    without one; it is not dropped on the way to the batch path."""
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text('{"id": "a", "prompt": "hi"}\n')
    run = run_lmpress(
        "infer", "--engine", "ECHO", "--generation.max_new_tokens", "64", "--system",
        "be brief", "--input_path", str(src), "--output_path", str(out),
        env=with_plugin(echo_plugin),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    row = json.loads(out.read_text())
    sent = json.loads(row["response"]["text"].removeprefix("ECHO "))
    assert sent == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    "extra, said",
    [
        (["--overwrite"], "--overwrite is a flag of lmpress batch, not of infer"),
        (["--shard", "0/2"], "--shard is a flag of lmpress batch, not of infer"),
        (["--max-errors=3"], "--max-errors is a flag of lmpress batch, not of infer"),
        (["a", "prompt"], "unexpected argument 'a' (--input_path runs the file's rows"),
        (["--image", "x.png"], "--image is for one prompt, not --input_path"),
        (["--raw"], "--raw is for one prompt, not --input_path"),
    ],
)
def test_input_path_never_drops_a_flag_it_was_given(tmp_path, echo_plugin, extra, said):
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text('{"id": "a", "prompt": "hi"}\n')
    run = run_lmpress(
        "infer", "--engine", "ECHO", "--input_path", str(src), "--output_path", str(out),
        *extra, env=with_plugin(echo_plugin),
    )  # fmt: skip
    assert run.returncode == 2
    assert run.stderr.strip().startswith(f"lmpress: error: {said}")
    assert len(run.stderr.strip().splitlines()) == 1 and not out.exists()


def test_output_path_without_input_path_is_refused_not_dropped(tmp_path, echo_plugin):
    out = tmp_path / "out.jsonl"
    run = run_lmpress(
        "infer", "--engine", "ECHO", "--output_path", str(out), "hi", env=with_plugin(echo_plugin)
    )
    assert run.returncode == 2
    assert run.stderr.strip() == (
        "lmpress: error: --output_path is where a file's rows go: give --input_path FILE too"
    )
    assert not out.exists()
