"""Provider prompt caching through the real SDKs against the loopback server, which plays the
providers' caches (`tests/servers/prompt_cache.py`): where ANTHROPIC marks a shared prefix with
`cache_control` and where it does not, what each row's usage and cost then say, and OpenAI's
automatic cache reported in usage, plain, streamed and through the provider batch APIs."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from lmpress.configs import load_config
from lmpress.engines.registry import create_engine
from lmpress.vocabulary.types import GenerationParams, Message, Request, Result
from tests.conftest import run_lmpress
from tests.servers.llm_server import BatchFaults, Faults, LLMServer

pytestmark = pytest.mark.timeout(120)

LONG = " ".join(f"rule{i}" for i in range(1200))  # 1200 words; ~2400 tokens by lmpress's count
SHORT = " ".join(f"rule{i}" for i in range(100))
TOOL = {"type": "function", "function": {
    "name": "lookup", "description": LONG,
    "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}  # fmt: skip


@pytest.fixture(autouse=True)
def keys(monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    for name in ("ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_BASE_URL"):
        monkeypatch.delenv(name, raising=False)


def make_engine(server: LLMServer, engine: str = "ANTHROPIC", **overrides):
    url = server.anthropic_url if engine == "ANTHROPIC" else server.openai_url
    values = {"engine": engine, "model.model_name": "claude-test", "remote_params.api_url": url,
              "remote_params.retry_backoff_base": 0.01, **overrides}  # fmt: skip
    return create_engine(load_config(None, values))


def ask(system: str | None, question: str, tools: list | None = None) -> Request:
    messages = [Message("system", system)] if system else []
    return Request(question, [*messages, Message("user", question)], GenerationParams(),
                   tools=tools)  # fmt: skip


def run_all(engine, requests: list[Request], stream: bool = False) -> list[Result]:
    """The requests one after another (or all at once with `together`), as the engine answers."""

    async def one(request: Request) -> Result:
        if not stream:
            return await engine.complete(request)
        return [item async for item in engine.stream(request)][-1]

    async def go() -> list[Result]:
        try:
            return [await one(request) for request in requests]
        finally:
            await engine.aclose()

    return asyncio.run(go())


def sent(server: LLMServer) -> list[dict]:
    return [body for path, body in server.stats.bodies if path.endswith("/messages")]


def marked(body: dict) -> tuple[bool, bool]:
    """Whether (the last tool, the last system block) carries cache_control."""
    tools = body.get("tools") or [{}]
    system = body.get("system")
    last_system = system[-1] if isinstance(system, list) else {}
    return "cache_control" in tools[-1], "cache_control" in last_system


@pytest.mark.parametrize("stream", [False, True])
def test_a_repeated_long_system_prompt_is_marked_from_its_second_row_and_read_after(stream):
    with LLMServer() as server:
        results = run_all(make_engine(server), [ask(LONG, f"q{i}") for i in range(4)], stream)
        bodies = sent(server)
    assert all(r.ok for r in results), [r.error for r in results]
    # The first row cannot know its prefix will come again: sent as it always was.
    assert isinstance(bodies[0]["system"], str) and marked(bodies[0]) == (False, False)
    assert [marked(b) for b in bodies[1:]] == [(False, True)] * 3
    assert bodies[1]["system"] == [{"type": "text", "text": LONG,
                                    "cache_control": {"type": "ephemeral"}}]  # fmt: skip
    usage = [r.usage for r in results]
    # The server counts the 1200 words of the prompt: written once, then read.
    assert [(u.cache_creation_tokens, u.cached_tokens) for u in usage] == [
        (0, 0),
        (1200, 0),
        (0, 1200),
        (0, 1200),
    ]
    # prompt_tokens is all input, however billed: the same on every row.
    assert len({u.prompt_tokens for u in usage}) == 1 and usage[0].prompt_tokens > 1200


def test_rows_sent_together_wait_for_the_one_writing_their_prefix():
    async def go(engine):
        try:
            first = await engine.complete(ask(LONG, "first"))
            rest = await asyncio.gather(*(engine.complete(ask(LONG, f"q{i}")) for i in range(6)))
            return [first, *rest]
        finally:
            await engine.aclose()

    with LLMServer() as server:
        results = asyncio.run(go(make_engine(server, **{"remote_params.num_workers": 8})))
    writes = sorted(r.usage.cache_creation_tokens for r in results)
    reads = sorted(r.usage.cached_tokens for r in results)
    assert writes == [0] * 6 + [1200]  # one row wrote the cache, not each of the six at once
    assert reads == [0, 0] + [1200] * 5


def test_the_last_tool_is_marked_where_the_tools_are_the_shared_prefix():
    requests = [ask(None, f"q{i}", tools=[TOOL]) for i in range(3)]
    with LLMServer() as server:
        results = run_all(make_engine(server), requests)
        bodies = sent(server)
    assert [marked(b) for b in bodies] == [(False, False), (True, False), (True, False)]
    assert [r.usage.cached_tokens > 0 for r in results] == [False, False, True]
    assert results[1].usage.cache_creation_tokens == results[2].usage.cached_tokens > 1000


@pytest.mark.parametrize(
    "overrides, system",
    [({"remote_params.prompt_cache": "off"}, LONG), ({}, SHORT),
     # Haiku 4.5 caches nothing under 4096 tokens: this prefix is ~2400.
     ({"model.model_name": "claude-haiku-4-5"}, LONG)],
)  # fmt: skip
def test_no_mark_where_caching_is_off_or_the_prefix_too_short_to_cache(overrides, system):
    with LLMServer() as server:
        results = run_all(
            make_engine(server, **overrides), [ask(system, f"q{i}") for i in range(3)]
        )
        bodies = sent(server)
    assert all(r.ok for r in results)
    assert all(isinstance(b["system"], str) for b in bodies)
    assert all(r.usage.cached_tokens == r.usage.cache_creation_tokens == 0 for r in results)


def test_prompt_cache_off_reads_as_off_from_yaml_and_a_bad_value_is_one_line(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("engine: ANTHROPIC\nremote_params:\n  prompt_cache: off\n")
    assert load_config(str(recipe)).remote_params.prompt_cache == "off"
    run = run_lmpress("config", "show", "-c", "anthropic", "--remote_params.prompt_cache", "always")
    assert run.returncode != 0
    assert run.stderr.strip().splitlines() == [
        "lmpress: error: remote_params.prompt_cache: 'always' must be auto or off"
    ]


@pytest.mark.parametrize("stream", [False, True])
def test_openai_reports_cached_tokens_of_a_repeated_long_prefix(stream):
    with LLMServer() as server:
        engine = make_engine(server, "OPENAI", **{"model.model_name": "gpt-4.1"})
        results = run_all(engine, [ask(LONG, f"q{i}") for i in range(3)], stream)
        bodies = [body for path, body in server.stats.bodies]
    assert all(r.ok for r in results)
    assert [r.usage.cached_tokens for r in results] == [0, 1200, 1200]
    assert all("cache_control" not in json.dumps(b) for b in bodies)  # OpenAI takes no marks


# --- what a user sees: rows, summary, cost ------------------------------------------------


def write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def job(tmp_path: Path, server: LLMServer, engine: str, model: str, *extra: str):
    """Five rows sharing a long system prompt and one with none, run by `lmpress batch` one
    at a time: (rows by id, OUT.summary.json, stderr)."""
    rows = [{"id": f"r{i}", "messages": [{"role": "system", "content": LONG},
                                         {"role": "user", "content": f"question {i}"}]}
            for i in range(5)] + [{"id": "plain", "prompt": "no system prompt here"}]  # fmt: skip
    out = tmp_path / f"out-{engine}.jsonl"
    url = server.anthropic_url if engine == "ANTHROPIC" else server.openai_url
    run = run_lmpress(
        "batch", "--engine", engine, "--model.model_name", model, "-i",
        str(write(tmp_path / "in.jsonl", rows)), "-o", str(out), "--remote_params.api_url", url,
        "--remote_params.num_workers", "1", *extra,
        env={"ANTHROPIC_API_KEY": "sk-ant-test", "OPENAI_API_KEY": "sk-test"},
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    written = {json.loads(line)["id"]: json.loads(line)["response"]
               for line in out.read_text().splitlines()}  # fmt: skip
    summary = json.loads(out.with_name(f"{out.name}.summary.json").read_text())
    return written, summary, run.stderr


def test_an_anthropic_job_records_cache_reads_and_writes_and_prices_them(tmp_path):
    with LLMServer() as server:
        rows, summary, stderr = job(tmp_path, server, "ANTHROPIC", "claude-sonnet-4-5")
    usage = {rid: row["usage"] for rid, row in rows.items()}
    assert [usage[f"r{i}"].get("cache_creation_tokens", 0) for i in range(5)] == [0, 1200, 0, 0, 0]
    assert [usage[f"r{i}"].get("cached_tokens", 0) for i in range(5)] == [0, 0, 1200, 1200, 1200]
    # A row that touched no cache has the usage it always had: no new keys.
    assert (
        set(usage["plain"])
        == set(usage["r0"])
        == {"prompt_tokens", "completion_tokens", "total_tokens"}
    )

    # claude-sonnet-4-5 in the price list: $3 in, $15 out, $0.30 cache read, $3.75 cache write.
    def cost(u: dict) -> float:
        read, wrote = u.get("cached_tokens", 0), u.get("cache_creation_tokens", 0)
        plain = u["prompt_tokens"] - read - wrote
        return (plain * 3.00 + read * 0.30 + wrote * 3.75 + u["completion_tokens"] * 15.00) / 1e6

    for rid, row in rows.items():
        assert row["cost_usd"] == pytest.approx(cost(usage[rid]), abs=1e-9), rid
    assert summary["cached_tokens"] == 3600 and summary["cache_creation_tokens"] == 1200
    assert summary["cost_usd"] == pytest.approx(sum(cost(u) for u in usage.values()), abs=1e-8)
    assert summary["cost_usd"] < sum(  # what the same tokens cost with no cache at all
        (u["prompt_tokens"] * 3.00 + u["completion_tokens"] * 15.00) / 1e6 for u in usage.values()
    )
    shown = {line.split("│")[1].strip(): line.split("│")[2].strip()
             for line in stderr.splitlines() if line.count("│") == 3}  # fmt: skip
    assert shown["of in, read from cache"] == "3600"
    assert shown["of in, written to cache"] == "1200"


def test_an_openai_job_records_cached_tokens_and_prices_them(tmp_path):
    with LLMServer() as server:
        rows, summary, _ = job(tmp_path, server, "OPENAI", "gpt-4.1")
    usage = {rid: row["usage"] for rid, row in rows.items()}
    assert [usage[f"r{i}"].get("cached_tokens", 0) for i in range(5)] == [0] + [1200] * 4
    assert "cache_creation_tokens" not in json.dumps(usage)  # OpenAI bills no cache writes
    # gpt-4.1 in the price list: $2 in, $8 out, $0.50 cached in.
    expected = sum(
        ((u["prompt_tokens"] - u.get("cached_tokens", 0)) * 2.00
         + u.get("cached_tokens", 0) * 0.50 + u["completion_tokens"] * 8.00) / 1e6
        for u in usage.values()
    )  # fmt: skip
    assert summary["cached_tokens"] == 4800 and "cache_creation_tokens" not in summary
    assert summary["cost_usd"] == pytest.approx(expected, abs=1e-8)


@pytest.mark.parametrize(
    "engine, model", [("ANTHROPIC", "claude-sonnet-4-5"), ("OPENAI", "gpt-4.1")]
)
def test_a_provider_batch_carries_the_marks_and_its_rows_the_cache_usage(tmp_path, engine, model):
    fast = ["--provider-batch", "--remote_params.batch_poll_max_s", "0.1"]
    with LLMServer(Faults(batch=BatchFaults(step_s=0.1))) as server:
        rows, summary, _ = job(tmp_path, server, engine, model, *fast)
        live_server_requests = server.stats.requests
    assert live_server_requests == 0  # every row went through the batch API
    usage = {rid: row["usage"] for rid, row in rows.items()}
    reads = [usage[f"r{i}"].get("cached_tokens", 0) for i in range(5)]
    writes = [usage[f"r{i}"].get("cache_creation_tokens", 0) for i in range(5)]
    if engine == "ANTHROPIC":  # the batch's lines carry the marks the live requests would
        assert (writes, reads) == ([0, 1200, 0, 0, 0], [0, 0, 1200, 1200, 1200])
        prices = (3.00, 0.30, 3.75, 15.00)
    else:
        assert (writes, reads) == ([0] * 5, [0] + [1200] * 4)
        prices = (2.00, 0.50, 2.00, 8.00)
    live = sum(
        ((u["prompt_tokens"] - u.get("cached_tokens", 0) - u.get("cache_creation_tokens", 0))
         * prices[0] + u.get("cached_tokens", 0) * prices[1]
         + u.get("cache_creation_tokens", 0) * prices[2] + u["completion_tokens"] * prices[3])
        / 1e6 for u in usage.values()
    )  # fmt: skip
    assert summary["cost_live_usd"] == pytest.approx(live, abs=1e-8)
    assert summary["cost_usd"] == pytest.approx(live / 2, abs=1e-8)  # the batch price


def test_gemini_batch_results_read_the_cached_share_of_the_prompt():
    from lmpress.wire.gemini import parse_generate_content

    data = {"candidates": [{"index": 0, "finishReason": "STOP",
                            "content": {"role": "model", "parts": [{"text": "ok"}]}}],
            "usageMetadata": {"promptTokenCount": 2100, "cachedContentTokenCount": 2048,
                              "candidatesTokenCount": 1}}  # fmt: skip
    usage = parse_generate_content(data).usage
    assert (usage.prompt_tokens, usage.cached_tokens, usage.completion_tokens) == (2100, 2048, 1)
