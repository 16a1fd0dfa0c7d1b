"""Contract tests of VLLM's data-parallel replicas against the vLLM stand-in.

`data_parallel_size: N` makes lmpress start N replica processes, each pinned to its own GPUs
with CUDA_VISIBLE_DEVICES, and spread rows across them. Here the replicas import the stand-in
(tests/engines/local/vllm_standin) instead of vLLM, and pretend GPUs come from CUDA_VISIBLE_DEVICES;
each stand-in engine logs its pid, its GPUs and the requests it served. These tests prove
lmpress's replica machinery (pinning, spreading, streaming, cancellation, failures), not vLLM.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections import Counter

import pytest

from lmpress.configs import load_config
from lmpress.engines.local.vllm.replicas import (
    ReplicaPool,
    replica_gpus,
    request_from_wire,
    result_from_wire,
)
from lmpress.engines.registry import create_engine
from lmpress.errors import ConfigError
from lmpress.types import (
    ContentPart,
    Delta,
    ErrorInfo,
    GenerationParams,
    Message,
    Request,
    Result,
    Sample,
    TokenLogprob,
    Usage,
)
from tests.conftest import run_lmpress
from tests.engines.local.vllm_contract_support import (
    STANDIN,
    STANDIN_VARS,
    forget_vllm,
    model_dir,
    read_log,
    standin_env,
)

__all__ = ["model_dir"]  # fixtures


def test_gpus_are_split_in_order():
    assert replica_gpus(2, 2, ["0", "1", "2", "3"]) == [["0", "1"], ["2", "3"]]
    assert replica_gpus(3, 1, ["4", "5", "6", "7"]) == [["4"], ["5"], ["6"]]
    with pytest.raises(ConfigError) as err:
        replica_gpus(3, 2, ["0", "1", "2", "3"])
    assert str(err.value) == (
        "model.model_kwargs.data_parallel_size: 3 replicas of 2 GPU(s) each "
        "(tensor_parallel_size x pipeline_parallel_size) need 6 GPUs, but 4 are visible "
        "(CUDA_VISIBLE_DEVICES: 0,1,2,3)"
    )


def test_requests_and_results_cross_the_wire_intact():
    request = Request(
        "r1",
        [Message("system", "be brief"),
         Message("user", [ContentPart("text", text="look"), ContentPart("image_url", image_url="data:x")])],
        GenerationParams(temperature=0.5, n=2, stop_strings=["\n"], guided_decoding={"choice": ["a"]},
                         logit_bias={"3": 1.0}),
    )  # fmt: skip
    wired = json.loads(json.dumps(dataclasses.asdict(request)))
    assert request_from_wire(wired) == request
    result = Result(
        "r1",
        [Sample("hi", "stop", [TokenLogprob("hi", -0.1, [("hi", -0.1), ("yo", -2.0)])], 1),
         Sample("", "error")],
        Usage(3, 1), "m", "VLLM", 0.25, ErrorInfo("invalid_request", "no", None),
    )  # fmt: skip
    assert result_from_wire(json.loads(json.dumps(dataclasses.asdict(result)))) == result


def write_rows(path, count: int) -> None:
    rows = [{"id": f"r{i}", "prompt": f"row {i} café 東京"} for i in range(count)]
    text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    path.write_text(text, encoding="utf-8")


def test_rows_are_spread_across_replicas_pinned_to_their_gpus(model_dir, tmp_path):
    source, out, log = tmp_path / "in.jsonl", tmp_path / "out.jsonl", tmp_path / "standin.log"
    write_rows(source, 24)
    env = standin_env(
        CUDA_VISIBLE_DEVICES="0,1,2,3",
        VLLM_STANDIN_LOG=str(log),
        VLLM_STANDIN_TOKEN_DELAY_S="0.01",
        # vLLM may print to stdout; the replicas' protocol must not mind.
        VLLM_LOGGING_STREAM="ext://sys.stdout",
    )
    run = run_lmpress(
        "batch", "--engine", "VLLM", "--model.model_name", model_dir, "-i", str(source),
        "-o", str(out), "--model.model_kwargs.data_parallel_size", "2",
        "--model.model_kwargs.tensor_parallel_size", "2", env=env,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["id"] for r in written) == sorted(f"r{i}" for i in range(24))
    for row in written:
        number = row["id"][1:]
        reply = f"<|im_start|>user row {number} café 東京<|im_end|> <|im_start|>assistant"
        assert row["response"]["text"] == reply
    events = read_log(log)
    starts = [e for e in events if e["event"] == "start"]
    assert sorted(e["cuda_visible_devices"] for e in starts) == ["0,1", "2,3"]
    assert all(e["args"]["tensor_parallel_size"] == 2 for e in starts)
    assert all(e["args"]["data_parallel_size"] == 1 for e in starts)  # each replica is one engine
    served = Counter(e["cuda_visible_devices"] for e in events if e["event"] == "request")
    assert sum(served.values()) == 24
    assert min(served.values()) >= 6, served  # both replicas did a fair share
    assert len({e["pid"] for e in events}) == 2
    assert [e["event"] for e in events].count("shutdown") == 2


def test_more_replicas_than_gpus_is_refused_before_anything_starts(model_dir, tmp_path):
    log = tmp_path / "standin.log"
    env = standin_env(CUDA_VISIBLE_DEVICES="0,1,2", VLLM_STANDIN_LOG=str(log))
    run = run_lmpress(
        "infer", "--engine", "VLLM", "--model.model_name", model_dir, "hi",
        "--model.model_kwargs.data_parallel_size", "2", "--model.model_kwargs.tensor_parallel_size", "2",
        env=env,
    )  # fmt: skip
    assert run.returncode == 2
    assert (
        "2 replicas of 2 GPU(s) each (tensor_parallel_size x pipeline_parallel_size) need 4 GPUs, but 3 are visible"
        in run.stderr
    )
    assert read_log(log) == []


def test_a_replica_that_cannot_start_is_named(model_dir):
    run = run_lmpress(
        "infer", "--engine", "VLLM", "--model.model_name", model_dir, "hi",
        "--model.model_kwargs.data_parallel_size", "2", "--model.model_kwargs.max_lora_rank", "3",
        env=standin_env(CUDA_VISIBLE_DEVICES="0,1"),
    )  # fmt: skip
    assert run.returncode == 2
    assert run.stderr.startswith(
        "lmpress: error: vLLM replica 0 (GPUs 0): vLLM could not start model"
    ), run.stderr
    assert "1 validation error for LoRAConfig max_lora_rank Input should be 1, 8, 16" in run.stderr
    assert run.stderr.count("\n") == 1


def test_a_replica_engine_dying_stops_the_job_and_keeps_written_rows(model_dir, tmp_path):
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_rows(source, 40)
    env = standin_env(CUDA_VISIBLE_DEVICES="0,1", VLLM_STANDIN_DIE_AFTER="5")
    # max_num_seqs 1: two requests in flight per replica, so most rows are still unread.
    run = run_lmpress(
        "batch", "--engine", "VLLM", "--model.model_name", model_dir, "-i", str(source),
        "-o", str(out), "--model.model_kwargs.data_parallel_size", "2",
        "--model.model_kwargs.max_num_seqs", "1", env=env,
    )  # fmt: skip
    assert run.returncode == 2
    assert "vLLM's engine stopped" in run.stderr and "vLLM replica" in run.stderr
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert 4 <= len(written) <= 10, len(written)
    assert all(r["response"]["finish_reason"] == "stop" for r in written)


@pytest.fixture
def replica_env(monkeypatch, tmp_path):
    """This process drives the pool; the replica processes it starts import the stand-in."""
    forget_vllm()
    for name in STANDIN_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.syspath_prepend(str(STANDIN))
    for key, value in standin_env(CUDA_VISIBLE_DEVICES="0,1").items():
        monkeypatch.setenv(key, value)
    log = tmp_path / "standin.log"
    monkeypatch.setenv("VLLM_STANDIN_LOG", str(log))
    yield log
    forget_vllm()


def test_streaming_and_cancelling_through_replicas(model_dir, replica_env, monkeypatch):
    monkeypatch.setenv("VLLM_STANDIN_TOKEN_DELAY_S", "0.05")
    config = load_config(
        None,
        {"model.model_name": model_dir, "model.model_kwargs.data_parallel_size": 2},
        engine="VLLM",
    )
    engine = create_engine(config)
    assert isinstance(engine._backend, ReplicaPool)
    assert engine.max_in_flight == 2 * 256 * 2

    async def stream_one() -> list[Delta | Result]:
        return [item async for item in engine.stream(Request("s", [Message("user", "a b c")]))]

    async def leave_early() -> str:
        stream = engine.stream(Request("gone", [Message("user", " ".join(["w"] * 40))]))
        first = await anext(stream)
        await stream.aclose()
        return first.text

    try:
        items = asyncio.run(stream_one())
        first = asyncio.run(leave_early())
        deadline = time.monotonic() + 10
        while not any(e["event"] == "abort" for e in read_log(replica_env)):
            assert time.monotonic() < deadline, "the replica never aborted the request"
            time.sleep(0.05)
    finally:
        asyncio.run(engine.aclose())
    deltas, result = items[:-1], items[-1]
    assert isinstance(result, Result) and all(isinstance(d, Delta) for d in deltas)
    assert len(deltas) == 5 and "".join(d.text for d in deltas) == result.text
    assert result.request_id == "s" and all(d.request_id == "s" for d in deltas)
    assert first == "<|im_start|>user"
    aborts = [e for e in read_log(replica_env) if e["event"] == "abort"]
    assert {e["request_id"].split("-")[0] for e in aborts} == {"gone"}
