"""The round trip: `lmpress batch --engine REMOTE` against `lmpress serve`."""

from __future__ import annotations

import json

from tests.conftest import run_lmpress
from tests.servers.llm_server import LLMServer

ROWS = [
    {"id": "a", "messages": [{"role": "user", "content": "first question"}]},
    {
        "id": "b",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "second question"},
        ],
    },
    {"id": "c", "prompt": "third question", "generation": {"max_new_tokens": 3}},
]


def write_rows(path, rows) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def read_rows(path) -> dict[str, dict]:
    return {row["id"]: row for row in map(json.loads, path.read_text().splitlines())}


def test_batch_through_remote_reaches_the_served_engine_exactly(echo_server, tmp_path):
    """ECHO behind the server replies with what reached it: the rows' messages, unchanged."""
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_rows(source, ROWS)
    # No model name: REMOTE asks the server's /v1/models.
    run = run_lmpress(
        "batch", "--engine", "REMOTE", "--remote_params.api_url", f"{echo_server.url}/v1",
        "-i", str(source), "-o", str(out),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    rows = read_rows(out)
    for row in ROWS[:2]:
        sent = [{"role": m["role"], "content": m["content"]} for m in row["messages"]]
        assert rows[row["id"]]["response"]["text"] == "ECHO " + json.dumps(sent)
    # the row's own max_new_tokens went over the wire as max_tokens: 3 words
    assert rows["c"]["response"]["text"] == 'ECHO [{"role": "user",'
    assert rows["c"]["response"]["finish_reason"] == "length"


def test_batch_through_remote_on_the_native_engine(llama_server, tmp_path):
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    rows = [
        {"id": str(i), "messages": [{"role": "user", "content": f"question {i}"}]}
        for i in range(20)
    ]
    write_rows(source, rows)
    run = run_lmpress(
        "batch", "--engine", "REMOTE", "--remote_params.api_url", f"{llama_server.url}/v1",
        "--model.model_name", "tiny-llama", "--generation.max_new_tokens", "6",
        "-i", str(source), "-o", str(out),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    done = read_rows(out)
    assert sorted(done) == sorted(row["id"] for row in rows)
    for row in done.values():
        usage = row["response"]["usage"]
        assert 0 < usage["completion_tokens"] <= 6
        assert row["response"]["finish_reason"] in ("stop", "length")
        assert row["messages"][-1]["role"] == "assistant"


def test_batch_through_remote_with_the_servers_key(serve_process, echo_plugin, tmp_path):
    from tests.conftest import with_plugin

    key = "sk-round-trip-5521"
    served = serve_process(
        "--engine", "ECHO", env={**with_plugin(echo_plugin), "LMPRESS_API_KEY": key}
    )
    source = tmp_path / "in.jsonl"
    write_rows(source, ROWS[:1])
    common = ["batch", "--engine", "REMOTE", "--remote_params.api_url", f"{served.url}/v1",
              "--model.model_name", "echo", "--remote_params.max_retries", "0", "-i", str(source)]  # fmt: skip
    run = run_lmpress(
        *common, "-o", str(tmp_path / "ok.jsonl"),
        "--remote_params.api_key_env_varname", "SERVE_KEY", env={"SERVE_KEY": key},
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert read_rows(tmp_path / "ok.jsonl")["a"]["response"]["text"].startswith("ECHO ")
    # --cache off: the request goes to serve again (the response cache would answer it; the
    # key is not part of what decides a reply).
    run = run_lmpress(
        *common, "-o", str(tmp_path / "refused.jsonl"), "--cache", "off",
        "--remote_params.api_key_env_varname", "SERVE_KEY", env={"SERVE_KEY": "wrong"},
    )  # fmt: skip
    assert run.returncode == 1  # the row failed...
    assert "REMOTE: HTTP 401: Incorrect API key provided." in run.stderr  # ...refused by serve
    assert key not in served.log


def test_serve_reports_the_providers_cached_prompt_tokens_as_openai_does(serve_process):
    """`lmpress serve` over ANTHROPIC: a long system prompt sent again is read from Anthropic's
    cache, and the chat completion's usage says so where OpenAI's would."""
    system = " ".join(f"rule{i}" for i in range(1200))
    with LLMServer() as upstream:
        served = serve_process("--engine", "ANTHROPIC", "--model.model_name", "claude-test",
                               "--remote_params.api_url", upstream.anthropic_url,
                               env={"ANTHROPIC_API_KEY": "sk-ant-test"})  # fmt: skip
        client = served.client()
        usages = [
            client.chat.completions.create(
                model="claude-test",
                messages=[
                    {"role": "system", "content": system},
                    {"role": "user", "content": f"question {i}"},
                ],
            ).usage  # fmt: skip
            for i in range(3)
        ]
        served.stop()
    assert usages[0].prompt_tokens_details is None  # nothing cached: the field as before
    assert usages[1].prompt_tokens_details is None  # written to the cache, not read
    assert usages[2].prompt_tokens_details.cached_tokens == 1200
    assert usages[2].prompt_tokens == usages[0].prompt_tokens  # all input, however billed
