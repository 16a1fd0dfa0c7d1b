"""`lmpress batch` as a long job: resume after any crash, error policy, ordering, sharding,
summary. Everything runs the real CLI in a subprocess."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest

from lmpress.cli.report import SHOWN_FAILURES
from tests.conftest import REPO, lmpress_process, run_lmpress, with_plugin
from tests.growing_files import whole_lines

TINY = [
    "--model.model_name",
    "tiny:llama",
    "--generation.max_new_tokens",
    "8",
    "--generation.batch_size",
    "4",
]
# The job logic (resume, fingerprint, errors, shards, summary) is the engine's no matter
# which: those tests run on ECHO, which starts in a fraction of NATIVE's torch import.
ECHO = ["--engine", "ECHO", *TINY]
# One row at a time, so the output grows row by row and a kill can land between any two.
ONE_BY_ONE = [*ECHO[:-1], "1"]
# Where a row must meet a real tokenizer and context (a row too long for the model, a chat
# template): LLAMACPP on the tiny GGUF, which starts without NATIVE's torch import.
GGUF = ["--engine", "LLAMACPP", "--model.model_name", "tiny-gguf:llama", *TINY[2:]]


def write_rows(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def rows(count: int) -> list[dict]:
    out = []
    for i in range(count):
        if i % 3 == 0:
            out.append({"prompt": f"question number {i} " + "more words " * (i % 5)})  # no id
        elif i % 3 == 1:
            out.append(
                {"id": f"chat-{i}", "messages": [{"role": "user", "content": f"tell me {i}"}]}
            )
        else:
            out.append(
                {
                    "conversation_id": f"conv-{i}",
                    "messages": [{"role": "user", "content": f"{i}?"}],
                    "metadata": {"n": i},
                }
            )
    return out


def ident(row: dict) -> str:
    return row.get("id") or row.get("custom_id") or row["conversation_id"]


@pytest.fixture(scope="module")
def echo(echo_plugin) -> dict[str, str]:
    """The environment for a run on ECHO; a few ms a word, so a kill can land mid-job."""
    return {**with_plugin(echo_plugin), "ECHO_DELAY_S": "0.002"}


def spawn(*args: str, env: dict | None = None) -> subprocess.Popen:
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return lmpress_process(*args,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full_env,
    )  # fmt: skip


@pytest.fixture(scope="module")
def reference(tmp_path_factory, echo):
    """An uninterrupted greedy run of the same rows."""
    tmp = tmp_path_factory.mktemp("reference")
    src = write_rows(tmp / "in.jsonl", rows(72))
    run = run_lmpress("batch", "-i", str(src), "-o", str(tmp / "out.jsonl"), *ONE_BY_ONE, env=echo)
    assert run.returncode == 0, run.stderr
    return src, {ident(r): r for r in read_rows(tmp / "out.jsonl")}


def test_sigkill_at_random_moments_loses_and_duplicates_nothing(tmp_path, reference, echo):
    src, expected = reference
    out = tmp_path / "out.jsonl"
    rng = random.Random(20261121)
    kills_mid_job = 0
    for _attempt in range(6):
        written = len(whole_lines(out))
        proc = spawn("batch", "-i", str(src), "-o", str(out), *ONE_BY_ONE, env=echo)
        # Kill once this run has written a random few rows: mid-job however fast the machine.
        target = written + rng.randint(1, 6)
        deadline = time.time() + 120
        while proc.poll() is None and len(whole_lines(out)) < target and time.time() < deadline:
            time.sleep(0.005)
        if proc.poll() is not None:
            break
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        kills_mid_job += 0 < len(whole_lines(out)) < len(expected)
        # Between runs every complete line is valid JSON; at most the last one is torn.
        for line in out.read_bytes().split(b"\n")[:-1]:
            json.loads(line)
    assert kills_mid_job >= 3
    finish = run_lmpress("batch", "-i", str(src), "-o", str(out), *ONE_BY_ONE, env=echo)
    assert finish.returncode == 0, finish.stderr
    got = read_rows(out)
    ids = [ident(r) for r in got]
    assert len(ids) == len(set(ids)) == len(expected)
    for row in got:
        want = expected[ident(row)]
        assert row["messages"] == want["messages"]
        assert row["response"]["text"] == want["response"]["text"]
    # A finished output run again does no work and leaves the file as it was.
    before = out.read_text()
    again = run_lmpress("batch", "-i", str(src), "-o", str(out), *ECHO, env=echo)
    assert again.returncode == 0
    assert out.read_text() == before
    summary = json.loads((tmp_path / "out.jsonl.summary.json").read_text())
    assert summary["rows_skipped"] == len(expected) and summary["rows_ok"] == 0


def test_torn_last_line_is_repaired(tmp_path, reference, echo):
    src, expected = reference
    seed = tmp_path / "seed.jsonl"
    assert run_lmpress("batch", "-i", str(src), "-o", str(seed), *ECHO, env=echo).returncode == 0
    # As a crash leaves it: ten whole lines and half of the eleventh.
    lines = seed.read_text().splitlines(keepends=True)
    out = tmp_path / "out.jsonl"
    out.write_text("".join(lines[:10]) + lines[10][: len(lines[10]) // 2])
    (tmp_path / "seed.jsonl.fingerprint.json").rename(tmp_path / "out.jsonl.fingerprint.json")
    run = run_lmpress("batch", "-i", str(src), "-o", str(out), *ECHO, env=echo)
    assert run.returncode == 0, run.stderr
    assert "cut off a half-written last line" in run.stderr
    assert "resuming" in run.stderr and "10 rows done" in run.stderr
    got = read_rows(out)
    assert sorted(ident(r) for r in got) == sorted(expected)


def test_changed_settings_are_refused_until_overwrite(tmp_path, echo):
    src = write_rows(tmp_path / "in.jsonl", rows(4))
    out = tmp_path / "out.jsonl"
    assert run_lmpress("batch", "-i", str(src), "-o", str(out), *ECHO, env=echo).returncode == 0
    changed = run_lmpress(
        "batch", "-i", str(src), "-o", str(out), *ECHO, "--generation.temperature", "0.7", env=echo
    )
    assert changed.returncode == 2
    assert "generation.temperature was 0.0, now 0.7" in changed.stderr
    assert "--overwrite" in changed.stderr
    model = run_lmpress(
        "batch", "-i", str(src), "-o", str(out), *ECHO, "--model.model_name", "tiny:gpt2", env=echo
    )
    assert (
        model.returncode == 2
        and 'model.model_name was "tiny:llama", now "tiny:gpt2"' in model.stderr
    )
    over = run_lmpress("batch", "-i", str(src), "-o", str(out), *ECHO, "--generation.temperature", "0.7",
                       "--generation.seed", "1", "--overwrite", env=echo)  # fmt: skip
    assert over.returncode == 0, over.stderr
    assert len(read_rows(out)) == 4


def test_scheduling_settings_do_not_block_a_resume(tmp_path, echo):
    src = write_rows(tmp_path / "in.jsonl", rows(4))
    out = tmp_path / "out.jsonl"
    assert run_lmpress("batch", "-i", str(src), "-o", str(out), *ECHO, env=echo).returncode == 0
    # A fingerprint as an older lmpress wrote it, with use_cache among the results' settings.
    fingerprint = tmp_path / "out.jsonl.fingerprint.json"
    record = json.loads(fingerprint.read_text())
    record["settings"]["generation"]["use_cache"] = True
    # ... and written before ignore_eos and bad_words existed: they had their defaults then.
    del (
        record["settings"]["generation"]["ignore_eos"],
        record["settings"]["generation"]["bad_words"],
    )
    fingerprint.write_text(json.dumps(record))
    again = run_lmpress(
        "batch", "-i", str(src), "-o", str(out), *ECHO[:-1], "2",
        "--generation.use_cache", "false", env=echo,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert json.loads((tmp_path / "out.jsonl.summary.json").read_text())["rows_skipped"] == 4


def test_output_not_made_by_lmpress_is_left_alone(tmp_path, echo):
    src = write_rows(tmp_path / "in.jsonl", rows(2))
    out = tmp_path / "out.jsonl"
    out.write_text('{"something": "else"}\n')
    run = run_lmpress("batch", "-i", str(src), "-o", str(out), *ECHO, env=echo)
    assert run.returncode == 2 and "no record of how it was made" in run.stderr
    assert out.read_text() == '{"something": "else"}\n'


def test_duplicate_ids_name_both_lines(tmp_path, echo):
    src = write_rows(
        tmp_path / "in.jsonl",
        [{"id": "a", "prompt": "x"}, {"id": "b", "prompt": "y"}, {"id": "a", "prompt": "z"}],
    )
    run = run_lmpress("batch", "-i", str(src), "-o", str(tmp_path / "out.jsonl"), *ECHO, env=echo)
    assert run.returncode == 2
    assert f"{src}:3: duplicate id 'a' (first at line 1)" in run.stderr
    assert not (tmp_path / "out.jsonl").exists()


def test_ctrl_c_writes_summary_exits_130_and_resumes(tmp_path, echo_plugin):
    src = write_rows(tmp_path / "in.jsonl", [{"id": f"r{i}", "prompt": f"p{i}"} for i in range(40)])
    out = tmp_path / "out.jsonl"
    env = {**with_plugin(echo_plugin), "ECHO_DELAY_S": "0.05"}
    proc = spawn(
        "batch",
        "--engine",
        "ECHO",
        "-i",
        str(src),
        "-o",
        str(out),
        "--generation.batch_size",
        "2",
        env=env,
    )
    deadline = time.time() + 60
    while time.time() < deadline and len(whole_lines(out)) < 4:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted" in err
    summary = json.loads((tmp_path / "out.jsonl.summary.json").read_text())
    assert summary["interrupted"] is True and 0 < summary["rows_ok"] < 40
    done = read_rows(out)
    finish = run_lmpress(
        "batch",
        "--engine",
        "ECHO",
        "-i",
        str(src),
        "-o",
        str(out),
        "--generation.batch_size",
        "2",
        env=env,
    )
    assert finish.returncode == 0, finish.stderr
    final = read_rows(out)
    assert sorted(r["id"] for r in final) == sorted(f"r{i}" for i in range(40))
    assert final[: len(done)] == done


def test_second_ctrl_c_exits_at_once(tmp_path, echo_plugin):
    src = write_rows(
        tmp_path / "in.jsonl", [{"id": f"r{i}", "prompt": "long " * 50} for i in range(8)]
    )
    env = {**with_plugin(echo_plugin), "ECHO_DELAY_S": "0.5"}
    proc = spawn(
        "batch", "--engine", "ECHO", "-i", str(src), "-o", str(tmp_path / "o.jsonl"), env=env
    )
    # The job takes over Ctrl-C before it writes its fingerprint.
    deadline = time.time() + 120
    while not (tmp_path / "o.jsonl.fingerprint.json").exists() and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    notice = ""
    for line in proc.stderr:  # the second Ctrl-C once the first one's notice is out
        notice += line
        if "Ctrl-C again to stop at once" in line:
            break
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 130, notice + err
    assert "stopped at once" in err


def failing_input(tmp_path: Path) -> Path:
    good = [{"id": f"g{i}", "prompt": "hi"} for i in range(6)]
    bad = [
        {"id": "bad1", "messages": [{"role": "bot", "content": "x"}]},
        {"id": "bad2", "prompt": "word " * 3000},
    ]
    return write_rows(tmp_path / "in.jsonl", good[:3] + bad[:1] + good[3:] + bad[1:])


def test_failed_rows_are_retried_on_the_next_run(tmp_path):
    src = failing_input(tmp_path)
    out = tmp_path / "out.jsonl"
    first = run_lmpress("batch", "-i", str(src), "-o", str(out), *GGUF)
    assert first.returncode == 1
    errors = read_rows(tmp_path / "out.jsonl.errors.jsonl")
    assert {(e["id"], e["line"]) for e in errors} == {("bad1", 4), ("bad2", 8)}
    assert {e["error"]["kind"] for e in errors} == {"invalid_row", "context_length_exceeded"}
    # Fix one bad row in the input: the next run retries the failed rows, and only those.
    lines = src.read_text().splitlines()
    lines[3] = json.dumps({"id": "bad1", "messages": [{"role": "user", "content": "x"}]})
    src.write_text("\n".join(lines) + "\n")
    second = run_lmpress("batch", "-i", str(src), "-o", str(out), *GGUF)
    assert second.returncode == 1
    assert json.loads((tmp_path / "out.jsonl.summary.json").read_text())["rows_skipped"] == 6
    assert sorted(r["id"] for r in read_rows(out)) == sorted([f"g{i}" for i in range(6)] + ["bad1"])
    assert [e["id"] for e in read_rows(tmp_path / "out.jsonl.errors.jsonl")] == ["bad2"]
    third = run_lmpress("batch", "-i", str(src), "-o", str(out), *GGUF, "--no-retry-failed")
    assert third.returncode == 0
    assert json.loads((tmp_path / "out.jsonl.summary.json").read_text())["rows_skipped"] == 8


def test_on_error_fail_and_max_errors_stop_the_job(tmp_path, echo):
    src = write_rows(
        tmp_path / "in.jsonl",
        [{"id": "bad", "messages": []}] + [{"id": f"g{i}", "prompt": "x"} for i in range(30)],
    )
    out = tmp_path / "out.jsonl"
    run = run_lmpress(
        "batch", "-i", str(src), "-o", str(out), *ECHO, "--on-error", "fail", env=echo
    )
    assert run.returncode == 1
    assert "--on-error is fail (line 1)" in run.stderr
    assert len(read_rows(out)) < 30
    src = write_rows(
        tmp_path / "in2.jsonl",
        [{"id": f"b{i}", "messages": []} for i in range(10)] + [{"id": "g", "prompt": "x"}],
    )
    run = run_lmpress(
        "batch",
        "-i",
        str(src),
        "-o",
        str(tmp_path / "o2.jsonl"),
        *ECHO,
        "--max-errors",
        "3",
        env=echo,
    )
    assert run.returncode == 1
    assert "3 rows failed (--max-errors 3)" in run.stderr
    assert len(read_rows(tmp_path / "o2.jsonl.errors.jsonl")) == 3


def test_ordered_output_follows_the_input(tmp_path, echo_plugin):
    # ECHO streams one word at a time, so long rows finish after short ones.
    data = [{"id": f"r{i}", "prompt": "w " * (40 if i % 4 == 0 else 1)} for i in range(24)]
    src = write_rows(tmp_path / "in.jsonl", data)
    env = {**with_plugin(echo_plugin), "ECHO_DELAY_S": "0.01"}
    common = [
        "--engine",
        "ECHO",
        "-i",
        str(src),
        "--generation.batch_size",
        "6",
        "--generation.max_new_tokens",
        "100",
    ]
    fast = run_lmpress("batch", *common, "-o", str(tmp_path / "fast.jsonl"), env=env)
    ordered = run_lmpress(
        "batch", *common, "-o", str(tmp_path / "ordered.jsonl"), "--ordered", env=env
    )
    assert fast.returncode == ordered.returncode == 0
    want = [r["id"] for r in data]
    assert [r["id"] for r in read_rows(tmp_path / "ordered.jsonl")] == want
    assert [r["id"] for r in read_rows(tmp_path / "fast.jsonl")] != want  # completion order


def test_shards_split_the_file_and_add_up(tmp_path, echo):
    data = rows(20)
    src = write_rows(tmp_path / "in.jsonl", data)
    seen = []
    for i in range(3):
        out = tmp_path / f"shard{i}.jsonl"
        run = run_lmpress(
            "batch", "-i", str(src), "-o", str(out), *ECHO, "--shard", f"{i}/3", env=echo
        )
        assert run.returncode == 0, run.stderr
        seen += [ident(r) for r in read_rows(out)]
    whole = tmp_path / "whole.jsonl"
    assert run_lmpress("batch", "-i", str(src), "-o", str(whole), *ECHO, env=echo).returncode == 0
    assert sorted(seen) == sorted(ident(r) for r in read_rows(whole))
    assert len(seen) == len(set(seen)) == 20
    bad = run_lmpress(
        "batch", "-i", str(src), "-o", str(tmp_path / "x.jsonl"), "--shard", "3/3", env=echo
    )
    assert bad.returncode == 2 and "expected I/N with 0 <= I < N" in bad.stderr


def test_summary_is_printed_and_written(tmp_path, echo):
    src = write_rows(tmp_path / "in.jsonl", rows(5))
    run = run_lmpress("batch", "-i", str(src), "-o", str(tmp_path / "out.jsonl"), *ECHO, env=echo)
    assert run.returncode == 0
    for label in (
        "rows ok",
        "rows failed",
        "rows skipped",
        "tokens in / out",
        "wall time",
        "rows/s",
        "tokens/s",
    ):
        assert label in run.stderr
    summary = json.loads((tmp_path / "out.jsonl.summary.json").read_text())
    assert summary["rows_ok"] == 5 and summary["completion_tokens"] > 0 and summary["wall_s"] > 0


def test_vllm_run_batch_examples_round_trip(tmp_path):
    from openai.types.chat import ChatCompletion

    from tests.data.test_openai_batch import VLLM_EXAMPLE

    embeddings = {"custom_id": "request-3", "method": "POST", "url": "/v1/embeddings",
                  "body": {"model": "intfloat/e5-mistral-7b-instruct", "input": "You are a helpful assistant."}}  # fmt: skip
    # vLLM's lines as they are, but for max_completion_tokens 1000: a tiny model's 1000 tokens
    # (it never says EOS) prove nothing 8 do not, and cost seconds of generation.
    example = [
        {**line, "body": {**line["body"], "max_completion_tokens": 8}} for line in VLLM_EXAMPLE
    ]
    src = write_rows(tmp_path / "in.jsonl", [*example, embeddings])
    out = tmp_path / "results.jsonl"
    run = run_lmpress("batch", "-i", str(src), "-o", str(out), *GGUF)
    assert run.returncode == 1  # the embeddings line is not a generate run's to answer
    lines = read_rows(out)
    assert sorted(line["custom_id"] for line in lines) == ["request-1", "request-2"]
    for line in lines:
        assert line["error"] is None and line["response"]["status_code"] == 200
        body = ChatCompletion.model_validate(line["response"]["body"])
        assert body.object == "chat.completion"
        assert body.choices[0].message.role == "assistant"
        assert body.usage.completion_tokens > 0
    (error,) = read_rows(tmp_path / "results.jsonl.errors.jsonl")
    assert error["custom_id"] == "request-3" and error["line"] == 3
    assert error["error"]["message"] == (
        "a /v1/embeddings line asks to embed, which 'tiny-gguf:llama' on LLAMACPP cannot (it answers "
        "generate); run these lines with an embedding model"
    )
    # The output is itself valid input for a resumed run: nothing left to do but the refused line.
    again = run_lmpress("batch", "-i", str(src), "-o", str(out), *GGUF, "--no-retry-failed")
    assert again.returncode == 0
    assert json.loads((tmp_path / "results.jsonl.summary.json").read_text())["rows_skipped"] == 3


def test_openai_batch_body_overrides_the_recipe(tmp_path, echo):
    line = {"custom_id": "short", "method": "POST", "url": "/v1/chat/completions",
            "body": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "n": 2, "temperature": 0.9, "seed": 3}}  # fmt: skip
    src = write_rows(tmp_path / "in.jsonl", [line])
    out = tmp_path / "out.jsonl"
    run = run_lmpress("batch", "-i", str(src), "-o", str(out), *ECHO, env=echo)
    assert run.returncode == 0, run.stderr
    (got,) = read_rows(out)
    body = got["response"]["body"]
    assert len(body["choices"]) == 2
    assert body["usage"]["completion_tokens"] <= 4
    assert all(c["finish_reason"] in ("length", "stop") for c in body["choices"])


MALFORMED = [
    ("this is not json", "not valid JSON"),
    ('{"prompt": "unterminated', "not valid JSON"),
    ('["a", "list"]', "expected a JSON object"),
    ('"just a string"', "expected a JSON object"),
    ('{"question": "no messages or prompt"}', "row has no 'messages', 'prompt'"),
    ('{"messages": []}', "'messages' is empty"),
    ('{"messages": "hello"}', "'messages' must be a list"),
    ('{"messages": [{"role": "robot", "content": "x"}]}', 'unknown role "robot"'),
    ('{"messages": ["hello"]}', "message 1 must be an object"),
    ('{"messages": [{"role": "user", "content": {"a": 1}}]}', "content must be a string or a list"),
    (
        '{"messages": [{"role": "user", "content": [{"type": "video", "url": "x"}]}]}',
        'unknown type "video"',
    ),
    ('{"prompt": 42}', "'prompt' must be a string"),
    ('{"prompt": "x", "generation": {"temperature": -1}}', "generation.temperature"),
    ('{"prompt": "x", "generation": {"top_p": "high"}}', "top_p"),
    ('{"prompt": "x", "generation": {"tempreture": 1}}', "unknown key 'tempreture'"),
    (
        '{"prompt": "x", "generation": {"num_beams": 3, "temperature": 0.5}}',
        "generation.temperature does not go with generation.num_beams 3",
    ),
    (
        '{"custom_id": "a1", "method": "POST", "url": "/v1/moderations", "body": {"input": "x"}}',
        "is not supported",
    ),
    (
        '{"custom_id": "a2", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "m"}}',
        "body has no 'messages'",
    ),
    (
        '{"custom_id": "a3", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": [{"role": "user", "content": "x"}], "tools": [{}]}}',
        "'body.tools[0].function' must be an object with a 'name'",
    ),
    ('{"id": "huge", "prompt": "' + "word " * 3000 + '"}', "the context of a sequence is 512"),
]


def test_malformed_corpus_gives_a_clear_error_per_row(tmp_path):
    lines, expected_at = [], {}
    for i, (text, expected) in enumerate(MALFORMED):
        lines.append(json.dumps({"id": f"good-{i}", "prompt": f"fine {i}"}))
        lines.append(text)
        expected_at[len(lines)] = expected
    src = tmp_path / "in.jsonl"
    src.write_bytes(("\n".join(lines) + "\n").encode() + b'{"prompt": "caf\xe9"}\n')
    expected_at[len(lines) + 1] = "not valid UTF-8"
    out = tmp_path / "out.jsonl"
    run = run_lmpress("batch", "-i", str(src), "-o", str(out), *GGUF)
    assert run.returncode == 1
    assert "Traceback" not in run.stderr
    assert sorted(r["id"] for r in read_rows(out)) == sorted(
        f"good-{i}" for i in range(len(MALFORMED))
    )
    errors = {e["line"]: e for e in read_rows(tmp_path / "out.jsonl.errors.jsonl")}
    assert set(errors) == set(expected_at)
    for line_no, expected in expected_at.items():  # the errors file keeps every one
        message = (errors[line_no].get("error") or {}).get("message", "")
        assert expected in message
    # The terminal shows the first few, in order, and counts the rest.
    said = [ln for ln in run.stderr.splitlines() if ln.startswith(f"lmpress: {src}:")]
    assert [int(ln.split(":")[2]) for ln in said] == sorted(expected_at)[:SHOWN_FAILURES]
    for line in said:
        assert expected_at[int(line.split(":")[2])] in line, line
    assert f"{len(expected_at) - SHOWN_FAILURES} more failed rows not shown" in run.stderr
