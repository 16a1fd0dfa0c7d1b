"""Contract tests of VLLM through the real `lmpress` command: what a user sees without vLLM
and with the vLLM stand-in (tests/engines/local/vllm_standin) in place of vLLM.

They prove lmpress's side (messages, exit codes, the recipe, the CLI paths), not vLLM:
tests/engines/local/vllm_real/ runs the fronts on vLLM's CPU build. What needs GPUs (no GPU,
the two-GPU recipe) is in test_gpu_contract.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.util import find_spec

import pytest

from lmpress.configs import load_config
from lmpress.engines.local.vllm.translate import engine_settings
from tests.conftest import REPO, run_lmpress
from tests.engines.local.vllm.contract_support import (
    model_dir,
    standin,
    standin_env,
)

__all__ = ["model_dir", "standin"]  # fixtures

RECIPE = "vllm-qwen2.5-7b-tp2"
without_vllm = pytest.mark.skipif(find_spec("vllm") is not None, reason="vllm is installed here")


def vllm_block(engines_output: str) -> str:
    return engines_output.split("\nVLLM", 1)[1].split("\n\n", 1)[0]


@without_vllm
def test_without_vllm_engines_says_how_to_install():
    run = run_lmpress("engines")
    assert run.returncode == 0
    assert "not usable: needs vllm: pip install 'lmpress[vllm]'" in vllm_block(run.stdout)


@without_vllm
def test_without_vllm_infer_fails_with_one_line(model_dir):
    run = run_lmpress("infer", "--engine", "VLLM", "--model.model_name", model_dir, "hi")
    assert run.returncode == 2
    assert run.stderr == (
        "lmpress: error: engine VLLM needs vllm, which is not installed: "
        "pip install 'lmpress[vllm]'\n"
    )


def test_too_old_a_vllm_is_refused(model_dir):
    env = standin_env(VLLM_STANDIN_VERSION="0.10.1")
    run = run_lmpress("infer", "--engine", "VLLM", "--model.model_name", model_dir, "hi", env=env)
    assert run.returncode == 2
    assert "needs vllm>=0.12, found 0.10.1: pip install -U 'lmpress[vllm]'" in run.stderr


def test_with_vllm_and_a_gpu_the_engine_is_listed_usable():
    run = run_lmpress("engines", env=standin_env())
    block = vllm_block(run.stdout)
    assert "usable" in block and "not usable" not in block
    assert "guided_decoding" in block and "logit_bias" in block


def test_infer_prints_only_the_reply_on_stdout(model_dir):
    run = run_lmpress(
        "infer", "--engine", "VLLM", "--model.model_name", model_dir, "why", "is", "it",
        env=standin_env(),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    # vLLM's own log lines go to lmpress's vLLM log file while it starts (to stderr with
    # --debug), so stdout is the reply and nothing else.
    assert run.stdout == "<|im_start|>user why is it<|im_end|> <|im_start|>assistant\n"
    assert "Initializing an engine" not in run.stderr
    debug = run_lmpress(
        "--debug", "infer", "--engine", "VLLM", "--model.model_name", model_dir, "why",
        env=standin_env(),
    )  # fmt: skip
    assert debug.stdout == "<|im_start|>user why<|im_end|> <|im_start|>assistant\n"
    assert "Initializing an engine" in debug.stderr


def test_batch_writes_rows_and_reports_the_row_vllm_refused(model_dir, tmp_path):
    rows = [{"id": "a", "prompt": "first row"}, {"id": "b", "prompt": " ".join(["x"] * 80)},
            {"id": "c", "messages": [{"role": "user", "content": "third"}],
             "generation": {"max_new_tokens": 2}}]  # fmt: skip
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out.jsonl"
    run = run_lmpress(
        "batch", "--engine", "VLLM", "--model.model_name", model_dir,
        "-i", str(source), "-o", str(out), env=standin_env(),
    )  # fmt: skip
    assert run.returncode == 1, run.stderr
    written = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert set(written) == {"a", "c"}
    assert (
        written["a"]["response"]["text"]
        == "<|im_start|>user first row<|im_end|> <|im_start|>assistant"
    )
    assert written["c"]["response"]["finish_reason"] == "length"
    assert written["c"]["response"]["engine"] == "VLLM"
    failed = [
        json.loads(line) for line in (tmp_path / "out.jsonl.errors.jsonl").read_text().splitlines()
    ]
    assert [(f["id"], f["error"]["kind"]) for f in failed] == [("b", "context_length_exceeded")]


def test_help_imports_no_vllm_even_when_it_is_installed():
    code = (
        "import sys\nfrom lmpress.cli.app import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print('LOADED', sorted(m for m in sys.modules if m == 'vllm' or m.startswith('lmpress.engines.local.vllm')))\n"
    )
    env = {**os.environ, **standin_env()}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert "LOADED []" in out.stdout, out.stderr


# --- the bundled recipe --------------------------------------------------------------------------


def test_recipe_is_listed_and_loads():
    listed = run_lmpress("recipes")
    assert RECIPE in listed.stdout
    config = load_config(RECIPE)
    assert config.engine == "VLLM"
    settings = engine_settings(config)
    assert settings.args["tensor_parallel_size"] == 2
    assert settings.args["gpu_memory_utilization"] == 0.9
    assert settings.args["max_model_len"] == 8192
    assert settings.gpus == 2 and settings.data_parallel_size == 1


def test_recipe_uses_only_real_engine_arguments(standin):
    from vllm.engine.arg_utils import AsyncEngineArgs

    names = {f for f in AsyncEngineArgs.__dataclass_fields__}
    kwargs = load_config(RECIPE).model.model_kwargs
    assert set(kwargs) <= names, set(kwargs) - names


# --- benchmarks/vllm_check.py ------------------------------------------------------------------


def run_check(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    script = str(REPO / "benchmarks" / "vllm_check.py")
    return subprocess.run(
        [sys.executable, script, *args], capture_output=True, text=True,
        env={**os.environ, **(env or {})}, timeout=300,
    )  # fmt: skip


@without_vllm
def test_vllm_check_refuses_to_run_without_vllm(model_dir):
    run = run_check(model_dir)
    assert run.returncode == 2
    assert run.stderr == (
        "vllm_check: cannot run here: vllm is not installed here: pip install 'lmpress[vllm]' "
        "(vLLM needs Linux and a GPU)\n"
    )


def test_vllm_check_plumbing_runs_end_to_end_on_the_standin(model_dir):
    # Only the script's plumbing: the stand-in's numbers mean nothing about vLLM.
    run = run_check(model_dir, "--rows", "20", "--max-new-tokens", "4", env=standin_env())
    assert run.returncode == 0, run.stderr
    assert "lmpress / raw vLLM, output tokens per second:" in run.stdout
    assert "identical replies (greedy): 20 of 20" in run.stdout


def test_oumi_model_fields_reach_vllm():
    config = load_config(
        overrides={
            "engine": "VLLM",
            "model.model_name": "some/model",
            "model.processor_kwargs": "{num_crops: 4}",
            "model.load_pretrained_weights": "false",
            "model.model_max_length": "1024",
        }
    )
    args = engine_settings(config).args
    assert args["mm_processor_kwargs"] == {"num_crops": 4}
    assert args["load_format"] == "dummy"
    assert args["max_model_len"] == 1024


@pytest.mark.parametrize("engine", ["NATIVE", "VLLM"])
def test_config_show_says_which_dtype_auto_means_here(engine):
    import torch

    cuda = torch.cuda.is_available()
    expected = ("bfloat16" if torch.cuda.is_bf16_supported() else "float16") if cuda else "float32"
    run = run_lmpress("config", "show", "--engine", engine)
    assert run.returncode == 0, run.stderr
    line = f"# {engine} loads the model in {expected} here (model.torch_dtype_str: auto)"
    assert run.stdout.splitlines()[-1] == line
    pinned = run_lmpress("config", "show", "--engine", engine, "--model.torch_dtype_str", "bf16")
    assert pinned.stdout.splitlines()[-1].startswith(f"# {engine} loads the model in bfloat16")
