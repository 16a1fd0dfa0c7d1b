"""/v1/files and /v1/batches in `lmpress serve` (issue 36), driven by the official openai SDK
against a real server: the whole flow, a malformed line, cancel, SIGKILL and resume, and
lmpress's own `--provider-batch` client pointed at the server."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

import pytest
from openai import ConflictError, NotFoundError, OpenAI
from openai.types import Batch
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import run_lmpress, with_plugin
from tests.serve.conftest import Served


def batch_file(path: Path, bodies: list[dict], url: str = "/v1/chat/completions") -> Path:
    lines = [{"custom_id": f"req-{i}", "method": "POST", "url": url, "body": body}
             for i, body in enumerate(bodies)]  # fmt: skip
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def chat_body(model: str, i: int) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": f"Tell me about {i}"}],
            "temperature": 0, "max_tokens": 8}  # fmt: skip


def wait_for(client: OpenAI, batch_id: str, done, timeout: float = 120) -> Batch:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        batch = client.batches.retrieve(batch_id)
        if done(batch):
            return batch
        time.sleep(0.05)
    raise AssertionError(f"batch {batch_id} still {batch.status} after {timeout}s")


def ended(batch: Batch) -> bool:
    return batch.status in ("completed", "failed", "cancelled", "expired")


def jsonl(client: OpenAI, file_id: str) -> list[dict]:
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines()]


def start_batch(client: OpenAI, path: Path) -> Batch:
    upload = client.files.create(file=path, purpose="batch")
    return client.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )


def batch_lines_counted(served: Served) -> dict[str, float]:
    """`lmpress_batch_lines_total` of /metrics, by outcome."""
    text = served.http().get("/metrics").text
    return {
        sample.labels["outcome"]: sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "lmpress_batch_lines"
        for sample in family.samples
        if sample.name == "lmpress_batch_lines_total"
    }


def test_the_sdk_flow_answers_what_chat_completions_answers(llama_server, tmp_path):
    client = llama_server.client()
    counted = batch_lines_counted(llama_server)
    bodies = [chat_body("tiny-llama", i) for i in range(6)]
    upload = client.files.create(file=batch_file(tmp_path / "in.jsonl", bodies), purpose="batch")
    assert upload.purpose == "batch" and upload.bytes == (tmp_path / "in.jsonl").stat().st_size
    assert client.files.retrieve(upload.id).id == upload.id
    batch = client.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h",
        metadata={"job": "flow"},
    )  # fmt: skip
    assert batch.status == "validating" and batch.metadata == {"job": "flow"}
    batch = wait_for(client, batch.id, ended)
    assert batch.status == "completed", batch
    assert batch.request_counts.model_dump() == {"total": 6, "completed": 6, "failed": 0}
    assert batch.in_progress_at and batch.finalizing_at and batch.completed_at
    assert batch.error_file_id is None
    now = batch_lines_counted(llama_server)
    assert (now["completed"] - counted["completed"], now["failed"] - counted["failed"]) == (6, 0)
    with pytest.raises(ConflictError, match="Cannot cancel a batch with status 'completed'"):
        client.batches.cancel(batch.id)
    out = {line["custom_id"]: line for line in jsonl(client, batch.output_file_id)}
    assert sorted(out) == [f"req-{i}" for i in range(6)]
    for i, body in enumerate(bodies):
        live = client.chat.completions.create(**body)
        line = out[f"req-{i}"]
        assert line["response"]["status_code"] == 200 and line["error"] is None
        got = line["response"]["body"]["choices"][0]["message"]["content"]
        assert got == live.choices[0].message.content
    assert batch.id in [b.id for b in client.batches.list(limit=100)]
    assert upload.id in [f.id for f in client.files.list()]
    assert client.files.delete(upload.id).deleted
    with pytest.raises(Exception, match="No such File"):
        client.files.retrieve(upload.id)


def test_a_malformed_line_fails_alone_into_the_error_file(llama_server, tmp_path):
    client = llama_server.client()
    path = batch_file(tmp_path / "in.jsonl", [chat_body("tiny-llama", i) for i in range(3)])
    text = path.read_text().splitlines()
    text.insert(1, '{"custom_id": "broken", "method": "POST", "url": "/v1/chat/completions", '
                   '"body": {"model": "tiny-llama", "messages": "not a list"}}')  # fmt: skip
    text.insert(3, "this is not json")
    text.append(json.dumps({"custom_id": "elsewhere", "method": "POST", "url": "/v1/completions",
                            "body": {"model": "tiny-llama", "prompt": "Hi"}}))  # fmt: skip
    # A file of the server's own machine, named as an image: refused, as the chat route does.
    local = [{"type": "text", "text": "What is this?"},
             {"type": "image_url", "image_url": {"url": "/etc/hostname"}}]  # fmt: skip
    text.append(json.dumps({"custom_id": "local-file", "method": "POST", "url": "/v1/chat/completions",
                            "body": {"model": "tiny-llama",
                                     "messages": [{"role": "user", "content": local}]}}))  # fmt: skip
    path.write_text("\n".join(text) + "\n")
    batch = wait_for(client, start_batch(client, path).id, ended)
    assert batch.status == "completed"
    assert batch.request_counts.model_dump() == {"total": 7, "completed": 3, "failed": 4}
    done = [line["custom_id"] for line in jsonl(client, batch.output_file_id)]
    assert sorted(done) == ["req-0", "req-1", "req-2"]
    errors = jsonl(client, batch.error_file_id)
    assert len(errors) == 4
    refused = next(e for e in errors if e["custom_id"] == "local-file")
    assert "reads no local files" in refused["error"]["message"]
    assert "hostname" not in json.dumps(jsonl(client, batch.output_file_id))
    broken = next(e for e in errors if e["custom_id"] == "broken")
    assert broken["response"]["status_code"] == 400 and broken["response"]["body"] is None
    assert "messages" in broken["error"]["message"]
    assert all(e["error"]["code"] and e["id"].startswith("batch_req_") for e in errors)
    assert {e["line"] for e in errors} == {
        2,
        4,
        6,
        7,
    }  # the input lines, as the runner records them
    elsewhere = next(e for e in errors if e["custom_id"] == "elsewhere")
    assert "not this batch's endpoint /v1/chat/completions" in elsewhere["error"]["message"]


def echo_args(state: Path) -> list[str]:
    """ECHO at 100 words a second, one batch line at a time, state under `state`."""
    return ["--engine", "ECHO", "--model.model_name", "echo-model",
            "--generation.max_new_tokens", "20", "--state-dir", str(state)]  # fmt: skip


def echo_env(echo_plugin: str) -> dict[str, str]:
    return {**with_plugin(echo_plugin), "ECHO_DELAY_S": "0.01"}


@pytest.fixture(scope="module")
def echo_batches(serve_process, echo_plugin, tmp_path_factory) -> Served:
    state = tmp_path_factory.mktemp("echo-state")
    return serve_process(*echo_args(state), env=echo_env(echo_plugin))


def echo_lines(path: Path, count: int) -> Path:
    bodies = [{"model": "echo-model", "messages": [{"role": "user", "content": f"line {i}"}]}
              for i in range(count)]  # fmt: skip
    return batch_file(path, bodies)


def test_a_cancelled_batch_keeps_the_lines_done_so_far(echo_batches, tmp_path):
    client = echo_batches.client()
    batch = start_batch(client, echo_lines(tmp_path / "in.jsonl", 40))
    wait_for(client, batch.id, lambda b: b.request_counts and b.request_counts.completed >= 3)
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status == "cancelling" and cancelling.cancelling_at
    batch = wait_for(client, batch.id, ended)
    assert batch.status == "cancelled" and batch.cancelled_at
    done = [line["custom_id"] for line in jsonl(client, batch.output_file_id)]
    assert 3 <= len(done) < 40  # generation stopped early
    assert len(set(done)) == len(done) == batch.request_counts.completed
    assert client.batches.cancel(batch.id).status == "cancelled"  # cancelling again: no change


def test_batches_run_one_at_a_time_and_a_waiting_one_cancels_at_once(echo_batches, tmp_path):
    client = echo_batches.client()
    first = start_batch(client, echo_lines(tmp_path / "first.jsonl", 40))
    second = start_batch(client, echo_lines(tmp_path / "second.jsonl", 5))
    wait_for(client, first.id, lambda b: b.request_counts and b.request_counts.completed >= 2)
    assert client.batches.retrieve(second.id).status == "validating"  # waiting for its turn
    cancelled = client.batches.cancel(second.id)
    assert cancelled.status == "cancelled" and cancelled.output_file_id is None
    assert cancelled.request_counts.completed == 0
    assert client.batches.retrieve(first.id).status == "in_progress"
    client.batches.cancel(first.id)
    assert wait_for(client, first.id, ended).status == "cancelled"


@pytest.mark.parametrize("stop", ["kill", "terminate"])
def test_a_killed_server_resumes_its_batch_and_writes_every_line_once(
    serve_process, echo_plugin, tmp_path, stop
):
    """SIGKILL leaves no chance to write anything more; SIGTERM stops the server, which must
    not let the engine's closing fail the lines it had in flight."""
    served = serve_process(*echo_args(tmp_path / "state"), env=echo_env(echo_plugin))
    client = served.client()
    batch = start_batch(client, echo_lines(tmp_path / "in.jsonl", 30))
    wait_for(client, batch.id, lambda b: b.request_counts and b.request_counts.completed >= 5)
    getattr(served.proc, stop)()
    served.proc.wait()
    before = Batch.model_validate_json(
        (tmp_path / "state/batches" / f"{batch.id}.json").read_text()
    )
    assert before.status == "in_progress"
    out = tmp_path / "state/batches" / batch.id / "out.jsonl"
    assert 0 < out.read_bytes().count(b"\n") < 30  # killed mid-batch

    again = serve_process(*echo_args(tmp_path / "state"), env=echo_env(echo_plugin))
    client = again.client()
    batch = wait_for(client, batch.id, ended)
    assert batch.status == "completed"
    assert batch.request_counts.model_dump() == {"total": 30, "completed": 30, "failed": 0}
    ids = Counter(line["custom_id"] for line in jsonl(client, batch.output_file_id))
    assert ids == Counter(f"req-{i}" for i in range(30))  # each line once
    again.stop()


def test_a_batch_that_fails_keeps_the_lines_it_finished_readable(
    serve_process, echo_plugin, tmp_path
):
    """Restarted with other generation settings, the server cannot resume the batch (its
    output would mix two): the batch fails, and what it did finish stays fetchable."""
    served = serve_process(*echo_args(tmp_path / "state"), env=echo_env(echo_plugin))
    client = served.client()
    batch = start_batch(client, echo_lines(tmp_path / "in.jsonl", 30))
    wait_for(client, batch.id, lambda b: b.request_counts and b.request_counts.completed >= 5)
    served.proc.kill()
    served.proc.wait()
    out = tmp_path / "state/batches" / batch.id / "out.jsonl"
    finished = out.read_bytes().count(b"\n")

    changed = [*echo_args(tmp_path / "state"), "--generation.temperature", "0.5"]
    again = serve_process(*changed, env=echo_env(echo_plugin))
    client = again.client()
    batch = wait_for(client, batch.id, ended)
    assert batch.status == "failed" and batch.errors.data[0].message
    assert batch.request_counts.completed == finished > 0
    assert len(jsonl(client, batch.output_file_id)) == finished
    again.stop()


def test_lmpress_provider_batch_through_lmpress_serve(echo_batches, tmp_path):
    served = echo_batches
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"id": f"row-{i}", "prompt": f"question {i}"}) + "\n"
                            for i in range(5)))  # fmt: skip
    out = tmp_path / "out.jsonl"
    run = run_lmpress(
        "batch", "--engine", "REMOTE", "--remote_params.api_url", f"{served.url}/v1",
        "--model.model_name", "echo-model", "-i", str(rows), "-o", str(out), "--provider-batch",
        "--remote_params.batch_poll_max_s", "0.2",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    got = {row["id"]: row for row in map(json.loads, out.read_text().splitlines())}
    assert sorted(got) == [f"row-{i}" for i in range(5)]
    for i in range(5):
        assert f'"content": "question {i}"' in got[f"row-{i}"]["response"]["text"]


def test_without_a_state_dir_the_batch_routes_say_how_to_turn_them_on(echo_server):
    with pytest.raises(NotFoundError, match="--state-dir"):
        echo_server.client().batches.list()


def test_an_upload_is_kept_byte_for_byte_and_a_bad_one_is_a_400_naming_the_field(echo_batches):
    client = echo_batches.client()
    line = json.dumps({"custom_id": "x", "method": "POST", "url": "/v1/chat/completions",
                       "body": {"model": "echo-model", "messages": [{"role": "user",
                                                                      "content": "é" * 40}]}})  # fmt: skip
    data = ((line + "\n") * 40_000).encode()  # about 5 MB: past the form parser's memory spool
    kept = client.files.create(file=("big.jsonl", data), purpose="batch")
    assert kept.bytes == len(data)
    assert client.files.content(kept.id).content == data
    with echo_batches.http() as http:
        refusals = {
            "purpose": http.post("/v1/files", files={"file": ("a.jsonl", b"{}\n")},
                                 data={"purpose": "fine-tune"}),
            "empty": http.post("/v1/files", files={"file": ("a.jsonl", b"  \n")},
                               data={"purpose": "batch"}),
            "no file": http.post("/v1/files", data={"purpose": "batch"},
                                 files={"other": ("a.jsonl", b"{}\n")}),
            "not a form": http.post("/v1/files", json={"purpose": "batch"}),
            "not utf-8": http.post("/v1/files", files={"file": ("a.jsonl", b"{}\n"),
                                                       "purpose": (None, b"\xff\xfe")}),
        }  # fmt: skip
    for what, response in refusals.items():
        assert response.status_code == 400, (what, response.text)
        assert response.json()["error"]["message"], what
    assert refusals["purpose"].json()["error"]["param"] == "purpose"
    assert "empty" in refusals["empty"].json()["error"]["message"]
    assert refusals["no file"].json()["error"]["param"] == "file"
