"""GET /metrics: after a known set of requests to a real `lmpress serve`, Prometheus' own parser
reads counters moved by exactly those requests, under vLLM's names."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

MODEL = "echo-model"
KEY = "sk-metrics-test-41b7"
THOUGHT = "first I weigh it"  # ECHO's thinking: 4 reasoning tokens per sample


def scrape(served, **headers) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of /metrics by (name, sorted labels)."""
    with served.http() as http:
        response = http.get("/metrics", headers=headers)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain; version=")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }


def value(samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def requests_total(samples, route: str, method: str, status: int) -> float:
    labels = {"model_name": MODEL, "route": route, "method": method, "status": str(status)}
    return value(samples, "lmpress_http_requests_total", **labels)


@pytest.fixture(scope="module")
def metrics_server(serve_process, echo_plugin):
    from tests.conftest import with_plugin

    return serve_process(
        "--engine", "ECHO", "--model.model_name", MODEL,
        env={**with_plugin(echo_plugin), "ECHO_THINK": THOUGHT},
    )  # fmt: skip


@pytest.fixture(scope="module")
def known_requests(metrics_server):
    """Three chat completions, one streamed with its usage, a 400, a 404 and a model card;
    what the responses reported."""
    client = metrics_server.client()
    usages = []
    for text in ("hi", "two words", "and now three"):
        reply = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": text}]
        )
        usages.append(reply.usage)
    deltas = 0
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "stream me"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    for chunk in stream:
        if chunk.usage is not None:
            usages.append(chunk.usage)
        for choice in chunk.choices:
            delta = choice.delta.model_dump()
            deltas += bool(delta.get("content") or delta.get("reasoning_content"))
    with metrics_server.http() as http:
        bad = http.post("/v1/chat/completions", json={"model": MODEL, "messages": []})
        assert bad.status_code == 400, bad.text
        assert http.get("/v1/no/such/route").status_code == 404
        assert http.get(f"/v1/models/{MODEL}").status_code == 200
    metrics_server.wait_until_idle()
    return usages, deltas


def test_requests_are_counted_by_route_template_method_and_status(metrics_server, known_requests):
    samples = scrape(metrics_server)
    assert requests_total(samples, "/v1/chat/completions", "POST", 200) == 4
    assert requests_total(samples, "/v1/chat/completions", "POST", 400) == 1
    assert requests_total(samples, "unmatched", "GET", 404) == 1  # no raw path as a label
    assert requests_total(samples, "/v1/models/{model:path}", "GET", 200) == 1
    routes = {dict(labels)["route"] for name, labels in samples if name.startswith("lmpress_http")}
    assert "/v1/no/such/route" not in routes
    assert f"/v1/models/{MODEL}" not in routes


def test_tokens_are_the_sum_of_the_usage_the_responses_reported(metrics_server, known_requests):
    usages, _ = known_requests
    assert len(usages) == 4
    samples = scrape(metrics_server)
    model = {"model_name": MODEL}
    prompt = sum(u.prompt_tokens for u in usages)
    generated = sum(u.completion_tokens for u in usages)
    reasoning = sum(u.completion_tokens_details.reasoning_tokens for u in usages)
    assert prompt > 0 and reasoning == 4 * len(THOUGHT.split())
    assert value(samples, "vllm:prompt_tokens_total", **model) == prompt
    assert value(samples, "vllm:generation_tokens_total", **model) == generated
    assert value(samples, "lmpress_reasoning_tokens_total", **model) == reasoning


def test_latency_histograms_count_the_generations(metrics_server, known_requests):
    _, deltas = known_requests
    samples = scrape(metrics_server)
    model = {"model_name": MODEL}
    assert value(samples, "vllm:e2e_request_latency_seconds_count", **model) == 4
    assert value(samples, "vllm:time_to_first_token_seconds_count", **model) == 1  # streamed
    # One gap between each two deltas of the one stream.
    assert deltas > 2
    assert value(samples, "vllm:inter_token_latency_seconds_count", **model) == deltas - 1
    ttft = value(samples, "vllm:time_to_first_token_seconds_sum", **model)
    e2e = value(samples, "vllm:e2e_request_latency_seconds_sum", **model)
    assert 0 < ttft < e2e


def test_gauges_are_back_to_zero_when_idle(metrics_server, known_requests):
    samples = scrape(metrics_server)
    model = {"model_name": MODEL}
    assert ("vllm:num_requests_running", tuple(model.items())) in samples
    assert value(samples, "vllm:num_requests_running", **model) == 0
    assert value(samples, "lmpress_requests_in_flight", **model) == 0
    # ECHO keeps no queue of its own: it reports no waiting requests rather than a made-up 0.
    assert ("vllm:num_requests_waiting", tuple(model.items())) not in samples


def test_a_scrape_counts_itself_in_the_next(metrics_server):
    before = requests_total(scrape(metrics_server), "/metrics", "GET", 200)
    assert requests_total(scrape(metrics_server), "/metrics", "GET", 200) == before + 1


def test_requests_in_flight_show_while_they_stream(slow_echo_server):
    """slow_echo_server: 20 words a second, one request at a time."""
    # A reply of a minute (1,200 words), so that it is still running when the scrape is
    # answered however slow the machine; the client leaves mid-stream, which ends it.
    hold = " ".join(["hold"] * 1200)
    body = {"model": MODEL, "messages": [{"role": "user", "content": hold}], "stream": True}
    # The server is shared with other modules' tests, whose clients leave mid-stream too.
    left = requests_total(scrape(slow_echo_server), "/v1/chat/completions", "POST", 499)
    with slow_echo_server.http() as http, http.stream("POST", "/v1/chat/completions", json=body):
        samples = scrape(slow_echo_server)
        assert value(samples, "vllm:num_requests_running", model_name=MODEL) == 1
        assert value(samples, "lmpress_requests_in_flight", model_name=MODEL) == 1
    slow_echo_server.wait_until_idle()
    samples = scrape(slow_echo_server)
    assert value(samples, "vllm:num_requests_running", model_name=MODEL) == 0
    # The client left mid-stream: 499, as the log line says.
    assert requests_total(samples, "/v1/chat/completions", "POST", 499) == left + 1


@pytest.fixture(scope="module")
def keyed_server(serve_process, echo_plugin):
    from tests.conftest import with_plugin

    return serve_process(
        "--engine", "ECHO", "--model.model_name", MODEL,
        env={**with_plugin(echo_plugin), "LMPRESS_API_KEY": KEY},
    )  # fmt: skip


def test_metrics_needs_the_api_key_when_the_server_has_one(keyed_server):
    with keyed_server.http() as http:
        refused = http.get("/metrics")
        wrong = http.get("/metrics", headers={"authorization": "Bearer nope"})
    for response in (refused, wrong):
        assert response.status_code == 401
        assert response.json()["error"]["code"] == "invalid_api_key"
        assert "vllm:" not in response.text
    samples = scrape(keyed_server, authorization=f"Bearer {KEY}")
    assert requests_total(samples, "/metrics", "GET", 401) == 2
    # A refused generation request counts under its route's template too.
    with keyed_server.http() as http:
        assert http.post("/v1/chat/completions", json={}).status_code == 401
    samples = scrape(keyed_server, authorization=f"Bearer {KEY}")
    assert requests_total(samples, "/v1/chat/completions", "POST", 401) == 1
    assert httpx.get(f"{keyed_server.url}/health").status_code == 200  # stays open


def test_the_body_is_prometheus_text_not_json(metrics_server):
    with metrics_server.http() as http:
        text = http.get("/metrics").text
    assert "# TYPE vllm:prompt_tokens_total counter" in text
    assert "# TYPE vllm:time_to_first_token_seconds histogram" in text
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)


@pytest.fixture(scope="module", params=["NATIVE", "LLAMACPP"])
def one_row(request, serve_process):
    """A local engine with one row in its batch (a second request waits), and the reply length
    that keeps it busy long enough to be seen: NATIVE with a KV-cache budget, LLAMACPP (much
    faster) with its context."""
    if request.param == "NATIVE":
        from lmpress.builtin_models.tiny import tiny_model

        model, extra = str(tiny_model("llama")), ["--model.model_kwargs", '{"kv_cache_gb": 0.001}']
        reply = 100
    else:
        from lmpress.builtin_models.tiny_gguf import tiny_gguf

        model, extra, reply = str(tiny_gguf("llama")), [], 400
    served = serve_process(
        "--engine", request.param, "--model.model_name", model,
        "--serve.served_model_name", "tiny-llama", "--generation.batch_size", "1", *extra,
    )  # fmt: skip
    return served, reply


ROUNDS = 5  # rounds of three requests, until one round's scrapes saw a request wait


def test_a_local_engine_reports_running_waiting_and_its_kv_cache(one_row):
    """Three requests at once on one row: one runs, the others wait their turn, each for a
    whole reply; every scrape agrees with that, and all is 0 when idle.

    When a scrape lands is the machine's to decide: on a loaded one a scrape has taken longer
    than a round's three replies (fresh run AI: one scrape, all zero). So rounds go on until a
    scrape has seen a request waiting and cache in use (the first round, on a quiet machine),
    ROUNDS at most; metrics that never report them fail every round."""
    from concurrent.futures import ThreadPoolExecutor

    served, reply = one_row
    client = served.client()
    model = {"model_name": "tiny-llama"}

    def ask():
        return client.chat.completions.create(
            model="tiny-llama",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=reply,
            extra_body={"min_tokens": reply},  # no early end
        )

    seen = []
    for _ in range(ROUNDS):
        with ThreadPoolExecutor(3) as pool:
            asked = [pool.submit(ask) for _ in range(3)]
            while not all(future.done() for future in asked):
                samples = scrape(served)
                seen.append(
                    tuple(
                        value(samples, name, **model)
                        for name in (
                            "vllm:num_requests_running",
                            "vllm:num_requests_waiting",
                            "vllm:kv_cache_usage_perc",
                        )
                    )
                )
                time.sleep(0.02)
            replies = [future.result() for future in asked]
        assert all(r.usage.completion_tokens == reply for r in replies)
        assert all(r <= 1 and r + w <= 3 for r, w, _ in seen), seen
        assert all(kv <= 1 for _, _, kv in seen), seen
        if max(w for _, w, _ in seen) >= 1 and any(kv > 0 for _, _, kv in seen):
            break
    assert max(w for _, w, _ in seen) >= 1, seen
    # A row takes cache cells once its prompt is read (a scrape may fall before that).
    assert any(kv > 0 for _, _, kv in seen), seen
    served.wait_until_idle()
    samples = scrape(served)
    assert value(samples, "vllm:num_requests_running", **model) == 0
    assert value(samples, "vllm:num_requests_waiting", **model) == 0
    assert value(samples, "vllm:kv_cache_usage_perc", **model) == 0
    assert value(samples, "vllm:generation_tokens_total", **model) == 3 * reply


def test_two_apps_in_one_process_keep_their_own_metrics():
    """Each app has a registry of its own: a second one neither clashes with the first (as
    two sets of metrics in prometheus_client's global registry would) nor shares its counts.
    Every series is there from the start, at 0."""
    from lmpress.serve.asgi import Slots
    from lmpress.serve.metrics import ServeMetrics
    from lmpress.vocabulary.types import Usage

    class Unknown:
        def occupancy(self):
            return None

    first = ServeMetrics("a", lambda: [("a", Unknown(), Slots(4))])  # type: ignore[list-item]
    second = ServeMetrics("b", lambda: [("b", Unknown(), Slots(4))])  # type: ignore[list-item]
    first.count_usage(Usage(5, 7, 2))
    first.batch_lines("completed").inc()

    def read(metrics: ServeMetrics) -> dict:
        text = metrics.exposition().decode()
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }

    a, b = read(first), read(second)
    assert value(a, "vllm:prompt_tokens_total", model_name="a") == 5
    assert value(a, "vllm:generation_tokens_total", model_name="a") == 7
    assert value(a, "lmpress_reasoning_tokens_total", model_name="a") == 2
    assert value(a, "lmpress_batch_lines_total", model_name="a", outcome="completed") == 1
    assert ("vllm:prompt_tokens_total", (("model_name", "b"),)) in b
    assert value(b, "vllm:prompt_tokens_total", model_name="b") == 0
    assert ("lmpress_batch_lines_total", (("model_name", "b"), ("outcome", "failed"))) in b
    assert ("vllm:time_to_first_token_seconds_count", (("model_name", "b"),)) in b
    assert not any(dict(labels).get("model_name") == "a" for _, labels in b)


def test_a_made_up_method_counts_as_other_not_as_a_series_of_its_own(metrics_server):
    """The HTTP parser takes any token as a method: each would otherwise add a series."""
    with metrics_server.http() as http:
        for made_up in ("QWERTY1", "QWERTY2"):
            assert http.request(made_up, "/health").status_code == 405
    samples = scrape(metrics_server)
    methods = {dict(labels).get("method") for name, labels in samples if name == "lmpress_http_requests_total"}  # fmt: skip
    assert "other" in methods and not any(m.startswith("QWERTY") for m in methods if m)
