"""The long fuzzing run of `lmpress serve` (issue 49): schemathesis generates requests from the
server's own /openapi.json, valid and malformed, for every route, and checks every answer: no
5xx, a status, content type and body the document lists, 405 with `Allow` for a method a path
does not take. The suite runs a short deterministic version (tests/serve/test_fuzz_serve.py);
this one runs schemathesis' coverage phase too (every boundary and type of every field) and
many more generated requests, against two servers:

- the tiny Llama on NATIVE (generation routes; the Files and Batch routes on), and
- the tiny cross-encoder on NATIVE with --task score (/v1/score and /v1/rerank reach it).

Run by hand, or `make fuzz`:

    python benchmarks/fuzz_serve.py                    # 100 examples an operation, seed 49
    python benchmarks/fuzz_serve.py --max-examples 300 --seed 7

It prints, per server, the requests sent, the failures found (unique) and the time taken, and
exits 1 if schemathesis found any failure (its report says which, with a curl to replay it).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LISTENING = re.compile(r"listening on (http://\S+)/v1")
CHECKS = (
    "not_a_server_error,status_code_conformance,content_type_conformance,"
    "response_schema_conformance,unsupported_method,allow_header_conformance"
)
SERVERS = {
    "tiny-llama": ["--engine", "NATIVE", "--model.model_name", "tiny:llama",
                   "--serve.served_model_name", "tiny-llama",
                   "--generation.max_new_tokens", "8"],
    "tiny-cross-encoder": ["--engine", "NATIVE", "--task", "score",
                           "--model.model_name", "tiny:cross-encoder",
                           "--serve.served_model_name", "tiny-cross-encoder"],
}  # fmt: skip


class Server:
    """`lmpress serve ARGS` on a free port of 127.0.0.1, its log kept."""

    def __init__(self, args: list[str], log: Path):
        env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        log.parent.mkdir(parents=True, exist_ok=True)
        self.log = log.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "lmpress", "serve", "--port", "0", *args],
            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env,
        )  # fmt: skip
        self.url: str | None = None
        self.ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        if not self.ready.wait(300) or self.url is None:
            self.stop()
            raise SystemExit(f"lmpress serve did not start; its log: {log}")

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.write(line)
            self.log.flush()
            found = LISTENING.search(line)
            if found and self.url is None:
                self.url = found.group(1)
                self.ready.set()
        self.ready.set()

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def fuzz(url: str, examples: int, seed: int, report: Path) -> dict:
    """One schemathesis run against `url`; its JSON report."""
    report.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable, "-m", "schemathesis.cli", "run", f"{url}/openapi.json",
        "--checks", CHECKS, "--phases", "examples,coverage,fuzzing",
        "--max-examples", str(examples), "--seed", str(seed), "--workers", "1",
        "--request-timeout", "120", "--suppress-health-check", "all", "--no-color",
        "--report", "json", "--report-dir", str(report),
    ]  # fmt: skip
    run = subprocess.run(command, capture_output=True, text=True, cwd=report)
    (report / "schemathesis.txt").write_text(run.stdout + run.stderr)
    return json.loads(next(report.glob("json-*.json")).read_text())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-examples", type=int, default=100, help="per operation and phase")
    parser.add_argument("--seed", type=int, default=49)
    parser.add_argument("--out", type=Path, default=None, help="where reports and logs go")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="lmpress-fuzz-"))
    failed = 0
    for name, server_args in SERVERS.items():
        state = out / name / "state"
        started = time.perf_counter()
        server = Server([*server_args, "--state-dir", str(state)], out / name / "server.log")
        try:
            result = fuzz(server.url or "", args.max_examples, args.seed, out / name)
        finally:
            server.stop()
        cases = result["test_cases"]
        unique = cases["unique_failures"]
        failed += unique + len(result["errors"])
        print(
            f"{name}: {cases['generated']} requests over {result['operations']['tested']} "
            f"operations, {unique} unique failures, {len(result['errors'])} errors, "
            f"{time.perf_counter() - started:.0f}s (report: {out / name})"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
