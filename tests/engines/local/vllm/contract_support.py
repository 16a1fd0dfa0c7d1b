"""Shared pieces of the VLLM contract tests: the vLLM stand-in on the import path, and a model
directory it can "load". The stand-in proves lmpress's adapter, not vLLM (see
tests/engines/local/vllm_standin/README.md)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from lmpress.vocabulary.chat_templates import CHATML_TEMPLATE
from tests.conftest import REPO

STANDIN = Path(__file__).resolve().parent.parent / "vllm_standin"
STANDIN_VARS = (
    "VLLM_STANDIN_TOKEN_DELAY_S",
    "VLLM_STANDIN_DIE_AFTER",
    "VLLM_STANDIN_NO_GPU",
    "VLLM_STANDIN_VERSION",
    "VLLM_STANDIN_LOG",
    "CUDA_VISIBLE_DEVICES",
)


def write_model_dir(
    path: Path, *, chat_template: str | None = CHATML_TEMPLATE, context: int = 64
) -> str:
    """A model directory as the stand-in reads it: a context length and a tokenizer config."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"max_position_embeddings": context}))
    tokenizer = {"bos_token": "<s>", "eos_token": "</s>"}
    if chat_template:
        tokenizer["chat_template"] = chat_template
    (path / "tokenizer_config.json").write_text(json.dumps(tokenizer))
    return str(path)


def forget_vllm() -> None:
    for name in list(sys.modules):
        if name == "vllm" or name.startswith("vllm."):
            del sys.modules[name]


@pytest.fixture
def standin(monkeypatch):
    """`import vllm` finds the stand-in during this test, with none of its knobs set."""
    forget_vllm()
    for name in STANDIN_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.syspath_prepend(str(STANDIN))
    yield
    forget_vllm()


@pytest.fixture
def model_dir(tmp_path) -> str:
    return write_model_dir(tmp_path / "standin-model")


def standin_env(**extra: str) -> dict[str, str]:
    """Environment for a subprocess that imports the stand-in."""
    env = {name: "" for name in STANDIN_VARS if name != "CUDA_VISIBLE_DEVICES"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(STANDIN)])
    env.update(extra)
    return env


def read_log(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]
