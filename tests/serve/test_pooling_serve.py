"""`lmpress serve`'s /v1/embeddings with the official `openai` client, float and base64, over
the OPENAI engine and the loopback server behind it; the routes of a task it does not run;
vLLM's score and rerank bodies, at every path vLLM answers them on, in its response shapes;
vLLM's classify and pooling bodies on a classifier and a reward model."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from lmpress.builtin_models.tiny import CLASSES, tiny_model
from tests.conftest import run_lmpress
from tests.servers.embeddings import score, vector
from tests.servers.llm_server import LLMServer
from tests.wire.openai.vllm_shapes import (
    ClassificationResponse,
    PoolingResponse,
    RerankResponse,
    ScoreResponse,
)

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def backend():
    with LLMServer() as server:
        yield server


@pytest.fixture(scope="module")
def embed_server(serve_process, backend):
    return serve_process(
        "--engine", "OPENAI", "--task", "embed", "--model.model_name", "text-embedding-3-small",
        "--remote_params.api_url", backend.openai_url, "--api-key", "serve-key",
        env={"OPENAI_API_KEY": "sk-upstream"},
    )  # fmt: skip


def test_the_openai_client_gets_float_and_base64_vectors(embed_server):
    client = embed_server.client(api_key="serve-key")
    texts = ["first text", "second, longer text"]
    floats = client.embeddings.create(
        model="text-embedding-3-small", input=texts, encoding_format="float"
    )
    assert [item.embedding for item in floats.data] == [vector(t) for t in texts]
    assert floats.usage.prompt_tokens == 2 + 3 and floats.model == "text-embedding-3-small"
    # No encoding_format: the client asks for base64 and decodes it itself.
    decoded = client.embeddings.create(model="text-embedding-3-small", input="x y", dimensions=5)
    assert decoded.data[0].embedding == vector("x y", 5)
    raw = embed_server.http().post(
        "/v1/embeddings",
        json={"model": "text-embedding-3-small", "input": "x y", "encoding_format": "base64"},
        headers={"Authorization": "Bearer serve-key"},
    )
    assert isinstance(raw.json()["data"][0]["embedding"], str)


def test_too_many_inputs_or_too_long_an_input_is_a_400_naming_the_cap(embed_server):
    """The default caps (issue 49): 256 inputs a request, 1 MiB an input."""

    def post(input: object) -> dict:
        response = embed_server.http().post(
            "/v1/embeddings", json={"model": "text-embedding-3-small", "input": input},
            headers={"Authorization": "Bearer serve-key"},
        )  # fmt: skip
        assert response.status_code == 400, response.text
        return response.json()["error"]

    many = post([f"text {i}" for i in range(257)])
    assert "257 items in 'input' is over serve.max_prompts_per_request=256" in many["message"]
    assert many["param"] == "input"
    long = post(["short", "x" * (1024 * 1024 + 1)])
    assert "a prompt of 1048577 bytes is over serve.max_prompt_bytes=1048576" in long["message"]
    client = embed_server.client(api_key="serve-key")
    at_caps = client.embeddings.create(model="text-embedding-3-small", input=["a b"] * 256)
    assert len(at_caps.data) == 256


def test_concurrent_requests_each_get_their_own_vector(embed_server):
    client = embed_server.async_client(api_key="serve-key")

    async def run():
        calls = [
            client.embeddings.create(model="text-embedding-3-small", input=f"text {i}")
            for i in range(16)
        ]
        return await asyncio.gather(*calls)

    replies = asyncio.run(run())
    assert [r.data[0].embedding for r in replies] == [vector(f"text {i}") for i in range(16)]


def test_bad_bodies_keys_and_tasks_answer_in_openai_s_shape(embed_server):
    http = embed_server.http()
    auth = {"Authorization": "Bearer serve-key"}
    unknown = http.post("/v1/embeddings", json={"model": "text-embedding-3-small", "input": "a",
                                                "colour": 1}, headers=auth)  # fmt: skip
    assert unknown.status_code == 400
    assert unknown.json()["error"]["message"] == "Unrecognized request argument supplied: colour"
    no_key = http.post("/v1/embeddings", json={"model": "text-embedding-3-small", "input": "a"})
    assert no_key.status_code == 401
    chat = http.post(
        "/v1/chat/completions",
        json={"model": "text-embedding-3-small", "messages": [{"role": "user", "content": "a"}]},
        headers=auth,
    )
    assert chat.status_code == 400
    assert chat.json()["error"]["message"] == (
        "/v1/chat/completions: this server runs the embed task; start it with --task generate "
        "(on an engine that can generate) to serve /v1/chat/completions"
    )
    rerank = http.post("/v1/rerank", json={"model": "m", "query": "q", "documents": ["d"]},
                       headers=auth)  # fmt: skip
    assert rerank.status_code == 400 and "--task rerank" in rerank.json()["error"]["message"]
    assert "sk-upstream" not in embed_server.log and "serve-key" not in json.dumps(rerank.json())


def test_rerank_and_score_in_vllm_s_shapes_over_remote_vllm(serve_process, backend):
    served = serve_process(
        "--engine", "REMOTE_VLLM", "--task", "rerank", "--model.model_name", "reranker",
        "--remote_params.api_url", backend.openai_url,
    )  # fmt: skip
    http = served.http()
    docs = ["one doc", "two doc", "three doc"]
    reranked = http.post(
        "/v1/rerank", json={"model": "reranker", "query": "q", "documents": docs, "top_n": 2}
    )
    assert reranked.status_code == 200, reranked.text
    order = sorted(range(3), key=lambda i: -score("q", docs[i]))[:2]
    assert reranked.json()["results"] == [
        {"index": i, "relevance_score": score("q", docs[i]), "document": {"text": docs[i]}}
        for i in order
    ]
    scored = http.post("/v1/score", json={"model": "reranker", "text_1": "q", "text_2": docs})
    assert [d["score"] for d in scored.json()["data"]] == [score("q", d) for d in docs]
    firsts = ["q1", "q2", "q3"]  # vLLM's N:N form, sent on as it came
    pairwise = http.post("/v1/score", json={"model": "reranker", "text_1": firsts, "text_2": docs})
    assert [d["score"] for d in pairwise.json()["data"]] == [
        score(q, d) for q, d in zip(firsts, docs, strict=True)
    ]
    bad = http.post("/v1/rerank", json={"model": "reranker", "query": "q", "documents": docs,
                                        "top_n": -1})  # fmt: skip
    assert bad.status_code == 400
    assert bad.json()["error"]["message"] == "'top_n': -1 must not be negative"
    embeddings = http.post("/v1/embeddings", json={"model": "reranker", "input": "x"})
    assert embeddings.status_code == 400 and "--task embed" in embeddings.text


def test_vllm_s_current_score_body_and_every_score_and_rerank_path(serve_process, backend):
    served = serve_process(
        "--engine", "REMOTE_VLLM", "--task", "score", "--model.model_name", "reranker",
        "--remote_params.api_url", backend.openai_url,
    )  # fmt: skip
    http = served.http()
    docs = ["one doc", "two doc", "three doc"]
    for path in ("/v1/score", "/score"):
        scored = http.post(path, json={"model": "reranker", "queries": "q", "documents": docs})
        assert scored.status_code == 200, scored.text
        body = ScoreResponse.model_validate(scored.json())
        assert [d.score for d in body.data] == [score("q", d) for d in docs]
    both = http.post("/score", json={"model": "reranker", "queries": "q", "text_2": docs})
    assert both.status_code == 400 and "two forms of one score body" in both.text
    for path in ("/v1/rerank", "/rerank", "/v2/rerank"):
        # top_n 0 is vLLM's default: every document, best first
        body = {"model": "reranker", "query": "q", "documents": docs, "top_n": 0}
        reranked = http.post(path, json=body)
        assert reranked.status_code == 200, reranked.text
        parsed = RerankResponse.model_validate(reranked.json())
        assert parsed.usage.prompt_tokens == parsed.usage.total_tokens
        assert [r.index for r in parsed.results] == sorted(
            range(3), key=lambda i: -score("q", docs[i])
        )


def test_one_openai_batch_file_through_batch_and_through_serve_gives_the_same_vectors(
    embed_server, backend, tmp_path
):
    lines = [
        {"custom_id": f"e{i}", "method": "POST", "url": "/v1/embeddings",
         "body": {"model": "text-embedding-3-small", "input": text}}
        for i, text in enumerate(["one", ["two", "three"], [7, 8, 9]])
    ]  # fmt: skip
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(line) + "\n" for line in lines))

    def vectors(url: str, engine: str, out: Path, env: dict, *more: str) -> dict:
        run = run_lmpress(
            "batch", "-i", str(src), "-o", str(out), "--engine", engine, "--task", "embed",
            "--model.model_name", "text-embedding-3-small", "--remote_params.api_url", url,
            *more, env=env,
        )  # fmt: skip
        assert run.returncode == 0, run.stderr
        rows = [json.loads(line) for line in out.read_text().splitlines()]
        return {r["custom_id"]: r["response"]["body"]["data"] for r in rows}

    direct = vectors(backend.openai_url, "OPENAI", tmp_path / "a.jsonl", {"OPENAI_API_KEY": "k"})
    served = vectors(
        f"{embed_server.url}/v1", "REMOTE", tmp_path / "b.jsonl", {"MY_KEY": "serve-key"},
        "--remote_params.api_key_env_varname", "MY_KEY",
    )  # fmt: skip
    assert direct == served
    assert direct["e1"][1]["embedding"] == vector("three")


def test_pairwise_scores_from_a_native_cross_encoder_equal_transformers_logits(serve_process):
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    firsts = ["why is the sky blue", "a quick brown fox", "what"]
    seconds = ["the sky is blue because of the sun", "over the moon", "Ünïcode café"]
    directory = tiny_model("cross-encoder")
    tokenizer = AutoTokenizer.from_pretrained(directory)
    model = AutoModelForSequenceClassification.from_pretrained(directory).eval()
    with torch.no_grad():
        pairs = tokenizer(firsts, seconds, padding=True, return_tensors="pt")
        logits = model(**pairs).logits[:, 0].tolist()

    served = serve_process(
        "--engine", "NATIVE", "--task", "score", "--model.model_name", "tiny:cross-encoder"
    )  # fmt: skip
    http = served.http()
    body = {"model": "tiny:cross-encoder", "text_1": firsts, "text_2": seconds}
    scored = http.post("/v1/score", json=body)
    assert scored.status_code == 200, scored.text
    got = [d["score"] for d in scored.json()["data"]]
    assert got == pytest.approx(logits, abs=1e-5)
    assert got[0] != pytest.approx(logits[1], abs=1e-3)  # each pair its own, not text_1[0]'s
    bad = http.post("/v1/score", json={**body, "text_2": seconds[:2]})
    assert bad.status_code == 400
    assert bad.json()["error"]["message"] == (
        "'text_1' has 3 texts and 'text_2' 2: give one text_1 to score against every text_2, "
        "or as many as text_2 to score them pairwise (text_1[i] with text_2[i])"
    )


def test_classify_and_pooling_answer_in_vllm_s_shapes_as_transformers_pipeline(serve_process):
    """vLLM's /classify on a classifier and /pooling on a reward model (NATIVE), each equal to
    transformers' text-classification pipeline (float32 both sides: rounding, about 1e-6);
    either server answers another task's route 400 naming the task to start it with."""
    from transformers import pipeline

    texts = ["why is the sky blue", "Ünïcode café", "a quick brown fox jumps"]
    reference = {
        name: [
            {d["label"]: d["score"] for d in answer}
            for answer in pipeline(
                "text-classification", model=str(tiny_model(name)), top_k=None,
                function_to_apply="none" if name == "reward" else None,
            )(texts)
        ]
        for name in ("classifier", "reward")
    }  # fmt: skip
    classifier = serve_process(
        "--engine", "NATIVE", "--task", "classify", "--model.model_name", "tiny:classifier"
    ).http()  # fmt: skip
    answer = classifier.post("/classify", json={"model": "tiny:classifier", "input": texts})
    assert answer.status_code == 200, answer.text
    body = ClassificationResponse.model_validate(answer.json())
    assert [d.label for d in body.data] == [
        max(w, key=w.__getitem__) for w in reference["classifier"]
    ]
    assert [d.probs for d in body.data] == [
        pytest.approx([w[label] for label in CLASSES], abs=1e-4) for w in reference["classifier"]
    ]
    wrong = classifier.post("/pooling", json={"model": "tiny:classifier", "input": "hi"})
    assert wrong.status_code == 400
    assert "this server runs the classify task; start it with --task reward" in wrong.text

    reward = serve_process(
        "--engine", "NATIVE", "--task", "reward", "--model.model_name", "tiny:reward"
    ).http()  # fmt: skip
    pooled = reward.post("/pooling", json={"model": "tiny:reward", "input": texts})
    assert pooled.status_code == 200, pooled.text
    values = [d.data for d in PoolingResponse.model_validate(pooled.json()).data]
    assert values == [pytest.approx([w["LABEL_0"]], abs=1e-4) for w in reference["reward"]]
    assert reward.post("/classify", json={"model": "tiny:reward", "input": "hi"}).status_code == 400
