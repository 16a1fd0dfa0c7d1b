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


@pytest.fixture(scope="session")
def echo_plugin(tmp_path_factory) -> str:
    """A directory to put on PYTHONPATH that installs the ECHO test engine the way a real
    plugin does: a package plus dist-info declaring an `lmpress.engines` entry point."""
    root = tmp_path_factory.mktemp("echo-plugin")
    dist = root / "lmpress_echo-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: lmpress-echo\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[lmpress.engines]\nECHO = lmpress_echo:EchoEngine\n")
    return f"{REPO / 'tests' / 'plugins'}{os.pathsep}{root}"


def with_plugin(plugin_path: str) -> dict[str, str]:
    """Environment for a subprocess that sees this checkout and the ECHO plugin."""
    return {"PYTHONPATH": f"{REPO}{os.pathsep}{plugin_path}"}
