"""Shared fixtures: tiny real models built offline (cached across runs), and a way to run the
real `lmpress` command in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def tiny_llama() -> str:
    """A Llama-shaped model with a byte-level BPE tokenizer and a ChatML template."""
    from lmpress.tinymodels import tiny_model

    return str(tiny_model("llama"))


@pytest.fixture(scope="session")
def tiny_gpt2() -> str:
    """A GPT-2 model with a Unigram (SentencePiece-family) tokenizer and an [INST] template."""
    from lmpress.tinymodels import tiny_model

    return str(tiny_model("gpt2"))


@dataclass
class CliRun:
    returncode: int
    stdout: str
    stderr: str


def run_lmpress(
    *args: str,
    input: str | None = None,
    env: dict | None = None,
    cwd: str | Path | None = None,
    timeout: float = 300,
) -> CliRun:
    """Run the real CLI (`python -m lmpress ...`) with this checkout first on the path."""
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    proc = subprocess.run(
        [sys.executable, "-m", "lmpress", *args],
        input=input,
        capture_output=True,
        text=True,
        env=full_env,
        cwd=cwd,
        timeout=timeout,
    )
    return CliRun(proc.returncode, proc.stdout, proc.stderr)


@pytest.fixture
def lmpress_cli():
    return run_lmpress
