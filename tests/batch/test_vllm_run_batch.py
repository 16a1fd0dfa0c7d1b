"""The inputs of vLLM's own `run-batch` tests (chat, completions, embeddings, score in both of its
forms, rerank at each of its urls, and invalid lines), restated in our own data and run through
`lmpress batch` on the model kinds vLLM runs them on: a model that generates (tiny:llama), an
embedding model (MiniLM, real weights) and a cross-encoder (tiny:cross-encoder), none given
`--task`, since the lines' urls say what each asks. Every input line gets exactly one output or
error line, and every body has vLLM's response shape (`tests/wire/openai/vllm_shapes.py`)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from openai.types import Completion, CreateEmbeddingResponse
from openai.types.chat import ChatCompletion

from lmpress.builtin_models.packaged import resolve_packaged_name
from tests.conftest import run_lmpress
from tests.wire.openai.vllm_shapes import BatchOutputLine, RerankResponse, ScoreResponse

pytestmark = pytest.mark.timeout(300)

SYSTEMS = ["You answer briefly.", "You answer at length."]
QUESTION = "Which city is the capital of Italy?"
CANDIDATES = ["Rome is the capital of Italy.", "Lisbon is the capital of Portugal."]


def line(custom_id: str, url: str, body: dict) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body}


def chat(custom_id: str, system: str, **more) -> dict:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "Good day!"}]
    return line(custom_id, "/v1/chat/completions", {"model": "m", "messages": messages, **more})


def write_lines(path: Path, lines: list) -> Path:
    text = "".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in lines)
    path.write_text(text, encoding="utf-8")
    return path


def run_batch(tmp_path: Path, lines: list, *args: str) -> tuple[int, dict, dict]:
    """Exit code, output lines by custom_id, and error lines by input line number; every
    input line in exactly one of the two."""
    src = write_lines(tmp_path / "in.jsonl", lines)
    out = tmp_path / "out.jsonl"
    run = run_lmpress("batch", "-i", str(src), "-o", str(out), "--engine", "NATIVE", *args)
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
    outputs = [json.loads(text) for text in out.read_text().splitlines()] if out.exists() else []
    errors_file = tmp_path / "out.jsonl.errors.jsonl"
    errors = [json.loads(text) for text in errors_file.read_text().splitlines()] if (
        errors_file.exists()
    ) else []  # fmt: skip
    for output in outputs:
        # lmpress's one addition to vLLM's line: a reply from the response cache says so. Two
        # identical bodies in one job (as below) may meet there, the second finding the first's
        # reply or not as the rows' timing goes (a random-order run of the suite met it).
        assert output.pop("cached", True) is True
        BatchOutputLine.model_validate(output)
        assert output["error"] is None and output["response"]["status_code"] == 200
    for error in errors:
        if "custom_id" not in error:  # a line that is no JSON, so no OpenAI Batch line either
            assert error["error"]["message"] and error["id"] == f"line-{error['line']}"
            continue
        # The OpenAI Batch error line, with the input line it is for beside it.
        parsed = BatchOutputLine.model_validate({k: v for k, v in error.items() if k != "line"})
        assert parsed.error["message"] and parsed.response.status_code >= 400
    by_id = {output["custom_id"]: output for output in outputs}
    by_line = {error["line"]: error for error in errors}
    assert len(by_id) == len(outputs) and len(by_line) == len(errors)
    assert len(outputs) + len(errors) == len(lines), (outputs, errors)
    return run.returncode, by_id, by_line


def test_generation_lines_and_invalid_ones_each_get_a_line(tmp_path):
    lines = [
        chat("chat-1", SYSTEMS[0], max_tokens=6),
        chat("chat-2", SYSTEMS[1], max_tokens=6),
        line("text-1", "/v1/completions", {"model": "m", "prompt": "Once upon", "max_tokens": 6}),
        line("bad-url", "/v1/not-an-endpoint", {"model": "m", "prompt": "x"}),
        chat("streamed", SYSTEMS[0], stream=True),
        {"no_custom_id": "x", "method": "POST", "url": "/v1/chat/completions", "body": {}},
        "{not json",
        line("scored", "/score", {"model": "m", "queries": QUESTION, "documents": CANDIDATES}),
        line("embedded", "/v1/embeddings", {"model": "m", "input": QUESTION}),
    ]
    code, outputs, errors = run_batch(tmp_path, lines, "--model.model_name", "tiny:llama")
    assert code == 1
    assert sorted(outputs) == ["chat-1", "chat-2", "text-1"]
    for custom_id in ("chat-1", "chat-2"):
        ChatCompletion.model_validate(outputs[custom_id]["response"]["body"])
    Completion.model_validate(outputs["text-1"]["response"]["body"])
    assert sorted(errors) == [4, 5, 6, 7, 8, 9]
    assert errors[4]["error"]["message"].startswith('url "/v1/not-an-endpoint" is not supported')
    assert errors[5]["error"]["message"] == (
        "body.stream: streaming is not available in a batch file"
    )
    assert errors[6]["error"]["message"] == "'custom_id' must be a non-empty string"
    assert errors[7]["error"]["kind"] == "invalid_json"
    # A line the model cannot answer fails alone, saying why, and the others ran.
    assert errors[8]["custom_id"] == "scored" and errors[8]["error"]["message"] == (
        "a /score line asks to score, which 'tiny:llama' on NATIVE cannot (it answers "
        "generate); run these lines with a cross-encoder or an embedding model"
    )
    assert errors[9]["error"]["message"] == (
        "a /v1/embeddings line asks to embed, which 'tiny:llama' on NATIVE cannot (it answers "
        "generate); run these lines with an embedding model"
    )


def test_score_in_both_forms_and_rerank_at_every_url_on_a_cross_encoder(tmp_path):
    current = {"model": "m", "queries": QUESTION, "documents": CANDIDATES}
    older = {"model": "m", "text_1": QUESTION, "text_2": CANDIDATES}
    rerank = {"model": "m", "query": QUESTION, "documents": CANDIDATES}
    lines = [
        line("score-short-url", "/score", current),
        line("score-current", "/v1/score", current),
        line("score-older", "/v1/score", older),
        line("rerank-short-url", "/rerank", rerank),
        line("rerank-v1", "/v1/rerank", rerank),
        line("rerank-v2", "/v2/rerank", {**rerank, "top_n": 0}),  # vLLM's default: every one
        line("embedded", "/v1/embeddings", {"model": "m", "input": QUESTION}),
    ]
    code, outputs, errors = run_batch(tmp_path, lines, "--model.model_name", "tiny:cross-encoder")
    assert code == 1 and list(errors) == [7]
    assert errors[7]["error"]["message"] == (
        "a /v1/embeddings line asks to embed, which 'tiny:cross-encoder' on NATIVE cannot (it "
        "answers rerank, score); run these lines with an embedding model"
    )
    scores = {}
    for custom_id in ("score-short-url", "score-current", "score-older"):
        body = ScoreResponse.model_validate(outputs[custom_id]["response"]["body"])
        assert body.usage.prompt_tokens > 0
        scores[custom_id] = [d.score for d in body.data]
    # Alike but for the padding of the batch each pair was read in.
    want = pytest.approx(scores["score-current"], abs=1e-4)
    assert scores["score-short-url"] == want and scores["score-older"] == want
    assert len(scores["score-current"]) == 2
    for custom_id in ("rerank-short-url", "rerank-v1", "rerank-v2"):
        body = RerankResponse.model_validate(outputs[custom_id]["response"]["body"])
        assert body.usage.prompt_tokens == body.usage.total_tokens > 0
        got = {r.index: r.relevance_score for r in body.results}
        assert [got[0], got[1]] == want
        assert body.results[0].relevance_score >= body.results[1].relevance_score


def test_embeddings_lines_run_on_minilm_with_its_own_vectors(tmp_path):
    from sentence_transformers import SentenceTransformer

    texts = [QUESTION, *CANDIDATES]
    lines = [
        *(line(f"embed-{i}", "/v1/embeddings", {"model": "m", "input": t}) for i, t in
          enumerate(texts)),
        line("score-1", "/v1/score", {"model": "m", "queries": QUESTION, "documents": CANDIDATES}),
        chat("chat-1", SYSTEMS[0]),
    ]  # fmt: skip
    code, outputs, errors = run_batch(tmp_path, lines, "--model.model_name", "minilm")
    assert code == 1 and list(errors) == [5]
    assert errors[5]["error"]["message"] == (
        "a /v1/chat/completions line asks to generate, which 'minilm' on NATIVE cannot (it "
        "answers embed, rerank, score); run these lines with a model that generates text"
    )
    model = SentenceTransformer(resolve_packaged_name("minilm"), device="cpu")
    want = model.encode(texts, convert_to_numpy=True)
    bodies = [
        CreateEmbeddingResponse.model_validate(outputs[f"embed-{i}"]["response"]["body"])
        for i in range(len(texts))
    ]
    got = np.array([body.data[0].embedding for body in bodies], dtype=np.float32)
    cosines = (got * want).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
    assert cosines.min() >= 0.9999
    # An embedding model scores by its vectors' cosine, as vLLM scores with one.
    scored = ScoreResponse.model_validate(outputs["score-1"]["response"]["body"])
    expected = [float(want[0] @ w / np.linalg.norm(want[0]) / np.linalg.norm(w)) for w in want[1:]]
    assert [d.score for d in scored.data] == pytest.approx(expected, abs=1e-4)


def test_a_chosen_task_refuses_the_lines_of_another_one_by_one(tmp_path):
    lines = [
        line("embed-1", "/v1/embeddings", {"model": "m", "input": QUESTION}),
        line("score-1", "/v1/score", {"model": "m", "queries": QUESTION, "documents": CANDIDATES}),
    ]
    args = ("--model.model_name", "tiny:cross-encoder", "--task", "rerank")
    code, outputs, errors = run_batch(tmp_path, lines, *args)
    assert code == 1 and list(outputs) == ["score-1"] and list(errors) == [1]
    assert errors[1]["error"]["message"] == (
        "a /v1/embeddings line in a rerank run (task rerank was chosen, by --task or the "
        "recipe); leave the task out to run each line by its url"
    )
