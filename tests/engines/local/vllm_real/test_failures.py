"""When vLLM cannot start, or its engine dies, lmpress ends with one line: vLLM's own reason,
read out of its child processes' log, and the setting to change; never vLLM's traceback.

Each case is an `lmpress infer` that vLLM refuses after tens of seconds of starting up, so the
module starts both at once and each test reads its own."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

from tests.conftest import CliRun, run_lmpress

EAGER = ["--model.model_kwargs.enforce_eager", "true", "--model.model_max_length", "512"]
CASES = {
    # more KV cache than the machine's memory
    "kv-cache": (["--model.model_name", "tiny:llama-head32"], {"VLLM_CPU_KVCACHE_SPACE": "100000"}),
    # 16-wide heads, which vLLM's CPU attention lacks
    "head-size": (["--model.model_name", "tiny:llama"], {}),
}  # fmt: skip


@pytest.fixture(scope="module")
def runs() -> Iterator[dict[str, Future[CliRun]]]:
    with ThreadPoolExecutor(len(CASES)) as pool:
        yield {
            name: pool.submit(
                run_lmpress,
                "infer",
                "--engine",
                "VLLM",
                *model,
                *EAGER,
                "hello",
                env=env,
                timeout=600,
            )  # fmt: skip
            for name, (model, env) in CASES.items()
        }


def failed_in_one_line(run: CliRun) -> str:
    assert run.returncode != 0
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("lmpress: error: "), run.stderr[-3000:]
    return last


def test_more_kv_cache_than_memory_names_the_settings(runs):
    last = failed_in_one_line(runs["kv-cache"].result())
    assert "memory" in last and "VLLM_CPU_KVCACHE_SPACE" in last, last
    assert "gpu_memory_utilization" in last


def test_a_head_size_vllms_cpu_attention_lacks_says_so_in_one_line(runs):
    last = failed_in_one_line(runs["head-size"].result())
    assert "head_dim=16" in last and "engine NATIVE" in last, last
