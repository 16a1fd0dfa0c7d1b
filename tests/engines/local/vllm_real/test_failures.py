"""When vLLM cannot start, or its engine dies, lmpress ends with one line: vLLM's own reason,
read out of its child processes' log, and the setting to change; never vLLM's traceback."""

from __future__ import annotations

from tests.conftest import run_lmpress

EAGER = ["--model.model_kwargs.enforce_eager", "true", "--model.model_max_length", "512"]


def assert_one_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr[-3000:]
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("lmpress: error: "), stderr[-3000:]
    return last


def test_more_kv_cache_than_memory_names_the_settings():
    run = run_lmpress(
        "infer", "--engine", "VLLM", "--model.model_name", "tiny:llama-head32", *EAGER,
        "hello", env={"VLLM_CPU_KVCACHE_SPACE": "100000"}, timeout=600,
    )  # fmt: skip
    assert run.returncode != 0
    last = assert_one_line(run.stderr)
    assert "memory" in last and "VLLM_CPU_KVCACHE_SPACE" in last, last
    assert "gpu_memory_utilization" in last


def test_a_head_size_vllms_cpu_attention_lacks_says_so_in_one_line():
    run = run_lmpress(
        "infer", "--engine", "VLLM", "--model.model_name", "tiny:llama", *EAGER, "hello",
        timeout=600,
    )  # fmt: skip
    assert run.returncode != 0
    last = assert_one_line(run.stderr)
    assert "head_dim=16" in last and "engine NATIVE" in last, last
