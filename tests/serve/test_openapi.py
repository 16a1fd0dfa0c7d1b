"""`/openapi.json`: every route of the app `lmpress serve` runs, each request body the very model
the route validates with, public like vLLM's, and naming the key where the server asks for one."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.routing import APIRoute

from lmpress.serve.batches import CreateBatchBody
from lmpress.serve.openapi import REF
from lmpress.wire.anthropic import server as anthropic_server
from lmpress.wire.openai import pooling, tokens
from lmpress.wire.openai import requests as bodies
from lmpress.wire.openai.responses_api.requests import ResponsesBody

KEY = "sk-lmpress-openapi-test"
# What the server validates each JSON body with: the schema must be that model's.
BODIES = {
    "/v1/chat/completions": bodies.ChatCompletionBody,
    "/v1/completions": bodies.CompletionBody,
    "/v1/responses": ResponsesBody,
    "/v1/embeddings": pooling.EmbeddingsBody,
    "/v1/score": pooling.ScoreBody,
    "/v1/rerank": pooling.RerankBody,
    "/v1/messages": anthropic_server.MessagesBody,
    "/v1/messages/count_tokens": anthropic_server.CountTokensBody,
    "/v1/batches": CreateBatchBody,
    "/tokenize": tokens.TokenizeBody,
    "/detokenize": tokens.DetokenizeBody,
}


def without_nulls(schema: Any) -> Any:
    """A schema as the document has it: FastAPI leaves out every null (`"default": null`)."""
    if isinstance(schema, dict):
        return {k: without_nulls(v) for k, v in schema.items() if v is not None}
    if isinstance(schema, list):
        return [without_nulls(v) for v in schema]
    return schema


def assert_the_models_schema(documented: dict, model: type) -> None:
    """`documented` is `model`'s JSON schema, but for `model`: the served one, required (a
    batch line may leave it out, a request may not); and with a request that is answered."""
    expected = without_nulls(model.model_json_schema(ref_template=REF))
    expected.pop("$defs", None)
    documented = dict(documented)
    examples = documented.pop("examples")
    assert examples and all(e.get("model", "tiny-llama") == "tiny-llama" for e in examples)
    if "model" in expected["properties"]:
        served = documented["properties"].pop("model")
        assert served == {"type": "string", "enum": ["tiny-llama"], "title": "Model"}
        del expected["properties"]["model"]
        assert set(documented.pop("required")) == {*expected.pop("required", []), "model"}
    assert documented == expected, model.__name__


@pytest.fixture(scope="module")
def keyed_llama(serve_process, tiny_llama, tmp_path_factory):
    return serve_process(
        "--engine", "NATIVE", "--model.model_name", tiny_llama,
        "--serve.served_model_name", "tiny-llama",
        "--state-dir", str(tmp_path_factory.mktemp("state")), env={"LMPRESS_API_KEY": KEY},
    )  # fmt: skip


@pytest.fixture(scope="module")
def app_routes(tiny_llama, tmp_path_factory) -> list[tuple[str, str]]:
    """(path, method) of every route of the app `lmpress serve` builds, read from the app."""
    from lmpress.configs import load_config
    from lmpress.engines.registry import create_engine
    from lmpress.serve.app import create_app

    config = load_config(overrides={
        "engine": "NATIVE", "model.model_name": tiny_llama,
        "serve.state_dir": str(tmp_path_factory.mktemp("state")),
    })  # fmt: skip
    app = create_app(create_engine(config), config.serve)
    return sorted(
        (route.path_format, method)
        for route in app.routes
        if isinstance(route, APIRoute)
        for method in route.methods
        if method != "HEAD"
    )


def test_the_document_lists_every_route_with_its_body(keyed_llama, app_routes):
    with keyed_llama.http() as http:
        response = http.get("/openapi.json")  # no key: the document is public
    assert response.status_code == 200, response.text
    document = response.json()
    listed = sorted(
        (path, method.upper()) for path, item in document["paths"].items() for method in item
    )
    assert listed == app_routes
    assert ("/v1/chat/completions", "POST") in listed and ("/metrics", "GET") in listed
    schemas = document["components"]["schemas"]
    for path, model in BODIES.items():
        content = document["paths"][path]["post"]["requestBody"]["content"]
        assert content["application/json"]["schema"] == {"$ref": REF.format(model=model.__name__)}
        assert_the_models_schema(schemas[model.__name__], model)
    upload = document["paths"]["/v1/files"]["post"]["requestBody"]["content"]
    assert set(upload["multipart/form-data"]["schema"]["properties"]) == {"file", "purpose"}


def test_no_route_is_documented_with_fastapis_422(keyed_llama):
    with keyed_llama.http() as http:
        document = http.get("/openapi.json").json()
    for path, item in document["paths"].items():
        for method, operation in item.items():
            assert "422" not in operation["responses"], (method, path)
            assert "4XX" in operation["responses"], (method, path)
    assert "HTTPValidationError" not in document["components"]["schemas"]


def test_the_key_is_named_on_the_routes_that_need_it(keyed_llama, echo_server):
    with keyed_llama.http() as http:
        document = http.get("/openapi.json").json()
        assert http.get("/v1/models").status_code == 401  # the routes themselves stay closed
    schemes = document["components"]["securitySchemes"]
    assert schemes["bearer"] == {"type": "http", "scheme": "bearer"}
    assert schemes["x-api-key"] == {"type": "apiKey", "in": "header", "name": "x-api-key"}
    for path, item in document["paths"].items():
        for operation in item.values():
            needs_key = path != "/health"  # every route but the probe (vLLM's root ones too)
            assert ("security" in operation) == needs_key, path
    with echo_server.http() as http:  # no key: none named, whatever the engine
        open_document = http.get("/openapi.json").json()
    assert "securitySchemes" not in open_document["components"]
    assert not any("security" in op for item in open_document["paths"].values()
                   for op in item.values())  # fmt: skip


def test_no_docs_pages(keyed_llama):
    """The document, not the pages that render it: those load scripts from elsewhere."""
    with keyed_llama.http() as http:
        for path in ("/docs", "/redoc"):
            assert http.get(path).status_code == 404
