"""Several models behind one `lmpress serve` (serve/router.py, serve/front.py): SmolLM2 on
NATIVE (with the lora-a adapter where NATIVE runs adapters), the tiny Llama on LLAMACPP and on
NATIVE, and the loopback OpenAI server through REMOTE, in one server process whose local models
load on first use, at most two at once.

One server for the module; the tests run in file order, since the loading and unloading they
check follows from the requests before them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import openai
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from lmpress.builtin_models.lora import smollm2_adapters
from tests.serve.conftest import Served, serving
from tests.servers.llm_server import LLMServer, reply_text

QUESTION = "Name three colours."
# The tests walk one server through loads and unloads, each following from the requests
# before it: `--random-order` keeps this file's order (it still shuffles the files).
pytestmark = pytest.mark.random_order(disabled=True)


def native_takes_adapters() -> bool:
    from lmpress.engines.local.native.engine import NativeEngine

    return NativeEngine.takes_adapters


needs_adapters = pytest.mark.skipif(
    not native_takes_adapters(), reason="NATIVE does not run LoRA adapters in this checkout"
)


@pytest.fixture(scope="module")
def adapters() -> dict[str, str]:
    return {name: str(path) for name, path in smollm2_adapters().items()}


@pytest.fixture(scope="module")
def server(tmp_path_factory, adapters) -> Iterator[Served]:
    """Four models from a serve recipe's `models:` list and a --model flag."""
    smol = {"model.model_name": "smollm2:135m-instruct", "generation.max_new_tokens": 12}
    if native_takes_adapters():
        smol["model.adapters"] = {"lora-a": adapters["lora-a"]}
    with LLMServer() as upstream:
        recipe = tmp_path_factory.mktemp("recipe") / "serve.yaml"
        models = [
            {"name": "smol", "recipe": "tiny-native", "overrides": smol},
            {"name": "tiny", "recipe": "tiny-llamacpp",
             "overrides": {"generation.max_new_tokens": 8}},
            {"name": "remote", "recipe": "remote", "overrides": {
                "remote_params.api_url": upstream.openai_url,
                "model.model_name": "test-model", "remote_params.max_retries": 0}},
        ]  # fmt: skip
        serve = {"models": models, "max_loaded_models": 2, "allow_runtime_lora": True}
        recipe.write_text(json.dumps({"serve": serve}))  # JSON is YAML
        with serving("-c", str(recipe), "--model", "tiny2=tiny-native") as served:
            yield served


def chat(served: Served, model: str, text: str = QUESTION) -> str:
    reply = served.client().chat.completions.create(
        model=model, messages=[{"role": "user", "content": text}], temperature=0
    )
    assert reply.model == model
    return reply.choices[0].message.content or ""


def loaded(served: Served) -> dict[str, bool]:
    health = httpx.get(f"{served.url}/health").json()
    return {m["model"]: m["loaded"] for m in health["models"]}


def test_each_model_by_name_listed_and_unknown_names_404(server, adapters):
    listed = {m.id: m for m in server.client().models.list().data}
    assert {"smol", "tiny", "tiny2", "remote"} <= set(listed)
    assert loaded(server) == {"smol": False, "tiny": False, "tiny2": False, "remote": True}

    # The remote model first. Seen, not yet understood: on a fresh server, a request to the
    # remote model between SmolLM2's first load and its unloading left its ~1 GB allocated
    # (glibc's mmapped blocks in use, no torch tensor or engine object left) and failed the
    # RSS check below; the same after a second load gave the memory back.
    assert chat(server, "remote") == reply_text(QUESTION)  # the loopback server's own reply
    smol, tiny = chat(server, "smol"), chat(server, "tiny")
    assert "Red" in smol  # SmolLM2's greedy "1. Red: ..."
    assert len({smol, tiny, reply_text(QUESTION)}) == 3
    # Anthropic's Messages route finds its model by name too
    message = server.http().post(
        "/v1/messages",
        json={"model": "tiny", "max_tokens": 8, "temperature": 0,
              "messages": [{"role": "user", "content": QUESTION}]},
    )  # fmt: skip
    assert message.status_code == 200 and message.json()["content"][0]["text"] == tiny

    with pytest.raises(openai.NotFoundError) as caught:
        chat(server, "no-such-model")
    assert caught.value.code == "model_not_found" and "'smol'" in str(caught.value)

    samples = {
        (s.name, s.labels.get("model_name")): s.value
        for family in text_string_to_metric_families(server.http().get("/metrics").text)
        for s in family.samples
    }
    for model in ("smol", "tiny", "remote"):
        assert samples[("vllm:generation_tokens_total", model)] > 0, model
    assert samples[("vllm:generation_tokens_total", "tiny2")] == 0


@needs_adapters
def test_an_adapter_is_listed_under_its_base_and_answers_as_it(server, adapters):
    card = server.http().get("/v1/models/lora-a").json()
    assert card["parent"] == "smol" and card["root"] == adapters["lora-a"]
    assert chat(server, "lora-a").startswith("The three colours are")
    assert chat(server, "smol") != chat(server, "lora-a")


def test_a_third_local_model_unloads_the_least_recently_used(server):
    chat(server, "smol")
    chat(server, "tiny")  # now smol is the least recently used of the two loaded
    assert loaded(server) == {"smol": True, "tiny": True, "tiny2": False, "remote": True}
    process = psutil.Process(server.proc.pid)
    before = process.memory_info().rss
    chat(server, "tiny2")
    after = process.memory_info().rss
    assert loaded(server) == {"smol": False, "tiny": True, "tiny2": True, "remote": True}
    server.wait_for_log(lambda line: "model 'smol' unloaded" in line)
    # SmolLM2-135M holds ~540 MB of float32 weights; the tiny Llama that came in, ~1 MB
    assert before - after > 250 * 2**20, (before, after)
    assert "Red" in chat(server, "smol")  # loaded again, unloading tiny (now the oldest)
    assert loaded(server)["tiny"] is False


@needs_adapters
def test_adapters_load_and_unload_at_run_time(server, adapters):
    http = server.http()
    body = {"lora_name": "lora-b", "lora_path": adapters["lora-b"], "model": "smol"}
    assert http.post("/v1/load_lora_adapter", json=body).status_code == 200
    listed = {m["id"]: m for m in http.get("/v1/models").json()["data"]}
    assert listed["lora-b"]["parent"] == "smol"
    with_b = chat(server, "lora-b")
    assert with_b not in (chat(server, "smol"), chat(server, "lora-a"))
    again = http.post("/v1/load_lora_adapter", json=body)
    assert again.status_code == 400 and "already" in again.json()["error"]["message"]

    assert http.post("/v1/unload_lora_adapter", json={"lora_name": "lora-b"}).status_code == 200
    with pytest.raises(openai.NotFoundError):
        chat(server, "lora-b")
    gone = http.post("/v1/unload_lora_adapter", json={"lora_name": "lora-b"})
    assert gone.status_code == 404


def test_runtime_adapters_are_off_unless_allowed(echo_server):
    answer = echo_server.http().post(
        "/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": "/etc"}
    )
    assert answer.status_code == 404
    assert "--allow-runtime-lora" in answer.json()["error"]["message"]
