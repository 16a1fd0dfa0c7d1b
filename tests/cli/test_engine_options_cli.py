"""The engines' typed `model.model_kwargs` through the real CLI: a typo is one line and exit 2
before any backend is imported (so before any weights), and `lmpress engines NAME` lists the
settings."""

from __future__ import annotations

import pytest

from tests.conftest import run_lmpress

# Each local engine, a typo of one of its settings, and the line that refuses it.
TYPOS = [
    (
        "NATIVE", "tiny:llama", "kv_cach_gb",
        "model.model_kwargs.kv_cach_gb: not a NATIVE setting, a transformers from_pretrained "
        "argument or a model config field; did you mean 'kv_cache_gb'?",
    ),
    (
        "LLAMACPP", "tiny-gguf:llama", "n_thread",
        "model.model_kwargs.n_thread: not a llama-cpp-python Llama parameter; did you mean "
        "'n_threads'?",
    ),
    (
        "VLLM", "tiny:llama", "tensor_paralel_size",
        "model.model_kwargs.tensor_paralel_size: not an engine argument of vLLM (did you mean "
        "'tensor_parallel_size'?); see https://docs.vllm.ai/en/latest/configuration/engine_args.html",
    ),
]  # fmt: skip
BACKENDS = ("torch", "transformers", "llama_cpp", "vllm")


@pytest.mark.parametrize(("engine", "model", "key", "line"), TYPOS, ids=[t[0] for t in TYPOS])
def test_a_typo_in_model_kwargs_is_one_line_before_any_backend_is_imported(
    tmp_path, engine, model, key, line
):
    rows = tmp_path / "in.jsonl"
    rows.write_text('{"prompt": "hi"}\n')
    out = tmp_path / "out.jsonl"
    run = run_lmpress(
        "batch", "--engine", engine, "--model.model_name", model,
        f"--model.model_kwargs.{key}", "2", "-i", str(rows), "-o", str(out),
        env={"PYTHONPROFILEIMPORTTIME": "1"},  # Python lists every module it imports
    )  # fmt: skip
    lines = run.stderr.splitlines()
    imports = [entry for entry in lines if entry.startswith("import time:")]
    said = [entry for entry in lines if not entry.startswith("import time:")]
    assert run.returncode == 2, run.stderr[-2000:]
    assert said == [f"lmpress: error: {line}"]
    imported = {entry.rsplit("|", 1)[-1].strip().split(".")[0] for entry in imports}
    assert imports and not imported & set(BACKENDS)
    assert not out.exists()


def test_a_valid_setting_and_a_from_pretrained_argument_still_run():
    run = run_lmpress(
        "infer", "--engine", "NATIVE", "--model.model_name", "tiny:llama",
        "--model.model_kwargs.kv_cache_gb", "0.5", "--model.model_kwargs.low_cpu_mem_usage",
        "true", "--generation.max_new_tokens", "4", "--generation.min_tokens", "4", "hello",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip()


def test_engines_name_lists_the_settings_with_type_default_and_description():
    run = run_lmpress("engines", "native")
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("NATIVE ")  # that engine alone
    assert "\nLLAMACPP" not in run.stdout
    lines = run.stdout.splitlines()
    at = lines.index("  kv_cache_gb: float | None = null")
    assert lines[at + 1].strip().startswith("the KV cache's budget in GiB")
    assert "  prefix_reuse: bool = true" in lines
    assert "Other keys go to transformers' from_pretrained" in run.stdout


def test_engines_name_of_an_engine_with_no_settings_and_of_no_engine():
    run = run_lmpress("engines", "OPENAI")
    assert run.returncode == 0, run.stderr
    assert "OPENAI declares no model.model_kwargs settings." in run.stdout
    typo = run_lmpress("engines", "NATIV")
    assert typo.returncode == 2
    assert typo.stderr.strip().splitlines() == [
        "lmpress: error: unknown engine 'NATIV'; run 'lmpress engines' to see them all"
    ]
