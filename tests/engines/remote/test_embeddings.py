"""The OpenAI-compatible engines' embeddings (the real `openai` SDK's `embeddings.create`) and
REMOTE_VLLM's scores (vLLM's /score through the SDK) against the loopback server, paced and
retried as chat requests are."""

from __future__ import annotations

import asyncio
import math

import pytest

from lmpress.configs import load_config
from lmpress.engines.registry import create_engine
from lmpress.vocabulary.embeddings import EmbedRequest, ScoreRequest
from lmpress.vocabulary.errors import ErrorKind, UnsupportedParamError
from tests.servers.embeddings import score, vector
from tests.servers.llm_server import Faults, LLMServer

pytestmark = pytest.mark.timeout(120)


def make_engine(server: LLMServer, engine: str = "REMOTE", task: str = "embed", **overrides):
    values = {
        "engine": engine,
        "task": task,
        "model.model_name": "test-model",
        "remote_params.api_url": server.openai_url,
        "remote_params.api_key": "sk-test",
        "remote_params.retry_backoff_base": 0.01,
        "remote_params.retry_backoff_max": 0.2,
        "remote_params.connection_timeout": 2.0,
        **overrides,
    }
    return create_engine(load_config(None, values))


def embed_all(engine, requests: list[EmbedRequest]):
    async def run():
        try:
            return await asyncio.gather(*(engine.embed(r) for r in requests))
        finally:
            await engine.aclose()

    return asyncio.run(run())


def test_vectors_come_back_in_input_order_with_usage():
    with LLMServer() as server:
        engine = make_engine(server, "OPENAI")
        texts = ["the cat", "a much longer sentence about dogs", ""]
        (result,) = embed_all(engine, [EmbedRequest("r", texts[:2]), EmbedRequest("s", texts)])[:1]
        body = server.stats.bodies[0][1]
    assert result.error is None
    assert [list(e.vector) for e in result.embeddings] == [vector(t) for t in texts[:2]]
    assert result.usage.prompt_tokens == 2 + 6
    assert result.engine == "OPENAI" and result.model == "test-model"
    # The SDK asks for base64 and decodes it; the server's float32 values survive unchanged.
    assert body["encoding_format"] == "base64"


def test_dimensions_token_ids_and_normalize():
    with LLMServer() as server:
        engine = make_engine(server)
        cut, ids, unit = embed_all(
            engine,
            [
                EmbedRequest("a", ["cut me"], dimensions=4),
                EmbedRequest("b", [[1, 2, 3]]),
                EmbedRequest("c", ["unit"], normalize=True),
            ],
        )
    assert list(cut.embeddings[0].vector) == vector("cut me", 4)
    assert list(ids.embeddings[0].vector) == vector([1, 2, 3])
    assert ids.usage.prompt_tokens == 3
    raw = vector("unit")
    norm = math.sqrt(sum(v * v for v in raw))
    assert unit.embeddings[0].vector == pytest.approx([v / norm for v in raw])


def test_a_429_storm_is_retried_until_every_request_gets_its_vector():
    faults = Faults(transient_rate=1.0, transient_kinds=("429", "500"), retry_after="0")
    with LLMServer(faults) as server:
        engine = make_engine(server, **{"remote_params.num_workers": 4})
        requests = [EmbedRequest(f"r{i}", [f"text number {i}"]) for i in range(12)]
        results = embed_all(engine, requests)
        statuses = server.stats.statuses
    assert all(r.error is None for r in results)
    assert [list(r.embeddings[0].vector) for r in results] == [
        vector(f"text number {i}") for i in range(12)
    ]
    assert statuses[429] + statuses[500] == 12 and statuses[200] == 12


def test_a_refused_request_fails_alone_in_one_line():
    with LLMServer(Faults(permanent={"forbidden": 403})) as server:
        engine = make_engine(server)
        bad, good = embed_all(engine, [EmbedRequest("a", ["forbidden"]), EmbedRequest("b", ["ok"])])
    assert good.error is None
    assert bad.error is not None and bad.error.kind == ErrorKind.PERMISSION_DENIED
    assert bad.error.message.startswith("REMOTE: HTTP 403: ") and "\n" not in bad.error.message
    assert bad.embeddings == []


def test_too_many_dimensions_is_the_providers_400():
    with LLMServer() as server:
        engine = make_engine(server)
        (result,) = embed_all(engine, [EmbedRequest("a", ["x"], dimensions=999)])
    assert result.error is not None and result.error.status == 400
    assert "dimensions" in result.error.message


def test_an_engine_without_embeddings_is_refused_before_any_request():
    with LLMServer() as server:
        with pytest.raises(UnsupportedParamError, match="engine DEEPSEEK cannot embed"):
            make_engine(server, "DEEPSEEK")
        assert server.stats.requests == 0


def test_remote_vllm_scores_each_document_through_its_score_route():
    faults = Faults(transient_rate=1.0, transient_kinds=("500",))
    with LLMServer(faults) as server:
        engine = make_engine(server, "REMOTE_VLLM", task="rerank")
        (result,) = asyncio.run(_score(engine, ScoreRequest("q", "what is x", ["x is y", "z"])))
        paths = [path for path, _ in server.stats.bodies]
    assert result.error is None
    assert result.scores == [score("what is x", "x is y"), score("what is x", "z")]
    assert result.usage.prompt_tokens == (3 + 3) + (3 + 1)
    assert paths == ["/v1/score", "/v1/score"]  # the first attempt's 500 was retried


async def _score(engine, request):
    try:
        return [await engine.score(request)]
    finally:
        await engine.aclose()


def test_an_engine_without_a_score_route_cannot_rerank():
    with (
        LLMServer() as server,
        pytest.raises(UnsupportedParamError, match="engine OPENAI cannot rerank"),
    ):
        make_engine(server, "OPENAI", task="rerank")


def test_lmpress_engines_says_which_tasks_each_answers(capsys):
    from lmpress.cli.listings import engines

    engines()
    blocks = {block.split()[0]: block for block in capsys.readouterr().out.split("\n\n") if block}
    assert "tasks: generate, embed\n" in blocks["OPENAI"]
    assert "tasks: generate, embed, score, rerank\n" in blocks["REMOTE_VLLM"]
    assert "tasks: generate\n" in blocks["DEEPSEEK"]
