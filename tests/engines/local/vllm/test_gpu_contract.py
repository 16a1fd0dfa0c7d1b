"""contract test: needs GPUs to run for real. What vLLM does with several GPUs, or with its
GPU build and none (tensor, pipeline and data parallelism, the two-GPU recipe, the messages of
a GPU install on a machine without one), checked against the vLLM stand-in
(tests/engines/local/vllm_standin), whose CUDA_VISIBLE_DEVICES count stands for the GPUs. vLLM's
CPU build, which tests/engines/local/vllm_real/ runs, has none of these. They prove lmpress's
side, not vLLM; benchmarks/vllm_check.py runs the real thing on a GPU machine.
"""

from __future__ import annotations

import asyncio

import pytest

from lmpress.vocabulary.errors import ConfigError, ModelLoadError
from tests.conftest import run_lmpress
from tests.engines.local.vllm.contract_support import (
    model_dir,
    standin,
    standin_env,
    write_model_dir,
)
from tests.engines.local.vllm.test_cli_contract import RECIPE, run_check, vllm_block
from tests.engines.local.vllm.test_engine_contract import chat, close, make_engine, vllm_side

__all__ = ["model_dir", "standin"]  # fixtures

# --- no GPU ----------------------------------------------------------------------------------


def test_without_a_gpu_engines_and_infer_say_so(model_dir):
    env = standin_env(VLLM_STANDIN_NO_GPU="1")
    listing = run_lmpress("engines", env=env)
    assert "not usable: vLLM found no GPU on this machine" in vllm_block(listing.stdout)
    run = run_lmpress("infer", "--engine", "VLLM", "--model.model_name", model_dir, "hi", env=env)
    assert run.returncode == 2
    assert run.stderr.startswith(
        "lmpress: error: engine VLLM cannot run here: vLLM found no GPU on this machine"
    )
    assert "use engine NATIVE or LLAMACPP" in run.stderr and run.stderr.count("\n") == 1


def test_vllm_check_refuses_to_run_without_a_gpu(model_dir):
    run = run_check(model_dir, env=standin_env(VLLM_STANDIN_NO_GPU="1"))
    assert run.returncode == 2
    assert run.stderr.startswith("vllm_check: cannot run here: vLLM found no GPU on this machine")


# --- two or more GPUs ---------------------------------------------------------------------


def test_recipe_runs_on_two_gpus(tmp_path):
    model = write_model_dir(tmp_path / "m")
    # --cache off: each run starts the engine (a kept reply would be printed without one).
    args = ("infer", "-c", RECIPE, "--model.model_name", model, "--generation.seed", "3",
            "--cache", "off", "hello")  # fmt: skip
    two = run_lmpress(*args, env=standin_env(CUDA_VISIBLE_DEVICES="0,1"))
    assert two.returncode == 0, two.stderr
    assert two.stdout.startswith("<|im_start|>user hello")
    one = run_lmpress(*args, env=standin_env(CUDA_VISIBLE_DEVICES="0"))
    assert one.returncode == 2
    assert "World size (2) is larger than the number of available GPUs (1)" in one.stderr


def test_startup_failure_says_what_vllm_said(standin, model_dir, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    with pytest.raises(ModelLoadError) as err:
        make_engine(model_dir, **{"model.model_kwargs": {"tensor_parallel_size": 2}})
    assert str(err.value) == (
        f"vLLM could not start model '{model_dir}': World size (2) is larger than the number of "
        f"available GPUs (1) in this node."
    )


def test_data_parallel_runs_as_one_asyncllm_that_answers(standin, model_dir, monkeypatch):
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import ENGINES

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    started = len(ENGINES)
    kwargs = {"data_parallel_size": 2, "tensor_parallel_size": 2}
    engine = make_engine(model_dir, **{"model.model_kwargs": kwargs})
    try:
        result = asyncio.run(engine.complete(chat("hello there")))
    finally:
        close(engine)
    # One AsyncLLM with the data-parallel size in its arguments: vLLM starts the copies itself.
    assert len(ENGINES) == started + 1
    args = vllm_side().engine_args
    assert isinstance(args, AsyncEngineArgs)
    assert (args.data_parallel_size, args.tensor_parallel_size) == (2, 2)
    assert result.text == "<|im_start|>user hello there<|im_end|> <|im_start|>assistant"
    assert engine.max_in_flight == 2 * 256 * 2  # twice max_num_seqs for each copy


def test_more_gpus_than_visible_is_refused_before_vllm_starts(standin, model_dir, monkeypatch):
    from vllm.v1.engine.async_llm import ENGINES

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2")
    started = len(ENGINES)
    kwargs = {"data_parallel_size": 2, "tensor_parallel_size": 2}
    with pytest.raises(ConfigError) as err:
        make_engine(model_dir, **{"model.model_kwargs": kwargs})
    assert str(err.value) == (
        "model.model_kwargs.data_parallel_size: 2 copies of the model need 4 GPUs (data x "
        "tensor x pipeline parallel size), but 3 are visible (CUDA_VISIBLE_DEVICES: 0,1,2)"
    )
    assert len(ENGINES) == started
