"""Every shell and Python example in README.md and docs/, run as written (issues 48 and 51).

Each fenced `sh`, `bash`, `console` or `python` block is one case, README's first, then each
page's in the order of mkdocs.yml's nav; its commands run in order in a folder of their own
that holds `examples/` (the input files the examples name), with `lmpress` on the PATH. A
`console` block's `$ ` lines are the commands, its `> ` lines what is typed into them, and its
other lines what they print: after a `<!-- check-output -->` line that output must be exactly
what the commands print, stdout and stderr together (`<!-- check-output stdout -->`: stdout
alone, for a reply whose stderr carries timings; `exit=N` after either: a command that fails
on purpose). `lmpress serve` starts in the background on a free 127.0.0.1 port
(the docs' 8000 is rewritten) and serves the blocks after it in the same file, up to the next
`lmpress serve`. A command that cannot run here (a provider's key, another machine, a
placeholder path) is skipped by a rule below that names why; a rule no command matches fails,
so the list cannot rot. A block whose commands an earlier block already ran (README's tour
repeats a page's example) runs once. Real weights (SmolLM2, MiniLM) answer where the docs show
a reply.

The two generated pages (docs/reference/config.md from the schema, docs/reference/cli.md from
the commands' `--help`) must be what docs/generate.py writes today.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from lmpress.builtin_models.tiny import cache_root
from tests import doc_shim, forked_cli
from tests.conftest import REPO

FENCE = re.compile(r"^( *)```(\w*)\s*$")
CHECK_OUTPUT = re.compile(r"^<!-- check-output(?: (stdout))?(?: exit=(\d+))? -->$")
RUN_LANGS = {"sh", "bash", "console", "python"}
DOCS_PORT = "8000"


def doc_files() -> list[Path]:
    """README.md, then every page of the site in mkdocs.yml's nav order."""

    def pages(entry) -> list[str]:
        if isinstance(entry, str):
            return [entry]
        if isinstance(entry, list):
            return [page for item in entry for page in pages(item)]
        return [page for value in entry.values() for page in pages(value)]

    nav = yaml.safe_load((REPO / "mkdocs.yml").read_text())["nav"]
    return [REPO / "README.md", *(REPO / "docs" / page for page in pages(nav))]


# (a piece of the command, why it does not run in the tests). Each must match some command.
SKIPPED = [
    ("make demo", "its batch command is the caching page's first example, which runs"),
    (
        "lmpress view",
        "serves a page until stopped; tests/view/test_browser.py opens it in Chromium",
    ),
    ("make test", "the test suite itself"),
    ("make install-vllm", "builds vLLM's own venv (make test-vllm runs vLLM)"),
    (".venv-vllm/", "needs vLLM's venv (make test-vllm)"),
    ("vllm-qwen2.5-7b-tp2", "needs two GPUs"),
    ("pip install", "installs packages"),
    ("cd examples/pipelines && lmpress", "tests/pipeline/test_examples.py runs it"),
    ("HuggingFaceTB/SmolLM2-135M-Instruct", "downloads from the hub; no network in tests"),
    ("--ray", "starts Ray (tests/batch/cluster run --ray)"),
    ("--engine OPENAI", "needs an OpenAI key"),
    ("OPENAI_API_KEY", "needs an OpenAI key"),
    ("--provider-batch", "needs a provider's batch API"),
    ("MY_SERVER_KEY", "a remote server of the reader's own"),
    ("--engine REMOTE", "a remote server of the reader's own"),
    ("my-recipe", "a placeholder recipe"),
    ("cat.png", "a placeholder image"),
    ("model.gguf", "placeholder model files"),
    ("qwen2.5-0.5b-instruct-q8_0.gguf", "a GGUF file of the reader's own"),
    ("path/to/small-model", "a placeholder model"),
    ("FILE_ID", "a placeholder id from an earlier answer"),
    ("BATCH_ID", "a placeholder id from an earlier answer"),
    ("$KEY", "a placeholder key"),
    ('model="think"', "a fragment of a client call (the serve examples run whole clients)"),
    (
        "tests/eval_tasks",
        "a checkout's test tasks, run by tests/integrations/test_lm_eval.py, "
        "which checks each side against lm-eval's hf backend",
    ),
    (
        "--serve.served_model_name smollm2",
        "serves the lm-eval commands after it, which tests/integrations/test_lm_eval.py runs",
    ),
    # The reasoning page's block: tests/cli/test_reasoning_cli.py runs its three commands.
    (
        "tiny:think",
        "tests/cli/test_reasoning_cli.py runs the reasoning page's command as written and "
        "checks that the line it writes is the one the page shows",
    ),
    ("> q.jsonl", "the reasoning page's row, which tests/cli/test_reasoning_cli.py writes"),
    ("cat out.jsonl", "the reasoning page's line, which tests/cli/test_reasoning_cli.py reads"),
]


@dataclass
class Command:
    text: str
    stdin: str = ""


@dataclass
class Block:
    path: Path
    line: int
    lang: str
    body: str
    check_exit: int | None = None  # after <!-- check-output -->: the exit code it must have
    check_stdout_only: bool = False  # <!-- check-output stdout -->: stderr is not shown
    shown: str = ""  # a checked console block's output, as the page shows it
    commands: list[Command] = field(default_factory=list)

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"


def doc_blocks() -> list[Block]:
    return [block for path in doc_files() for block in file_blocks(path)]


def file_blocks(path: Path) -> list[Block]:
    blocks, current, indent, before = [], None, 0, ""
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        fence = FENCE.match(line)
        if fence and current is None:
            current, indent = Block(path, number, fence.group(2), ""), len(fence.group(1))
            check = CHECK_OUTPUT.match(before)
            if check:
                current.check_exit = int(check.group(2) or 0)
                current.check_stdout_only = check.group(1) is not None
        elif fence and current is not None:
            if current.lang in RUN_LANGS:
                blocks.append(current)
            current = None
        elif current is not None:
            current.body += line[indent:] + "\n"
        if line.strip():
            before = line.strip()
    for block in blocks:
        block.commands = _commands(block)
        if block.check_exit is not None:
            assert block.lang == "console", f"{block.id}: check-output is for console blocks"
            block.shown = "".join(
                line + "\n" for line in block.body.splitlines() if not line.startswith(("$ ", "> "))
            )
    return blocks


def _commands(block: Block) -> list[Command]:
    if block.lang == "python":
        return [Command(block.body)]
    if block.lang == "console":
        commands: list[Command] = []
        for line in block.body.splitlines():
            if line.startswith("$ "):
                commands.append(Command(line[2:]))
            elif line.startswith("> ") and commands:
                commands[-1].stdin += line[2:] + "\n"
        return commands
    return [Command(text) for text in _shell_commands(block.body)]


def _shell_commands(body: str) -> list[str]:
    """Whole commands: a line ending in a backslash, or a quote left open, goes on."""
    commands, pending = [], ""
    for line in body.splitlines():
        pending += line + "\n"
        try:
            words = shlex.split(pending, comments=True)
        except ValueError:  # a quoted argument that spans lines
            continue
        if pending.rstrip().endswith("\\"):
            continue
        if words:
            commands.append(pending.strip())
        pending = ""
    return commands


def skip_reason(command: Command) -> str | None:
    return next((why for piece, why in SKIPPED if piece in command.text), None)


def _is_serve(command: Command) -> bool:
    return re.search(r"(^|\s)lmpress serve\s", command.text) is not None


def _serve_command(block: Block) -> Command | None:
    """The `lmpress serve` that the block's clients talk to: the block's own, else the last
    one before it in the same file."""
    before = [b for b in BLOCKS if b.path == block.path and b.line <= block.line]
    for earlier in reversed(before):
        serves = [c for c in earlier.commands if _is_serve(c)]
        if serves:
            return serves[-1]
    return None


def _what_runs(block: Block) -> tuple:
    """What running the block does: its commands (with what is typed into them), the server
    they talk to, and what a checked block must print."""
    serve = _serve_command(block)
    commands = tuple((c.text, c.stdin) for c in block.commands if skip_reason(c) is None)
    checked = block.check_exit, block.check_stdout_only, block.shown
    return block.lang, commands, serve.text if serve else None, checked


def _first_runs(blocks: list[Block]) -> tuple[list[Block], dict[str, str]]:
    """The blocks with a command to run, each once: a block that runs what an earlier block
    ran is left out, with the earlier one's id."""
    runnable, seen, repeats = [], {}, {}
    for block in blocks:
        if all(skip_reason(c) is not None for c in block.commands):
            continue
        key = _what_runs(block)
        if key in seen and not any(_is_serve(c) for c in block.commands):
            repeats[block.id] = seen[key]
            continue
        seen.setdefault(key, block.id)
        runnable.append(block)
    return runnable, repeats


BLOCKS = doc_blocks()
RUNNABLE, REPEATS = _first_runs(BLOCKS)


def test_every_skip_rule_matches_an_example():
    texts = [c.text for b in BLOCKS for c in b.commands]
    unused = [piece for piece, _ in SKIPPED if not any(piece in t for t in texts)]
    assert not unused, f"skip rules that match no command in README.md or docs/: {unused}"
    assert len(RUNNABLE) >= 20  # the extraction found the examples
    assert {b.path.name for b in RUNNABLE} >= {"README.md", "index.md", "python.md"}


def test_the_generated_pages_are_what_the_code_writes():
    """docs/reference/config.md (every config key, and each engine's settings) and
    docs/reference/cli.md (every command's --help) are written by docs/generate.py; a changed
    field, comment or help text fails here until the script is run again."""
    spec = importlib.util.spec_from_file_location("docs_generate", REPO / "docs" / "generate.py")
    generate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generate)
    stale = [str(path.relative_to(REPO)) for path in generate.stale()]
    assert stale == [], f"{stale} differ from the code: run python docs/generate.py"


class Server:
    """The docs' `lmpress serve` commands, each on a free port of its own, started when a block
    first needs it and kept while a later block does: README's serve example is the serve
    page's, and the many-models page's server runs between them, so one server answers both."""

    def __init__(self) -> None:
        self.running: dict[str, tuple[subprocess.Popen, str]] = {}  # by command: process, port

    def ensure(self, command: Command, env: dict[str, str], cwd: Path) -> str:
        process, port = self.running.get(command.text, (None, ""))
        if process is not None and process.poll() is None:
            return port
        port = str(_free_port())
        log = (cwd / "serve.log").open("w")
        process = subprocess.Popen(
            ["bash", "-c", _on_port(command.text, port)],
            env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        self.running[command.text] = process, port
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            assert process.poll() is None, (cwd / "serve.log").read_text()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                    return port
            except OSError:
                time.sleep(0.3)
        raise AssertionError(f"{command.text} did not answer /health in 180 s")

    def keep(self, commands: set[str]) -> None:
        """Stop the servers of every other command."""
        for text in [text for text in self.running if text not in commands]:
            process, _ = self.running.pop(text)
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()


@pytest.fixture(scope="module")
def server():
    running = Server()
    yield running
    running.keep(set())


def _serves_from(block: Block) -> set[str]:
    """The serve commands that this block and the ones after it talk to."""
    later = RUNNABLE[RUNNABLE.index(block) :]
    return {serve.text for b in later if (serve := _serve_command(b)) is not None}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _on_port(text: str, port: str) -> str:
    text = text.replace(f"127.0.0.1:{DOCS_PORT}", f"127.0.0.1:{port}")
    return re.sub(rf"--port {DOCS_PORT}\b", f"--port {port}", text)


def _env(home: Path, shim_dir: Path) -> dict[str, str]:
    """lmpress on the PATH, this checkout first; HOME a scratch folder (`~/lmpress-state`),
    the model caches where they are (and OMP_WAIT_POLICY as tests/conftest.py sets it).
    Where this process has a warm interpreter, the `lmpress` found first is tests/doc_shim.py,
    which runs each command forked from it rather than importing torch afresh."""
    first = [Path(sys.executable).parent]
    warm = forked_cli.zygote()
    if warm is not None:
        doc_shim.write_shim(shim_dir, warm)
        first.insert(0, shim_dir)
    return {
        **os.environ,
        "PATH": os.pathsep.join([*map(str, first), os.environ.get("PATH", "")]),
        "PYTHONPATH": str(REPO),
        "HOME": str(home),
        "LMPRESS_CACHE": str(cache_root()),
        "HF_HOME": os.environ.get("HF_HOME", str(Path.home() / ".cache" / "huggingface")),
    }


@pytest.mark.slow
@pytest.mark.parametrize("block", RUNNABLE, ids=lambda b: b.id)
def test_doc_example_runs_as_written(block: Block, tmp_path, tmp_path_factory, server):
    (tmp_path / "examples").symlink_to(REPO / "examples")
    env = _env(tmp_path, tmp_path_factory.getbasetemp() / "doc-shim")
    server.keep(_serves_from(block))  # no more than two servers up at once (a smollm2 is 0.6 GB)
    serve = _serve_command(block)
    printed = ""
    for command in block.commands:
        if skip_reason(command) is not None:
            continue
        if _is_serve(command):
            server.ensure(command, env, tmp_path)
            continue
        port = DOCS_PORT
        if DOCS_PORT in command.text and serve is not None:
            port = server.ensure(serve, env, tmp_path)
        text = _on_port(command.text, port)
        argv = [sys.executable, "-c", text] if block.lang == "python" else ["bash", "-c", text]
        run = subprocess.run(
            argv, input=command.stdin, capture_output=True, text=True, env=env, cwd=tmp_path,
            timeout=300,
        )  # fmt: skip
        shown = f"{block.id}: {command.text}\n--- stdout\n{run.stdout}\n--- stderr\n{run.stderr}"
        assert run.returncode == (block.check_exit or 0), shown
        assert "Traceback" not in run.stderr, shown
        printed += run.stdout if block.check_stdout_only else run.stdout + run.stderr
        if re.search(r"lmpress (infer|chat)|^curl|print\(", text):  # a reply a person reads
            assert run.stdout.strip(), shown
        if text.startswith("curl"):  # curl -s exits 0 on an HTTP error too
            assert not re.search(r'"error": ?\{', run.stdout), shown
    if block.check_exit is not None:
        assert printed == block.shown, f"{block.id} shows other output than its commands print"
