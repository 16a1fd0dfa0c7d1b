"""`lmpress batch` / `infer` / `config show` on remote engines, through the real CLI in a
subprocess against the test server: flaky servers, failing rows, and the API key never
written anywhere."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_lmpress
from tests.servers.llm_server import Faults, LLMServer, reply_text

pytestmark = pytest.mark.timeout(300)

SECRET = "sk-lmpress-SECRET-0123456789abcdef"
# Fast retries for tests: the real defaults wait seconds.
FAST = ["--remote_params.retry_backoff_base", "0.05", "--remote_params.retry_backoff_max", "1",
        "--remote_params.connection_timeout", "1"]  # fmt: skip


@pytest.fixture(autouse=True)
def no_ambient_keys(monkeypatch):
    for name in ("OPENAI_API_KEY", "OPENAI_ADMIN_KEY", "ANTHROPIC_API_KEY", "MY_KEY"):
        monkeypatch.delenv(name, raising=False)


def write_rows(path: Path, prompts: list[str]) -> Path:
    with path.open("w") as out:
        for i, prompt in enumerate(prompts):
            out.write(json.dumps({"id": f"row-{i}", "prompt": prompt}) + "\n")
    return path


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def batch(server: LLMServer, rows: Path, out: Path, *args: str, engine: str = "REMOTE", env=None):
    url = server.anthropic_url if engine == "ANTHROPIC" else server.openai_url
    return run_lmpress(
        "batch", "--engine", engine, "--remote_params.api_url", url,
        "--model.model_name", "test-model", *FAST, "-i", str(rows), "-o", str(out), *args,
        env=env,
    )  # fmt: skip


def test_300_rows_through_a_flaky_server_all_succeed_each_with_its_own_reply(tmp_path):
    # ~17% of first attempts fail: 429 with Retry-After, 500, a hang past the timeout, a
    # dropped connection, a malformed body.
    faults = Faults(transient_rate=0.17, retry_after="1", retry_after_ms=100, hang_s=2.0)
    prompts = [f"Question {i}: what is {i} squared?" for i in range(300)]
    rows = write_rows(tmp_path / "in.jsonl", prompts)
    out = tmp_path / "out.jsonl"
    with LLMServer(faults) as server:
        run = batch(server, rows, out, "--remote_params.num_workers", "16")
        stats = server.stats
    assert run.returncode == 0, run.stderr[-3000:]
    written = read_rows(out)
    assert len(written) == 300
    by_id = {row["id"]: row for row in written}
    assert sorted(by_id) == sorted(f"row-{i}" for i in range(300))  # none lost, none twice
    for i, prompt in enumerate(prompts):
        response = by_id[f"row-{i}"]["response"]
        assert response["text"] == reply_text(prompt)
        assert by_id[f"row-{i}"]["messages"][-1]["content"] == reply_text(prompt)
        assert response["usage"]["completion_tokens"] > 0
    assert not (tmp_path / "out.jsonl.errors.jsonl").exists()
    faults_seen = stats.requests - 300
    assert 30 <= faults_seen <= 75  # about 17% of 300, each retried once
    assert stats.statuses[429] and stats.statuses[500] and stats.statuses[599]  # 599: dropped


def test_permanent_failures_fail_their_rows_and_the_rest_succeed(tmp_path):
    prompts = [f"Question {i}" for i in range(40)]
    prompts[3] = "Question 3 REJECT-400"
    prompts[17] = "Question 17 REJECT-422"
    prompts[25] = "Question 25 ALWAYS-500"
    faults = Faults(permanent={"REJECT-400": 400, "REJECT-422": 422, "ALWAYS-500": 500})
    rows = write_rows(tmp_path / "in.jsonl", prompts)
    out = tmp_path / "out.jsonl"
    with LLMServer(faults) as server:
        run = batch(server, rows, out, "--remote_params.max_retries", "2")
        stats = server.stats
    assert run.returncode == 1
    written = read_rows(out)
    assert len(written) == 37
    assert all(row["response"]["text"] == reply_text(prompts[int(row["id"][4:])])
               for row in written)  # fmt: skip
    failed = {row["id"]: row for row in read_rows(tmp_path / "out.jsonl.errors.jsonl")}
    assert set(failed) == {"row-3", "row-17", "row-25"}
    assert failed["row-3"]["error"]["kind"] == "bad_request"
    assert "HTTP 400" in failed["row-3"]["error"]["message"]
    assert failed["row-17"]["error"]["kind"] == "unprocessable_entity"
    assert failed["row-25"]["error"]["kind"] == "server_error"
    assert "after 3 attempts" in failed["row-25"]["error"]["message"]
    # 400 and 422 were not retried; the 500 was, max_retries times.
    assert stats.requests == 37 + 1 + 1 + 3
    assert "row-3" not in {row["id"] for row in written}
    assert "in.jsonl:4" in run.stderr  # the failure is reported with its line


def test_the_api_key_is_never_written_anywhere(tmp_path):
    # A careless server that quotes the credentials it received in its error messages.
    prompts = [f"Question {i}" for i in range(12)] + ["LEAK-400 please", "LEAK-500 please"]
    faults = Faults(permanent={"LEAK-400": 400, "LEAK-500": 500}, echo_credentials=True,
                    required_key=SECRET)  # fmt: skip
    rows = write_rows(tmp_path / "in.jsonl", prompts)
    outputs = []
    with LLMServer(faults) as server:
        # The key from the environment, the usual way; --debug too, for tracebacks.
        env = {"MY_KEY": SECRET}
        for i, extra in enumerate((["--debug"], [])):
            out = tmp_path / f"env{i}.jsonl"
            run = batch(server, rows, out, "--remote_params.api_key_env_varname", "MY_KEY",
                        "--remote_params.max_retries", "1", *extra, env=env)  # fmt: skip
            assert run.returncode == 1, run.stderr[-2000:]
            outputs += [run.stdout, run.stderr]
        # A literal key: works, warns, and still never shows up.
        out = tmp_path / "literal.jsonl"
        run = batch(server, rows, out, "--remote_params.api_key", SECRET,
                    "--remote_params.max_retries", "1")  # fmt: skip
        assert run.returncode == 1
        assert "environment variable" in run.stderr
        outputs += [run.stdout, run.stderr]
        # A wrong key: the server answers 401 quoting what it got; that is not shown either.
        out = tmp_path / "wrong.jsonl"
        wrong = SECRET[::-1]
        run = batch(server, rows, out, "--remote_params.api_key_env_varname", "MY_KEY",
                    env={"MY_KEY": wrong})  # fmt: skip
        assert run.returncode == 1 and "authentication_error" in (
            (tmp_path / "wrong.jsonl.errors.jsonl").read_text()
        )
        outputs += [run.stdout, run.stderr, (tmp_path / "wrong.jsonl.errors.jsonl").read_text()]
        assert wrong not in "".join(outputs)
        assert SECRET in server.stats.credentials  # it was sent, to the server only
    shown = run_lmpress("config", "show", "--engine", "OPENAI", "--remote_params.api_key", SECRET)
    assert shown.returncode == 0 and "redacted" in shown.stdout
    outputs += [shown.stdout, shown.stderr]
    for path in tmp_path.iterdir():
        if path.suffix == ".jsonl" and path.name != "in.jsonl":
            outputs.append(path.read_text())
    assert len(read_rows(tmp_path / "env0.jsonl.errors.jsonl")) == 2  # the failures were written...
    assert "refused" in "".join(outputs)  # ...with the server's words...
    assert SECRET not in "".join(outputs)  # ...but never the key


def test_a_missing_key_fails_before_any_request_naming_the_variable(tmp_path):
    rows = write_rows(tmp_path / "in.jsonl", ["hello"])
    with LLMServer() as server:
        run = batch(server, rows, tmp_path / "out.jsonl", engine="OPENAI")
        assert server.stats.requests == 0
    assert run.returncode == 2
    assert "OPENAI_API_KEY" in run.stderr
    assert "Traceback" not in run.stderr


def test_round_trip_through_remote_and_the_summary_totals_usage(tmp_path):
    prompts = [f"Tell me about number {i}" for i in range(20)]
    rows = write_rows(tmp_path / "in.jsonl", prompts)
    out = tmp_path / "out.jsonl"
    with LLMServer() as server:
        run = batch(server, rows, out)
    assert run.returncode == 0, run.stderr[-2000:]
    written = read_rows(out)
    prompt_tokens = sum(r["response"]["usage"]["prompt_tokens"] for r in written)
    completion_tokens = sum(r["response"]["usage"]["completion_tokens"] for r in written)
    assert prompt_tokens > 0 and completion_tokens > 0
    assert f"{prompt_tokens} / {completion_tokens}" in run.stderr  # the summary's totals
    assert all(r["response"]["engine"] == "REMOTE" for r in written)


def test_anthropic_batch_round_trip(tmp_path):
    rows = tmp_path / "in.jsonl"
    rows.write_text(json.dumps({"id": "a", "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hello"},
        {"role": "user", "content": "again"},
    ]}) + "\n")  # fmt: skip
    out = tmp_path / "out.jsonl"
    with LLMServer() as server:
        run = batch(server, rows, out, engine="ANTHROPIC", env={"ANTHROPIC_API_KEY": "sk-ant"})
    assert run.returncode == 0, run.stderr[-2000:]
    (row,) = read_rows(out)
    assert row["response"]["text"] == reply_text("Hello\n\nagain")


def test_infer_streams_a_reply_from_a_remote_server():
    with LLMServer() as server:
        run = run_lmpress("infer", "--engine", "REMOTE", "--remote_params.api_url",
                          server.openai_url, "Why is the sky blue?")  # fmt: skip
        assert server.stats.bodies[-1][1]["stream"] is True
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == reply_text("Why is the sky blue?")


def test_engines_lists_the_remote_engines_as_usable():
    run = run_lmpress("engines")
    assert run.returncode == 0
    for name in ("OPENAI", "ANTHROPIC", "REMOTE", "REMOTE_VLLM", "GEMINI", "TOGETHER",
                 "PARASAIL", "DEEPSEEK", "OPENROUTER", "FIREWORKS"):  # fmt: skip
        block = run.stdout.split(name, 1)[1].split("\n\n")[0]
        assert "not usable" not in block.splitlines()[1], block
