"""LLAMACPP against llama.cpp's own llama-server with parallel slots, in one run.

A user after throughput from llama.cpp runs `llama-server -np N` and sends N requests at once;
this measures lmpress's LLAMACPP engine (`engine.generate`, batch_size N) against exactly that.
llama-server is built once from the llama.cpp source that the installed llama-cpp-python
vendors (its sdist, fetched with pip), by a plain CMake build, and cached under lmpress's cache
(`~/.cache/lmpress/llama-server/VERSION/`, or $LMPRESS_CACHE): about 6 minutes on two cores.
If it cannot be built (no cmake or compiler, no sdist), the script says so and stops.

Both sides load the same GGUF with the same threads, flash attention and context, shared by the
N sequences on both (llama-server's `-c` is lmpress's n_ctx, with `--kv-unified`, the cache
lmpress makes), decode
greedily, and answer the same chat prompts, each in a user message: `mixed_prompts` with EOS
held off (llama-server: `ignore_eos`; lmpress: min_tokens), or `chat_prompts` with `--eos`.
Every round uses prompts of its own (the same on both sides), so neither side answers a round
from the prefix cache the round before left. The server gets all requests at once from a thread
per request over keep-alive HTTP; lmpress runs in a process of its own (rounds.SideProcess).
Each side counts the tokens it generated, an end token included. Rounds alternate between the
sides; both ratios of benchmarks/rounds.py are printed. CPU time: the server process's own and,
for lmpress, its process's.

Where lmpress loads weights without llama.cpp's extra buffer types (the AMX crash avoidance,
lmpress.engines.local.llamacpp.loading.extra_bufts_are_safe), llama-server gets `--no-repack`,
which does the same.

    .venv/bin/python benchmarks/llamacpp_vs_server.py [--model tiny-gguf:bench-100m]
        [--prompts 32] [--new-tokens 64] [--batch-size 32] [--rounds 2] [--threads N]
        [--n-ctx 4096] [--eos] [--copy] [--draft-model GGUF] [--draft-tokens 4] [--ngram]
        [--server-arg ARG ...]
    # real weights, EOS honoured:
    .venv/bin/python benchmarks/llamacpp_vs_server.py --model smollm2:135m-instruct-q4_1 \\
        --prompts 64 --new-tokens 128 --eos
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from llamacpp_throughput import describe, lmpress_config
from rounds import (
    Rounds,
    SideProcess,
    chat_prompts,
    copy_prompts,
    lmpress_generate,
    mixed_prompts,
)

from lmpress.builtin_models.tiny import cache_root
from lmpress.engines.local.llamacpp.loading import (
    extra_bufts_are_safe,
    gguf_path,
    planned_context,
)
from lmpress.engines.registry import create_engine

SERVER_TARGETS = ("llama-server", "llama-batched-bench")


class BuildError(Exception):
    """llama-server could not be built here; the message says why."""


def server_binary() -> Path:
    """llama-server built from the vendored llama.cpp of the installed llama-cpp-python,
    built on first use and cached."""
    import llama_cpp

    root = cache_root() / "llama-server" / llama_cpp.__version__
    binary = root / "build" / "bin" / "llama-server"
    if binary.exists():
        return binary
    for tool in ("cmake", "c++"):
        if shutil.which(tool) is None:
            raise BuildError(f"{tool} is not installed (apt-get install cmake g++)")
    root.mkdir(parents=True, exist_ok=True)
    source = root / "src"
    if not (source / "CMakeLists.txt").exists():
        unpack_vendored_source(llama_cpp.__version__, source)
    log = root / "build.log"
    print(f"building llama-server in {root} (about 6 minutes on 2 cores; log: {log})", flush=True)
    steps = [
        ["cmake", "-S", str(source), "-B", str(root / "build"), "-DLLAMA_CURL=OFF",
         "-DLLAMA_OPENSSL=OFF"],
        ["cmake", "--build", str(root / "build"), "-j2", "--target", *SERVER_TARGETS],
    ]  # fmt: skip
    with log.open("w") as out:
        for step in steps:
            if subprocess.run(step, stdout=out, stderr=subprocess.STDOUT).returncode != 0:
                raise BuildError(f"`{' '.join(step)}` failed; see {log}")
    return binary


def unpack_vendored_source(version: str, target: Path) -> None:
    """llama.cpp as llama-cpp-python `version` vendors it, from its sdist."""
    with tempfile.TemporaryDirectory() as scratch:
        fetch = [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
                 "-q", "-d", scratch, f"llama-cpp-python=={version}"]  # fmt: skip
        if subprocess.run(fetch).returncode != 0:
            raise BuildError(f"pip could not fetch the llama-cpp-python {version} sdist")
        [sdist] = Path(scratch).glob("*.tar.gz")
        prefix = f"{sdist.name.removesuffix('.tar.gz')}/vendor/llama.cpp/"
        with tarfile.open(sdist) as tar:
            members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
            for member in members:
                member.name = member.name[len(prefix) :]
            tar.extractall(target, members=[m for m in members if m.name], filter="data")


class ServerSide:
    """llama-server in a process of its own, sent every prompt of a round at once; the same
    interface as rounds.SideProcess."""

    name = "llama-server"

    def __init__(self, binary: Path, path: str, args, n_ctx: int, prompt_sets, warm_up):
        self.port = free_port()
        command = [
            str(binary), "-m", path, "--host", "127.0.0.1", "--port", str(self.port),
            "-np", str(args.batch_size), "-c", str(n_ctx), "--kv-unified",
            "-t", str(args.threads), "-tb", str(args.threads), "-fa", args.flash_attn,
            "--no-webui", *args.server_arg,
        ]  # fmt: skip
        if args.draft_model:
            # -md alone loads the draft model but drafts nothing: the type must be named.
            command += ["-md", args.draft_model, "--spec-type", "draft-simple",
                        "--spec-draft-n-max", str(args.draft_tokens)]  # fmt: skip
        if not extra_bufts_are_safe(system_info()):
            command.append("--no-repack")  # lmpress's AMX crash avoidance, on the server too
        self.log = Path(tempfile.gettempdir()) / f"llama-server-{self.port}.log"
        with self.log.open("w") as log:  # the server keeps its own copy of the file
            self.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent
            )
        self.eos, self.new_tokens = args.eos, args.new_tokens
        self.prompt_sets = iter(prompt_sets)
        try:
            self._wait_ready()
            self._send(warm_up)
        except BaseException:
            self.close()
            raise
        print(f"{self.name} ready: {' '.join(command[1:])}", flush=True)

    def run(self) -> tuple[int, float, float]:
        prompts = next(self.prompt_sets)
        started, cpu_started = time.perf_counter(), self._cpu_s()
        tokens = self._send(prompts)
        return tokens, time.perf_counter() - started, self._cpu_s() - cpu_started

    def close(self) -> None:
        self.process.terminate()
        self.process.wait()
        self.log.unlink(missing_ok=True)

    def _send(self, prompts: list[str]) -> int:
        with ThreadPoolExecutor(len(prompts)) as pool:
            return sum(pool.map(self._complete, prompts))

    def _complete(self, prompt: str) -> int:
        body = {
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": self.new_tokens,
            "temperature": 0.0,
            "ignore_eos": not self.eos,
        }
        reply = self._post("/v1/chat/completions", body)
        # Its count leaves out the end token it sampled; lmpress's counts it.
        return reply["usage"]["completion_tokens"] + (
            reply["choices"][0]["finish_reason"] == "stop"
        )

    def _post(self, route: str, body: dict) -> dict:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        try:
            connection.request(
                "POST", route, json.dumps(body), {"Content-Type": "application/json"}
            )
            response = connection.getresponse()
            data = json.loads(response.read())
        finally:
            connection.close()
        if response.status != 200:
            raise RuntimeError(f"llama-server answered {response.status}: {data}")
        return data

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"llama-server exited:\n{self.log.read_text()[-3000:]}")
            try:
                connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                connection.request("GET", "/health")
                if connection.getresponse().status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError("llama-server did not answer /health within 120 s")

    def _cpu_s(self) -> float:
        """CPU seconds the server process has used so far (user and system, all threads)."""
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def die_with_parent() -> None:
    """In the server's process before it starts: end it when this script ends, however."""
    import ctypes
    import signal

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def system_info() -> str:
    from llama_cpp import llama_print_system_info

    return llama_print_system_info().decode()


def build_lmpress(config, prompt_sets, warm_up, new_tokens: int, eos: bool):
    """lmpress's side, in its own process: load, warm up, return the timed work (each call
    the next round's prompts)."""
    engine = create_engine(config)
    lmpress_generate(engine, warm_up, 2)
    sets = iter(prompt_sets)
    return lambda: lmpress_generate(engine, next(sets), new_tokens, eos)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-gguf:bench-100m")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=32, help="and llama-server's -np")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--n-ctx", type=int, default=4096, help="lmpress's model_kwargs.n_ctx")
    parser.add_argument("--flash-attn", choices=["on", "off"], default="on")
    parser.add_argument(
        "--eos", action="store_true", help="honour EOS, with chat prompts for a real model"
    )
    parser.add_argument(
        "--copy", action="store_true", help="copy-heavy prompts (rounds.copy_prompts), EOS honoured"
    )
    parser.add_argument(
        "--draft-model", help="both sides draft with this GGUF: llama-server's -md, lmpress's "
        "model.draft_model"
    )  # fmt: skip
    parser.add_argument(
        "--draft-tokens", type=int, default=4, help="drafted tokens a step, at most"
    )
    parser.add_argument(
        "--ngram", action="store_true", help="lmpress drafts by prompt lookup (speculative_method)"
    )
    parser.add_argument(
        "--server-arg", action="append", default=[],
        help="one more llama-server argument (repeat it), e.g. a speculation mode of its own",
    )  # fmt: skip
    args = parser.parse_args()
    args.eos = args.eos or args.copy

    try:
        binary = server_binary()
    except BuildError as exc:
        sys.exit(f"llama-server cannot be built here: {exc}")
    path = gguf_path(args.model)
    kwargs = {
        "n_ctx": args.n_ctx,
        "n_threads": args.threads,
        "n_threads_batch": args.threads,
        "flash_attn": args.flash_attn == "on",
        "kv_unified": True,  # the server's --kv-unified
    }
    config = lmpress_config(path, kwargs, args.batch_size)
    if args.draft_model:
        config.model.draft_model = args.draft_model
    if args.draft_model or args.ngram:
        config.model.num_speculative_tokens = args.draft_tokens
    if args.ngram:
        config.model.speculative_method = "ngram"
    n_ctx = planned_context(args.n_ctx, None)
    make_prompts = chat_prompts if args.eos else lambda n, seed: mixed_prompts(n, 40, seed)
    if args.copy:
        make_prompts = copy_prompts
    prompt_sets = [make_prompts(args.prompts, seed=r) for r in range(args.rounds)]
    warm_up = make_prompts(args.batch_size, seed=1000)
    server = ServerSide(binary, path, args, n_ctx, prompt_sets, warm_up)
    try:
        ours = SideProcess(
            "lmpress", build_lmpress, config, prompt_sets, warm_up, args.new_tokens, args.eos
        )
    except BaseException:
        server.close()
        raise
    sides = [server, ours]
    rounds = Rounds()
    try:
        for round_no in range(1, args.rounds + 1):
            for side in sides if round_no % 2 else sides[::-1]:
                rounds.run_side(round_no, side)
    finally:
        for side in sides:
            side.close()
    print(
        f"\nmodel {args.model} ({describe(path)}), {args.prompts} prompts a round, "
        f"{'at most ' if args.eos else ''}{args.new_tokens} new tokens each (EOS "
        f"{'honoured' if args.eos else 'held off'}), {args.batch_size} sequences sharing "
        f"{n_ctx} tokens, {args.threads} threads, flash_attn {args.flash_attn}"
    )
    print(f"llama-server -np {args.batch_size}: {rounds.best('llama-server'):.1f} tok/s")
    print(f"lmpress LLAMACPP:        {rounds.best('lmpress'):.1f} tok/s")
    if args.draft_model or args.ngram or args.server_arg:
        print(f"llama-server arguments beyond the defaults: {args.server_arg}; "
              f"draft model {args.draft_model}; lmpress prompt lookup {args.ngram}")  # fmt: skip
    rounds.report("lmpress", "llama-server")


if __name__ == "__main__":
    main()
