"""The loopback server's batch APIs, driven by the real `openai` and `anthropic` SDKs: a batch's
whole life, each injected fault, the limits, and that a batch row gets what the live endpoint
gives for the same body."""

from __future__ import annotations

import base64
import io
import json
import struct
import time
from collections.abc import Callable
from typing import Any

import anthropic
import openai
import pytest
from anthropic.types import Message
from openai.types import Completion, CreateEmbeddingResponse
from openai.types.chat import ChatCompletion

from tests.servers.embeddings import vector
from tests.servers.llm_server import BatchFaults, Faults, LLMServer, reply_text

STEP = 0.25  # each batch status lasts this long here
OPENAI_ENDED = ("completed", "failed", "expired", "cancelled")


def make_server(permanent: dict[str, int] | None = None, **batch: Any) -> LLMServer:
    faults = Faults(permanent=permanent or {}, batch=BatchFaults(step_s=STEP, **batch))
    return LLMServer(faults)


def openai_client(server: LLMServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.openai_url, api_key="test", max_retries=0)


def anthropic_client(server: LLMServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.anthropic_url, api_key="test", max_retries=0)


def chat_body(text: str) -> dict[str, Any]:
    return {"model": "gpt-test", "messages": [{"role": "user", "content": text}]}


def message_params(text: str) -> dict[str, Any]:
    return {"model": "claude-test", "max_tokens": 64,
            "messages": [{"role": "user", "content": text}]}  # fmt: skip


def input_lines(bodies: dict[str, dict[str, Any]], url: str = "/v1/chat/completions") -> bytes:
    lines = [{"custom_id": cid, "method": "POST", "url": url, "body": body}
             for cid, body in bodies.items()]  # fmt: skip
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


def submit(client: openai.OpenAI, data: bytes, endpoint: str = "/v1/chat/completions", **kw):
    file = client.files.create(file=("rows.jsonl", io.BytesIO(data)), purpose="batch")
    return client.batches.create(input_file_id=file.id, endpoint=endpoint,  # type: ignore[arg-type]
                                 completion_window="24h", **kw)  # fmt: skip


def poll(fetch: Callable[[], Any], done: Callable[[Any], bool], timeout: float = 10) -> list:
    """Every state `fetch` returns until `done` holds for one (which ends the list)."""
    seen = [fetch()]
    deadline = time.monotonic() + timeout
    while not done(seen[-1]):
        assert time.monotonic() < deadline, f"still {seen[-1]} after {timeout} s"
        time.sleep(STEP / 8)
        seen.append(fetch())
    return seen


def openai_lines(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines()]


def run_openai(client: openai.OpenAI, data: bytes, **kw) -> tuple[list, list, list]:
    """Submit a batch and wait for it to end: (states seen, output lines, error lines)."""
    batch = submit(client, data, **kw)
    seen = [batch, *poll(lambda: client.batches.retrieve(batch.id),
                         lambda b: b.status in OPENAI_ENDED)]  # fmt: skip
    last = seen[-1]
    return seen, openai_lines(client, last.output_file_id), openai_lines(client, last.error_file_id)


def statuses(seen: list) -> list[str]:
    out: list[str] = []
    for batch in seen:
        status = getattr(batch, "status", None) or batch.processing_status
        if not out or out[-1] != status:
            out.append(status)
    return out


def without_ids(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k not in ("id", "created")}


ROWS = {f"row-{i}": chat_body(f"question number {i}") for i in range(12)}


# --- OpenAI: the lifecycle -------------------------------------------------------------------


def test_openai_batch_moves_through_every_status_and_counts_rows_as_they_finish():
    with make_server() as server:
        client = openai_client(server)
        seen, output, errors = run_openai(client, input_lines(ROWS), metadata={"job": "j1"})
        assert statuses(seen) == ["validating", "in_progress", "finalizing", "completed"]
        completed = [b.request_counts.completed for b in seen if b.status == "in_progress"]
        assert completed == sorted(completed) and len(set(completed)) > 2  # they grow
        last = seen[-1]
        assert last.request_counts.model_dump() == {"total": 12, "completed": 12, "failed": 0}
        assert last.created_at <= last.in_progress_at <= last.finalizing_at <= last.completed_at
        assert last.metadata == {"job": "j1"} and last.error_file_id is None and errors == []
        assert (last.failed_at, last.expired_at, last.cancelled_at) == (None, None, None)
        # Each row once, under its own custom_id, not in the input's order.
        assert sorted(line["custom_id"] for line in output) == sorted(ROWS)
        assert [line["custom_id"] for line in output] != list(ROWS)
        for line in output:
            assert line["id"].startswith("batch_req_") and line["error"] is None
            assert line["response"]["status_code"] == 200 and line["response"]["request_id"]
            answer = ChatCompletion.model_validate(line["response"]["body"])
            question = ROWS[line["custom_id"]]["messages"][0]["content"]
            assert answer.choices[0].message.content == reply_text(question)
        assert server.stats.batch_submissions == dict.fromkeys(ROWS, 1)
        assert (server.stats.batches_created, server.stats.files_uploaded) == (1, 1)
        assert server.stats.requests == 0  # no live request went out


@pytest.mark.parametrize("endpoint", ["/v1/chat/completions", "/v1/completions"])
def test_a_batch_row_gets_what_the_live_endpoint_gives_for_the_same_body(endpoint):
    chat = endpoint == "/v1/chat/completions"
    if chat:
        body = {**chat_body("compare me"), "max_tokens": 3, "logprobs": True, "top_logprobs": 1}
    else:
        body = {"model": "gpt-test", "prompt": "complete this sentence", "n": 2}
    kind: Any = ChatCompletion if chat else Completion
    with make_server() as server:
        client = openai_client(server)
        live = (client.chat.completions if chat else client.completions).create(**body)
        _, output, _ = run_openai(client, input_lines({"one": body}, endpoint), endpoint=endpoint)
        batched = kind.model_validate(output[0]["response"]["body"])
        assert without_ids(batched.model_dump()) == without_ids(live.model_dump())
        assert batched.id != live.id


def test_an_embeddings_batch_row_gets_the_live_embeddings_body_and_a_bad_one_its_400():
    bodies = {
        "floats": {"model": "emb-test", "input": ["a b", "c"], "dimensions": 4},
        "base64": {"model": "emb-test", "input": "one two", "encoding_format": "base64"},
        "too-wide": {"model": "emb-test", "input": "x", "dimensions": 999},
    }
    with make_server() as server:
        client = openai_client(server)
        live = [client.embeddings.create(**body) for body in list(bodies.values())[:2]]
        data = input_lines(bodies, "/v1/embeddings")
        seen, output, errors = run_openai(client, data, endpoint="/v1/embeddings")
    assert seen[-1].status == "completed" and seen[-1].endpoint == "/v1/embeddings"
    got = {line["custom_id"]: line["response"]["body"] for line in output}
    floats = CreateEmbeddingResponse.model_validate(got["floats"])
    assert floats.model_dump() == live[0].model_dump()
    assert [e.embedding for e in floats.data] == [vector("a b", 4), vector("c", 4)]
    encoded = got["base64"]["data"][0]["embedding"]
    assert encoded == live[1].data[0].embedding  # asked for, the SDK leaves base64 as it is
    assert list(struct.unpack("<16f", base64.b64decode(encoded))) == vector("one two")
    (bad,) = errors
    assert bad["custom_id"] == "too-wide" and bad["response"]["status_code"] == 400
    assert "dimensions" in bad["response"]["body"]["error"]["message"]


def test_openai_rows_that_fail_go_to_the_error_file_with_their_status():
    rows = {**ROWS, "bad": chat_body("BAD one"), "worse": chat_body("WORSE one"),
            "empty": {"model": "gpt-test", "messages": []}}  # fmt: skip
    with make_server(permanent={"BAD": 500, "WORSE": 429}) as server:
        seen, output, errors = run_openai(openai_client(server), input_lines(rows))
        assert seen[-1].status == "completed"
        assert seen[-1].request_counts.model_dump() == {"total": 15, "completed": 12, "failed": 3}
        assert sorted(line["custom_id"] for line in output) == sorted(ROWS)
        failed = {line["custom_id"]: line for line in errors}
        assert {cid: line["response"]["status_code"] for cid, line in failed.items()} == {
            "bad": 500, "worse": 429, "empty": 400}  # fmt: skip
        for line in failed.values():
            assert line["error"] is None and set(line["response"]["body"]["error"]) >= {
                "message", "type"}  # fmt: skip
        assert "messages" in failed["empty"]["response"]["body"]["error"]["message"]


def test_a_batch_whose_every_row_fails_completes_with_only_an_error_file():
    rows = {f"r{i}": chat_body(f"DOOMED {i}") for i in range(3)}
    with make_server(permanent={"DOOMED": 400}) as server:
        seen, output, errors = run_openai(openai_client(server), input_lines(rows))
        assert seen[-1].status == "completed" and seen[-1].output_file_id is None
        assert output == [] and sorted(line["custom_id"] for line in errors) == sorted(rows)


def test_openai_cancel_mid_progress_keeps_the_done_rows_and_cancels_the_rest():
    with make_server() as server:
        client = openai_client(server)
        batch = submit(client, input_lines(ROWS))
        poll(lambda: client.batches.retrieve(batch.id),
             lambda b: b.status == "in_progress" and b.request_counts.completed >= 2)  # fmt: skip
        cancelling = client.batches.cancel(batch.id)
        assert cancelling.status == "cancelling" and cancelling.cancelling_at is not None
        done = cancelling.request_counts.completed
        assert 2 <= done < 12
        assert client.batches.cancel(batch.id).status == "cancelling"  # again: no change
        seen = poll(lambda: client.batches.retrieve(batch.id), lambda b: b.status in OPENAI_ENDED)
        assert statuses(seen) == ["cancelling", "cancelled"]
        last = seen[-1]
        assert last.request_counts.completed == done and last.cancelled_at is not None
        output, errors = (openai_lines(client, last.output_file_id),
                          openai_lines(client, last.error_file_id))  # fmt: skip
        assert len(output) == done and len(errors) == 12 - done
        assert sorted(line["custom_id"] for line in output + errors) == sorted(ROWS)
        for line in errors:
            assert line["response"] is None and line["error"]["code"] == "batch_cancelled"
        with pytest.raises(openai.BadRequestError, match="cancelled"):
            client.batches.cancel(batch.id)


def test_a_batch_cancelled_while_validating_runs_no_row():
    with make_server() as server:
        client = openai_client(server)
        batch = submit(client, input_lines(ROWS))
        assert client.batches.cancel(batch.id).status == "cancelling"
        last = poll(lambda: client.batches.retrieve(batch.id), lambda b: b.status in OPENAI_ENDED)
        assert last[-1].status == "cancelled" and last[-1].in_progress_at is None
        assert last[-1].output_file_id is None
        assert len(openai_lines(client, last[-1].error_file_id)) == 12


# --- OpenAI: faults --------------------------------------------------------------------------


def test_an_expired_batch_writes_its_undone_rows_to_the_error_file():
    rows = {f"r{i}": chat_body(f"q {i}") for i in range(9)}  # odd: no row finishes on the dot
    with make_server(expire={1}) as server:
        client = openai_client(server)
        batch = submit(client, input_lines(rows))
        poll(lambda: client.batches.retrieve(batch.id), lambda b: b.status == "in_progress")
        time.sleep(3 * STEP)  # well past the expiry: rows undone then stay undone
        last = client.batches.retrieve(batch.id)
        assert last.status == "expired" and last.expired_at is not None
        assert last.completed_at is None and last.request_counts.completed == 4
        output, errors = (openai_lines(client, last.output_file_id),
                          openai_lines(client, last.error_file_id))  # fmt: skip
        assert sorted(line["custom_id"] for line in output) == [f"r{i}" for i in range(4)]
        assert sorted(line["custom_id"] for line in errors) == [f"r{i}" for i in range(4, 9)]
        assert {line["error"]["code"] for line in errors} == {"batch_expired"}
        assert all(line["response"] is None for line in errors)


def test_a_stuck_batch_stays_in_finalizing_until_cancelled_and_then_gives_every_row():
    with make_server(stuck_finalizing={1}) as server:
        client = openai_client(server)
        batch = submit(client, input_lines(ROWS))
        poll(lambda: client.batches.retrieve(batch.id), lambda b: b.status == "finalizing")
        time.sleep(4 * STEP)
        stuck = client.batches.retrieve(batch.id)
        assert stuck.status == "finalizing" and stuck.request_counts.completed == 12
        client.batches.cancel(batch.id)
        seen = poll(lambda: client.batches.retrieve(batch.id), lambda b: b.status in OPENAI_ENDED)
        assert seen[-1].status == "cancelled" and seen[-1].error_file_id is None
        output = openai_lines(client, seen[-1].output_file_id)
        assert sorted(line["custom_id"] for line in output) == sorted(ROWS)


def test_uploads_fail_with_a_5xx_for_the_first_k_attempts():
    with make_server(upload_failures=2) as server:
        client = openai_client(server)
        for _ in range(2):
            with pytest.raises(openai.InternalServerError):
                client.files.create(file=("rows.jsonl", io.BytesIO(b"{}\n")), purpose="batch")
        client.files.create(file=("rows.jsonl", io.BytesIO(b"{}\n")), purpose="batch")
        assert (server.stats.upload_attempts, server.stats.files_uploaded) == (3, 1)


def test_a_lost_create_reply_leaves_a_batch_the_client_can_find_by_listing():
    with make_server(lost_creates={1}) as server:
        client = openai_client(server)
        with pytest.raises(openai.InternalServerError):
            submit(client, input_lines(ROWS), metadata={"job": "lost"})
        (found,) = client.batches.list()
        assert found.metadata == {"job": "lost"}
        assert server.stats.batch_submissions == dict.fromkeys(ROWS, 1)


def bad_lines() -> dict[str, bytes]:
    good = input_lines({"a": chat_body("a")})
    return {
        "duplicate_custom_id": good + good,
        "url_mismatch": good + input_lines({"b": chat_body("b")}, "/v1/completions"),
        "invalid_json_line": good + b"{not json\n",
        "model_mismatch": good + input_lines({"b": {**chat_body("b"), "model": "other"}}),
        "invalid_request": good + b'{"custom_id": "b", "method": "GET", "url": "/v1/chat/completions", "body": {}}\n',
        "empty_file": b"",
        "too_many_tasks": input_lines({f"r{i}": chat_body(str(i)) for i in range(4)}),
    }  # fmt: skip


@pytest.mark.parametrize("code", list(bad_lines()))
def test_a_bad_input_file_fails_validation_with_the_line_named(code):
    with make_server(max_requests_per_batch=3) as server:
        seen, output, errors = run_openai(openai_client(server), bad_lines()[code])
        assert statuses(seen) == ["validating", "failed"]
        last = seen[-1]
        assert [e.code for e in last.errors.data] == [code]
        assert last.errors.data[0].line == (None if code in ("empty_file", "too_many_tasks") else 2)
        assert last.failed_at is not None and last.in_progress_at is None
        assert (last.output_file_id, last.error_file_id, output, errors) == (None, None, [], [])
        assert server.stats.batch_submissions == {}


def test_an_injected_validation_failure_hits_only_the_batches_named():
    with make_server(invalid={1}) as server:
        client = openai_client(server)
        first, _, _ = run_openai(client, input_lines(ROWS))
        assert first[-1].status == "failed"
        assert first[-1].errors.data[0].code == "token_limit_exceeded"
        second, output, _ = run_openai(client, input_lines(ROWS))
        assert second[-1].status == "completed" and len(output) == 12
        assert server.stats.batch_submissions == dict.fromkeys(ROWS, 1)


def test_a_file_over_the_size_limit_is_refused_at_upload():
    with make_server(max_file_bytes=100) as server:
        client = openai_client(server)
        with pytest.raises(openai.BadRequestError, match="too large"):
            client.files.create(file=("rows.jsonl", io.BytesIO(input_lines(ROWS))), purpose="batch")
        assert server.stats.files_uploaded == 0


# --- OpenAI: files and listing ---------------------------------------------------------------


def test_files_can_be_read_back_and_deleted():
    with make_server() as server:
        client = openai_client(server)
        data = input_lines({"é": chat_body("non-ASCII ✓")})
        file = client.files.create(file=("rows.jsonl", io.BytesIO(data)), purpose="batch")
        assert (file.bytes, file.filename, file.purpose) == (len(data), "rows.jsonl", "batch")
        assert client.files.retrieve(file.id).id == file.id
        assert client.files.content(file.id).content == data
        assert client.files.delete(file.id).deleted
        with pytest.raises(openai.NotFoundError):
            client.files.retrieve(file.id)
        with pytest.raises(openai.NotFoundError):
            client.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions",
                                  completion_window="24h")  # fmt: skip


def test_batches_are_listed_newest_first_page_by_page():
    with make_server() as server:
        client = openai_client(server)
        ids = [submit(client, input_lines({"a": chat_body("a")})).id for _ in range(3)]
        first = client.batches.list(limit=2)
        assert [b.id for b in first.data] == ids[:0:-1] and first.has_more
        assert [b.id for b in client.batches.list(limit=2)] == ids[::-1]  # the SDK pages on
        with pytest.raises(openai.NotFoundError):
            client.batches.retrieve("batch_missing")


def test_the_batch_endpoints_want_the_key_the_live_ones_want():
    with LLMServer(Faults(required_key="right")) as server:
        client = openai.OpenAI(base_url=server.openai_url, api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            client.batches.list()


# --- Anthropic -------------------------------------------------------------------------------


PARAMS = {f"row-{i}": message_params(f"question number {i}") for i in range(8)}


def create_message_batch(client: anthropic.Anthropic, params: dict[str, dict[str, Any]]):
    requests: Any = [{"custom_id": cid, "params": p} for cid, p in params.items()]
    return client.messages.batches.create(requests=requests)


def run_anthropic(client: anthropic.Anthropic, params: dict[str, dict[str, Any]]):
    """Create a Message Batch and wait for it to end: (states seen, results by custom_id)."""
    batch = create_message_batch(client, params)
    seen = [batch, *poll(lambda: client.messages.batches.retrieve(batch.id),
                         lambda b: b.processing_status == "ended")]  # fmt: skip
    results = list(client.messages.batches.results(batch.id))
    by_id = {r.custom_id: r.result for r in results}
    assert len(by_id) == len(results) == len(params)  # each request once
    return seen, by_id


def test_anthropic_batch_runs_to_the_end_and_its_results_come_from_this_server():
    with make_server() as server:
        client = anthropic_client(server)
        seen, results = run_anthropic(client, PARAMS)
        assert statuses(seen) == ["in_progress", "ended"]
        for batch in seen[:-1]:  # Anthropic counts outcomes only once the batch has ended
            assert batch.request_counts.processing == 8 and batch.results_url is None
        last = seen[-1]
        assert last.request_counts.succeeded == 8 and last.request_counts.processing == 0
        assert last.ended_at is not None and last.ended_at > last.created_at
        assert last.results_url.startswith(server.anthropic_url + "/v1/messages/batches/")
        for cid, result in results.items():
            assert result.type == "succeeded"
            question = PARAMS[cid]["messages"][0]["content"]
            assert result.message.content[0].text == reply_text(question)
        assert server.stats.batch_submissions == dict.fromkeys(PARAMS, 1)


def test_an_anthropic_result_message_is_what_the_live_endpoint_gives():
    params = {**message_params("compare me"), "system": "be brief", "stop_sequences": ["to:"]}
    with make_server() as server:
        client = anthropic_client(server)
        live = client.messages.create(**params)
        _, results = run_anthropic(client, {"one": params})
        batched = results["one"].message
        assert isinstance(batched, Message) and batched.id != live.id
        assert batched.model_dump(exclude={"id"}) == live.model_dump(exclude={"id"})


def test_anthropic_rows_that_fail_come_back_errored_with_their_error():
    params = {**PARAMS, "busy": message_params("BUSY now"),
              "no-max": {"model": "claude-test", "messages": [{"role": "user", "content": "x"}]},
              "streamed": {**message_params("s"), "stream": True}}  # fmt: skip
    with make_server(permanent={"BUSY": 529}) as server:
        seen, results = run_anthropic(anthropic_client(server), params)
        counts = seen[-1].request_counts
        assert (counts.succeeded, counts.errored) == (8, 3)
        errored = {cid: r.error.error.type for cid, r in results.items() if r.type == "errored"}
        assert errored == {"busy": "overloaded_error", "no-max": "invalid_request_error",
                           "streamed": "invalid_request_error"}  # fmt: skip
        assert all(results[cid].error.request_id for cid in errored)


def test_anthropic_cancel_cancels_the_requests_not_yet_done():
    with make_server() as server:
        client = anthropic_client(server)
        server.faults.batch.step_s = 1.0  # the first row finishes 0.125 s in
        batch = create_message_batch(client, PARAMS)
        canceling = client.messages.batches.cancel(batch.id)
        assert canceling.processing_status == "canceling" and canceling.cancel_initiated_at
        seen = poll(lambda: client.messages.batches.retrieve(batch.id),
                    lambda b: b.processing_status == "ended")  # fmt: skip
        results = {r.custom_id: r.result.type for r in client.messages.batches.results(batch.id)}
        done = [cid for cid in PARAMS if results[cid] == "succeeded"]
        assert done == list(PARAMS)[: len(done)]  # rows finish in order
        assert [results[cid] for cid in list(PARAMS)[len(done) :]] == ["canceled"] * (8 - len(done))
        assert len(done) < 8
        assert seen[-1].request_counts.canceled == 8 - len(done)
        with pytest.raises(anthropic.BadRequestError):
            client.messages.batches.cancel(batch.id)


def test_an_expired_anthropic_batch_marks_its_undone_requests_expired():
    params = {**PARAMS, "ninth": message_params("nine")}  # odd: no row finishes on the dot
    with make_server(expire={1}) as server:
        seen, results = run_anthropic(anthropic_client(server), params)
        assert [results[cid].type for cid in params] == ["succeeded"] * 4 + ["expired"] * 5
        counts = seen[-1].request_counts
        assert (counts.succeeded, counts.expired, counts.canceled) == (4, 5, 0)


def test_a_stuck_anthropic_batch_never_ends_and_has_no_results_until_cancelled():
    with make_server(stuck_finalizing={1}) as server:
        client = anthropic_client(server)
        batch = create_message_batch(client, PARAMS)
        time.sleep(5 * STEP)
        assert client.messages.batches.retrieve(batch.id).processing_status == "in_progress"
        with pytest.raises(anthropic.AnthropicError, match="results_url"):
            client.messages.batches.results(batch.id)
        client.messages.batches.cancel(batch.id)
        poll(lambda: client.messages.batches.retrieve(batch.id),
             lambda b: b.processing_status == "ended")  # fmt: skip
        types = {r.result.type for r in client.messages.batches.results(batch.id)}
        assert types == {"succeeded"}  # every request had finished: nothing left to cancel


@pytest.mark.parametrize(
    ("requests", "limits", "error"),
    [
        ([{"custom_id": "a", "params": {}}] * 2, {}, anthropic.BadRequestError),
        ([{"custom_id": "has space", "params": {}}], {}, anthropic.BadRequestError),
        ([{"custom_id": f"r{i}", "params": {}} for i in range(3)], {"max_requests_per_batch": 2},
         anthropic.BadRequestError),
        ([{"custom_id": "a", "params": message_params("x" * 500)}], {"max_file_bytes": 300},
         anthropic.ContentTooLargeError),
    ],
    ids=["duplicate-custom-id", "bad-custom-id", "too-many-requests", "too-many-bytes"],
)  # fmt: skip
def test_anthropic_refuses_a_bad_batch_at_create(requests, limits, error):
    with make_server(**limits) as server:
        with pytest.raises(error):
            anthropic_client(server).messages.batches.create(requests=requests)
        assert (server.stats.batches_created, server.stats.upload_attempts) == (0, 1)


def test_anthropic_create_fails_for_the_first_k_attempts_then_succeeds():
    with make_server(upload_failures=1) as server:
        client = anthropic_client(server)
        with pytest.raises(anthropic.InternalServerError):
            create_message_batch(client, PARAMS)
        create_message_batch(client, PARAMS)
        assert server.stats.batch_submissions == dict.fromkeys(PARAMS, 1)


def test_anthropic_batches_list_page_by_page_and_delete_once_ended():
    with make_server() as server:
        client = anthropic_client(server)
        ids = [create_message_batch(client, {"a": message_params("a")}).id for _ in range(3)]
        assert [b.id for b in client.messages.batches.list(limit=2)] == ids[::-1]
        after = client.messages.batches.list(limit=1, after_id=ids[2])
        assert [b.id for b in after.data] == [ids[1]] and after.has_more
        before = client.messages.batches.list(limit=5, before_id=ids[0])
        assert [b.id for b in before.data] == [ids[2], ids[1]] and not before.has_more
        with pytest.raises(anthropic.BadRequestError):
            client.messages.batches.delete(ids[0])  # still processing
        poll(lambda: client.messages.batches.retrieve(ids[0]),
             lambda b: b.processing_status == "ended")  # fmt: skip
        assert client.messages.batches.delete(ids[0]).type == "message_batch_deleted"
        with pytest.raises(anthropic.NotFoundError):
            client.messages.batches.retrieve(ids[0])
