"""`lmpress infer --task embed|score|rerank`: the vector or the scores of one text, through the
remote engines against the loopback server."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_lmpress
from tests.servers.embeddings import score, vector
from tests.servers.llm_server import LLMServer

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def server():
    with LLMServer() as s:
        yield s


def infer(server: LLMServer, engine: str, task: str, *more: str):
    return run_lmpress(
        "infer", "--engine", engine, "--task", task, "--model.model_name", "m",
        "--remote_params.api_url", server.openai_url, *more, env={"OPENAI_API_KEY": "k"},
    )  # fmt: skip


def test_embed_prints_the_size_and_first_values_or_the_json(server):
    run = infer(server, "OPENAI", "embed", "hello world")
    assert run.returncode == 0, run.stderr
    first = ", ".join(f"{v:.4f}" for v in vector("hello world")[:8])
    assert run.stdout == f"16 values: [{first}, ...]\n"
    run = infer(server, "OPENAI", "embed", "hello world", "--json")
    row = json.loads(run.stdout)
    assert row["embedding"] == vector("hello world")
    assert row["response"]["usage"]["prompt_tokens"] == 2


def test_rerank_prints_the_documents_best_first(server):
    docs = ["a doc", "b doc", "c doc"]
    args = [arg for doc in docs for arg in ("--document", doc)]
    run = infer(server, "REMOTE_VLLM", "rerank", "query", *args)
    assert run.returncode == 0, run.stderr
    ranked = sorted(docs, key=lambda d: -score("query", d))
    assert run.stdout == "".join(f"{score('query', d):.4f}  {d}\n" for d in ranked)


def test_a_score_without_documents_and_documents_without_a_task_are_refused(server):
    run = infer(server, "REMOTE_VLLM", "score", "query")
    assert run.returncode == 2
    assert (
        run.stderr == "lmpress: error: --task score: give the documents to score, --document TEXT\n"
    )
    run = infer(server, "OPENAI", "generate", "hi", "--json")
    assert run.returncode == 2 and "--json is for --task embed" in run.stderr


def test_the_chat_refuses_a_pooling_task_in_one_line(server):
    run = run_lmpress(
        "chat", "--engine", "OPENAI", "--task", "embed", "--model.model_name", "m",
        "--remote_params.api_url", server.openai_url, input="", env={"OPENAI_API_KEY": "k"},
    )  # fmt: skip
    assert run.returncode == 2
    assert run.stderr == (
        "lmpress: error: task: the chat generates text; embed runs through lmpress infer, "
        "batch or serve (--task embed)\n"
    )
