"""Embed runs through the real `lmpress batch` command and the OPENAI engine against the
loopback server: plain rows, OpenAI Batch lines in and out, Parquet, the dry run, faults,
kill -9 and resume, and a resumed output's task."""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, run_lmpress
from tests.dryrun.test_dry_run_and_budget_cli import table
from tests.servers.embeddings import score, vector
from tests.servers.llm_server import Faults, LLMServer

pytestmark = pytest.mark.timeout(180)

MODEL = "text-embedding-3-small"  # priced at $0.02 per million input tokens


@pytest.fixture(autouse=True)
def key(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-key")


@pytest.fixture(scope="module")
def server():
    with LLMServer() as s:
        yield s


def embed_args(server: LLMServer, src: Path, out: Path, *more: str) -> list[str]:
    return [
        "batch", "-i", str(src), "-o", str(out), "--engine", "OPENAI", "--task", "embed",
        "--model.model_name", MODEL, "--remote_params.api_url", server.openai_url,
        "--remote_params.retry_backoff_base", "0.01", "--remote_params.retry_backoff_max",
        "0.2", *more,
    ]  # fmt: skip


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def from_base64(text: str) -> list[float]:
    raw = base64.b64decode(text)
    return list(struct.unpack(f"<{len(raw) // 4}f", raw))


def test_plain_rows_get_their_vectors_and_a_chat_row_fails_alone(tmp_path, server):
    src = write_jsonl(
        tmp_path / "in.jsonl",
        [
            {"id": "a", "input": "hello world"},
            {"id": "b", "input": ["one", "two three"]},
            {"id": "c", "messages": [{"role": "user", "content": "hi"}]},
            {"id": "d", "input": [5, 6, 7]},
        ],
    )
    out = tmp_path / "out.jsonl"
    run = run_lmpress(*embed_args(server, src, out))
    assert run.returncode == 1, run.stderr  # one row failed
    rows = {row["id"]: row for row in read_jsonl(out)}
    assert rows["a"]["embedding"] == vector("hello world")
    assert rows["b"]["embeddings"] == [vector("one"), vector("two three")]
    assert rows["d"]["embedding"] == vector([5, 6, 7])
    assert rows["a"]["response"]["usage"] == {"prompt_tokens": 2, "total_tokens": 2}
    assert rows["a"]["response"]["truncated"] is False
    assert rows["a"]["response"]["cost_usd"] == pytest.approx(2 * 0.02 / 1e6)
    # The job's cost is what its rows cost, however small: a ten-millionth of a dollar a row
    # is not rounded away in the summary.
    summary = json.loads((tmp_path / "out.jsonl.summary.json").read_text())
    costs = [row["response"]["cost_usd"] for row in rows.values()]
    assert summary["cost_usd"] == pytest.approx(sum(costs), rel=1e-5) and summary["cost_usd"] > 0
    # No tokens are written, so the rate the table shows is the input's.
    read = sum(row["response"]["usage"]["prompt_tokens"] for row in rows.values())
    assert summary["prompt_tokens"] == read and summary["completion_tokens"] == 0
    # The summary writes wall_s and the rate to the millisecond and the thousandth, and the rate
    # comes from the unrounded time: a run of 46 ms is 1% off its rounded time, so the bounds
    # are the rates half a millisecond either way gives (a trial run saw 175.704 against 173.91).
    wall, half = summary["wall_s"], 0.0005
    assert (
        read / (wall + half) - half <= summary["input_tokens_per_s"] <= read / (wall - half) + half
    )
    assert re.search(r"│ input tokens/s +│ +[\d.]+ │", run.stderr), run.stderr
    assert "│ tokens/s" not in run.stderr
    assert "c" not in rows
    said = [line for line in run.stderr.splitlines() if ":3:" in line]
    assert said == [f"lmpress: {src}:3: a chat row in an embed run; give 'input' (or "
                    f"--text-column COL), or an OpenAI Batch line to /v1/embeddings"]  # fmt: skip
    assert "Traceback" not in run.stderr and "sk-test-key" not in run.stderr + run.stdout
    (error,) = read_jsonl(tmp_path / "out.jsonl.errors.jsonl")
    assert error["id"] == "c" and error["error"]["kind"] == "invalid_row"


def test_openai_batch_lines_in_openai_batch_lines_out(tmp_path, server):
    def line(cid: str, **body) -> dict:
        return {"custom_id": cid, "method": "POST", "url": "/v1/embeddings",
                "body": {"model": MODEL, **body}}  # fmt: skip

    src = write_jsonl(
        tmp_path / "in.jsonl",
        [
            line("e1", input="first text"),
            line("e2", input=["a", "b c"], encoding_format="base64", dimensions=4),
            line("e3", input="x", colour=3),
        ],
    )
    out = tmp_path / "out.jsonl"
    run = run_lmpress(*embed_args(server, src, out))
    assert run.returncode == 1, run.stderr
    lines = {row["custom_id"]: row for row in read_jsonl(out)}
    assert set(lines) == {"e1", "e2"}
    from openai.types import CreateEmbeddingResponse

    first = CreateEmbeddingResponse.model_validate(lines["e1"]["response"]["body"])
    assert first.data[0].embedding == vector("first text") and first.usage.prompt_tokens == 2
    second = lines["e2"]["response"]["body"]["data"]
    assert [from_base64(item["embedding"]) for item in second] == [vector("a", 4), vector("b c", 4)]
    (error,) = read_jsonl(tmp_path / "out.jsonl.errors.jsonl")
    assert error["custom_id"] == "e3" and error["response"]["status_code"] == 400
    assert error["error"]["message"] == "Unrecognized request argument supplied: body.colour"


def test_a_table_column_to_parquet_as_fixed_size_float32_vectors(tmp_path, server):
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = [f"document number {i}" for i in range(6)]
    src = tmp_path / "in.parquet"
    pq.write_table(pa.table({"doc": texts, "n": list(range(6))}), src)
    out = tmp_path / "out.parquet"
    run = run_lmpress(*embed_args(server, src, out, "--text-column", "doc", "--limit", "5"))
    assert run.returncode == 0, run.stderr
    table = pq.read_table(out).sort_by("n")
    assert table.schema.field("embedding").type == pa.list_(pa.float32(), 16)
    assert table.column("embedding").to_pylist() == [vector(t) for t in texts[:5]]
    assert table.column("prompt_tokens").to_pylist() == [3] * 5


def test_dry_run_counts_input_tokens_and_prices_them(tmp_path, server):
    src = write_jsonl(tmp_path / "in.jsonl", [{"input": "x" * 400}, {"input": ["y" * 40, "z"]}])
    server.reset()
    run = run_lmpress(*embed_args(server, src, tmp_path / "out.jsonl", "--dry-run"))
    assert run.returncode == 0, run.stderr
    shown = table(run.stderr)
    # OPENAI publishes no tokenizer: ~4 characters a token, plus one, per input.
    assert shown["prompt tokens"] == f"~{101 + 11 + 1}"
    assert shown["output tokens, at most"] == "0"
    assert (
        "$0.02 in" in shown["price per million tokens"]
        and MODEL in shown["price per million tokens"]
    )
    assert server.stats.requests == 0 and not (tmp_path / "out.jsonl").exists()


def test_a_429_storm_still_gets_every_row_once(tmp_path):
    faults = Faults(transient_rate=1.0, transient_kinds=("429",), retry_after="0")
    src = write_jsonl(tmp_path / "in.jsonl", [{"id": str(i), "input": f"t {i}"} for i in range(20)])
    out = tmp_path / "out.jsonl"
    with LLMServer(faults) as server:
        run = run_lmpress(*embed_args(server, src, out))
        statuses = server.stats.statuses
    assert run.returncode == 0, run.stderr
    rows = read_jsonl(out)
    assert sorted(int(r["id"]) for r in rows) == list(range(20))
    assert all(r["embedding"] == vector(f"t {r['id']}") for r in rows)
    assert statuses[429] == 20 and statuses[200] == 20


def test_kill_9_mid_job_then_resume_writes_every_row_once(tmp_path):
    rows = 40
    src = write_jsonl(
        tmp_path / "in.jsonl", [{"id": str(i), "input": f"r {i}"} for i in range(rows)]
    )
    out = tmp_path / "out.jsonl"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    # The server answers 16 rows and holds the rest until the kill has landed: the job is
    # mid-way then, however fast the machine ran the first rows.
    with LLMServer(Faults(hold_after=16)) as server:
        args = embed_args(server, src, out, "--remote_params.num_workers", "2")
        proc = subprocess.Popen([sys.executable, "-m", "lmpress", *args], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert proc.poll() is None, "the job ended before the kill"
            if out.exists() and out.read_bytes().count(b"\n") >= 8:
                break
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        before = out.read_bytes().count(b"\n")
        assert 8 <= before <= 16 < rows
        server.release()
        run = run_lmpress(*embed_args(server, src, out), env=env)
    assert run.returncode == 0, run.stderr
    ids = [r["id"] for r in read_jsonl(out)]
    assert sorted(ids, key=int) == [str(i) for i in range(rows)]  # each once


def test_a_resumed_output_refuses_another_task(tmp_path, server):
    src = write_jsonl(tmp_path / "in.jsonl", [{"id": "a", "input": "x"}])
    out = tmp_path / "out.jsonl"
    assert run_lmpress(*embed_args(server, src, out)).returncode == 0
    args = embed_args(server, src, out)
    args[args.index("embed")] = "generate"
    run = run_lmpress(*args)
    assert run.returncode == 2
    assert 'task was "embed", now "generate"' in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1 and "Traceback" not in run.stderr


def test_an_engine_that_cannot_embed_is_refused_in_one_line(tmp_path, server):
    src = write_jsonl(tmp_path / "in.jsonl", [{"id": "a", "input": "x"}])
    run = run_lmpress(
        "batch", "-i", str(src), "-o", str(tmp_path / "o.jsonl"), "--engine", "DEEPSEEK",
        "--task", "embed", "--model.model_name", "m", "--remote_params.api_url",
        server.openai_url,
        env={"DEEPSEEK_API_KEY": "k"},
    )  # fmt: skip
    assert run.returncode == 2
    assert "engine DEEPSEEK cannot embed" in run.stderr and "Traceback" not in run.stderr


def vllm_args(server: LLMServer, src: Path, out: Path, task: str) -> list[str]:
    args = embed_args(server, src, out)
    args[args.index("OPENAI")] = "REMOTE_VLLM"
    args[args.index("embed")] = task
    return args


def test_rerank_rows_come_back_best_first_cut_to_top_n(tmp_path, server):
    docs = ["alpha doc", "beta doc", "gamma doc", "delta doc"]
    src = write_jsonl(
        tmp_path / "in.jsonl",
        [
            {"id": "r", "query": "which one", "documents": docs, "top_n": 2},
            {"id": "p", "text_1": "which one", "text_2": docs[:2]},
            {"id": "bad", "query": "q"},
            {"id": "e", "input": "an embed row"},
        ],
    )
    out = tmp_path / "out.jsonl"
    run = run_lmpress(*vllm_args(server, src, out, "rerank"))
    assert run.returncode == 1, run.stderr
    rows = {row["id"]: row for row in read_jsonl(out)}
    expected = sorted(((score("which one", d), i) for i, d in enumerate(docs)), reverse=True)
    assert rows["r"]["results"] == [
        {"index": i, "relevance_score": s, "document": {"text": docs[i]}} for s, i in expected[:2]
    ]
    assert [r["index"] for r in rows["p"]["results"]] == sorted(
        range(2), key=lambda i: -score("which one", docs[i])
    )
    errors = {
        e["id"]: e["error"]["message"] for e in read_jsonl(tmp_path / "out.jsonl.errors.jsonl")
    }
    assert errors == {
        "bad": "Missing required parameter: 'documents'",
        "e": "a row with keys id, input in a rerank run; give 'query' and 'documents' (or "
        "'queries' and 'documents', or 'text_1' and 'text_2')",
    }


def test_score_lines_in_openai_batch_out_in_vllm_s_shapes(tmp_path, server):
    src = write_jsonl(
        tmp_path / "in.jsonl",
        [
            {"custom_id": "s", "method": "POST", "url": "/v1/score",
             "body": {"model": "m", "text_1": "q", "text_2": ["a", "b"]}},
            {"custom_id": "k", "method": "POST", "url": "/v1/rerank",
             "body": {"model": "m", "query": "q", "documents": ["a", "b"], "top_n": 1}},
        ],
    )  # fmt: skip
    out = tmp_path / "out.jsonl"
    run = run_lmpress(*vllm_args(server, src, out, "score"))
    assert run.returncode == 0, run.stderr
    bodies = {row["custom_id"]: row["response"]["body"] for row in read_jsonl(out)}
    assert [d["score"] for d in bodies["s"]["data"]] == [score("q", "a"), score("q", "b")]
    best = max(range(2), key=lambda i: score("q", "ab"[i]))
    assert [r["index"] for r in bodies["k"]["results"]] == [best]


def test_pairwise_score_rows_and_lines_score_text_1_i_with_text_2_i(tmp_path, server):
    src = write_jsonl(
        tmp_path / "in.jsonl",
        [
            {"custom_id": "s", "method": "POST", "url": "/v1/score",
             "body": {"model": "m", "text_1": ["q1", "q2"], "text_2": ["a", "b"]}},
            {"id": "p", "text_1": ["x", "y", "z"], "text_2": ["a", "b", "c"]},
            {"id": "bad", "text_1": ["x", "y"], "text_2": ["a", "b", "c"]},
        ],
    )  # fmt: skip
    out = tmp_path / "out.jsonl"
    run = run_lmpress(*vllm_args(server, src, out, "score"))
    assert run.returncode == 1, run.stderr
    rows = {row.get("custom_id") or row["id"]: row for row in read_jsonl(out)}
    data = rows["s"]["response"]["body"]["data"]
    assert [d["score"] for d in data] == [score("q1", "a"), score("q2", "b")]
    assert rows["p"]["scores"] == [score("x", "a"), score("y", "b"), score("z", "c")]
    errors = {
        e["id"]: e["error"]["message"] for e in read_jsonl(tmp_path / "out.jsonl.errors.jsonl")
    }
    assert errors == {
        "bad": "'text_1' has 2 texts and 'text_2' 3: give one text_1 to score against every "
        "text_2, or as many as text_2 to score them pairwise (text_1[i] with text_2[i])"
    }


def test_a_token_budget_stops_an_embed_run_and_the_next_run_finishes_it(tmp_path, server):
    src = write_jsonl(
        tmp_path / "in.jsonl", [{"id": str(i), "input": f"w{i} x"} for i in range(20)]
    )
    out = tmp_path / "out.jsonl"
    args = embed_args(server, src, out, "--remote_params.num_workers", "1")
    run = run_lmpress(*args, "--max-tokens", "6")
    assert "stopping: used 6 tokens of --max-tokens 6" in run.stderr
    first = len(read_jsonl(out))
    assert 3 <= first < 20  # two tokens a row; the rows in flight finish
    assert run_lmpress(*args).returncode == 0
    assert sorted(int(r["id"]) for r in read_jsonl(out)) == list(range(20))


CANNOT = "pick an engine that can ('lmpress engines' lists what each answers)"


@pytest.mark.parametrize(
    ("engine", "task", "said"),
    [
        # OpenAI's Batch API takes embed runs (tests/batch/test_provider_batch_cli.py); OPENAI
        # has no /v1/score, live or batched.
        ("OPENAI", "score",
         f"task: engine OPENAI cannot score (it answers embed, generate); {CANNOT}"),
        # vLLM's server scores and reranks, but has no batch API.
        ("REMOTE_VLLM", "rerank",
         "engine REMOTE_VLLM has no batch API lmpress can drive (OPENAI, ANTHROPIC, GEMINI "
         "and OpenAI-compatible servers with /v1/batches do); drop --provider-batch to run live"),
        # Anthropic has no embeddings, in Message Batches or out.
        ("ANTHROPIC", "embed",
         f"task: engine ANTHROPIC cannot embed (it answers generate); {CANNOT}"),
    ],
)  # fmt: skip
def test_a_pooling_run_no_batch_api_takes_is_refused_in_one_line(
    tmp_path, server, engine, task, said
):
    row = {"id": "a", "input": "x"} if task == "embed" else {"query": "q", "documents": ["d"]}
    src = write_jsonl(tmp_path / "in.jsonl", [row])
    server.reset()
    run = run_lmpress(
        "batch", "-i", str(src), "-o", str(tmp_path / "o.jsonl"), "--engine", engine, "--task",
        task, "--model.model_name", "m", "--remote_params.api_url", server.openai_url,
        "--provider-batch",
        env={"ANTHROPIC_API_KEY": "sk-ant-test"},
    )  # fmt: skip
    assert run.returncode == 2
    assert run.stderr == f"lmpress: error: {said}\n"
    assert server.stats.requests == 0 and server.stats.batches_created == 0


def test_a_provider_batch_takes_the_tasks_its_batch_api_and_its_provider_both_answer():
    """A provider row whose server scores and has OpenAI's Batch API (none ships today): its
    embed run may go by batch, its score run may not, since no batch API has /v1/score."""
    from lmpress.batch.options import BatchMode
    from lmpress.batch.pooling import check_mode
    from lmpress.configs import load_config
    from lmpress.engines.remote.openai_compat import OpenAICompatEngine
    from lmpress.engines.remote.presets import POOLING, BatchApi, Provider
    from lmpress.vocabulary.errors import ConfigError

    row = Provider("SCORER", "a scoring server with batches", batch_api=BatchApi.OPENAI,
                   tasks=POOLING)  # fmt: skip
    engine = type("ScorerEngine", (OpenAICompatEngine,),
                  {"name": "SCORER", "tasks": POOLING, "provider": row})  # fmt: skip
    for task in ("generate", "embed"):
        config = load_config(None, {"engine": "REMOTE", "task": task})
        check_mode(config, BatchMode.PROVIDER, engine)
    for task in ("score", "rerank"):
        config = load_config(None, {"engine": "REMOTE", "task": task})
        with pytest.raises(ConfigError) as refused:
            check_mode(config, BatchMode.PROVIDER, engine)
        assert str(refused.value) == (
            f"--provider-batch: OpenAI's Batch API takes no {task} run (only embed and "
            f"generate); drop --provider-batch, and remote_params.batch_completion_window "
            f"where the recipe sets it, to run it live"
        )


def test_an_output_from_before_tasks_resumes_as_a_generate_run_only(tmp_path):
    from lmpress.configs import load_config
    from lmpress.data.resume import JobFiles, check_fingerprint, fingerprint
    from lmpress.vocabulary.errors import InputError

    files = JobFiles.beside(tmp_path / "out.jsonl")
    generate = load_config(None, {"engine": "OPENAI", "model.model_name": MODEL})
    older = fingerprint(generate, {})
    del older["task"]  # as lmpress wrote it before runs had a task
    files.fingerprint.write_text(json.dumps({"settings": older}))
    check_fingerprint(files, fingerprint(generate, {}))
    embed = load_config(None, {"engine": "OPENAI", "model.model_name": MODEL, "task": "embed"})
    with pytest.raises(InputError, match='task was "generate", now "embed"'):
        check_fingerprint(files, fingerprint(embed, {}))
