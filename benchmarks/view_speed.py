"""`lmpress view` on a million-row output (issue 56): the first open, a reopen, a filter, a
search and the overview, each timed in a process of its own, with that process's peak RSS.

The output is generated here (not by a model) in a temporary folder: `--rows` lmpress rows as
a batch job writes them (a chat conversation with its reply, a `response` record with usage,
model, latency and finish reason; one row in 50 from the response cache), and one row in 40
failed, in OUT.errors.jsonl. The steps call the viewer's own functions, as its API does
(lmpress/view/app.py is a thin layer over them):

- open:     open the source with no index yet, as `lmpress view` does: the lines found, the
            row count and the first page of rows shown (`first_page_s`); a filter on facts
            once a quarter of them are read (over those rows: `indexed_then`, `found_then`,
            the refresh that copies the facts so far included); then the facts, read behind the
            page by a process a core, until all are in and the index is written beside the
            output (OUT.view-index: `facts_done_s`, from the start), and the largest reader
            process's peak RSS (each reader is a process of its own, beside the viewer's);
- reopen:   open it again (the index read back) and read the first page of rows;
- filter:   open it, then the failed rows of one error kind, their count and first page; then
            one finish reason;
- search:   open it, then the rows holding a word that few rows hold, and one most rows hold;
- overview: open it, then the overview (counts, tokens, the five plots' data).

Targets (issue 56): the first page of a fresh output under 2 s, a filter under 1 s, every
step's process under 300 MB.

    PYTHONPATH=. python benchmarks/view_speed.py [--rows 1000000] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import orjson

REPO = Path(__file__).resolve().parent.parent
STEPS = ("open", "reopen", "filter", "search", "overview")
RARE = "zanzibar"  # in one row in 1,000
WORDS = ("river", "mountain", "engine", "token", "violet", "harbour", "lantern", "orbit")


def generate(folder: Path, rows: int) -> Path:
    """OUT.jsonl and OUT.errors.jsonl as `lmpress batch` writes them."""
    out = folder / "out.jsonl"
    kinds = ("context_length_exceeded", "invalid_row", "rate_limited")
    with open(out, "wb") as done, open(folder / "out.jsonl.errors.jsonl", "wb") as failed:
        for i in range(rows):
            if i % 40 == 39:
                error = {"kind": kinds[i % 3], "message": f"row {i} failed: {kinds[i % 3]}"}
                failed.write(orjson.dumps({"line": i + 1, "id": f"row-{i}", "error": error}))
                failed.write(b"\n")
                continue
            words = " ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(12 + i % 30))
            if i % 1000 == 0:
                words += f" {RARE}"
            prompt = f"Question {i}: tell me about the {WORDS[i % len(WORDS)]}."
            response = {
                "text": words,
                "finish_reason": "length" if i % 5 == 0 else "stop",
                "usage": {
                    "prompt_tokens": 20 + i % 37,
                    "completion_tokens": 12 + i % 30,
                    "total_tokens": 32 + i % 37 + i % 30,
                },
                "model": "tiny:llama",
                "engine": "NATIVE",
                "latency_s": round(0.05 + (i % 97) / 100, 4),
                **({"cached": True} if i % 50 == 0 else {}),
            }
            row = {
                "id": f"row-{i}",
                "messages": [
                    {"role": "user", "content": prompt},
                    {"role": "assistant", "content": words},
                ],
                "metadata": {"topic": WORDS[i % 3]},
                "response": response,
            }
            done.write(orjson.dumps(row) + b"\n")
    for stale in folder.glob("*.view-index"):  # the open step opens an output never indexed
        stale.unlink()
    summary = {"rows_total": rows, "rows_left": 0, "wall_s": rows / 400.0, "rows_per_s": 400.0}
    (folder / "out.jsonl.summary.json").write_text(json.dumps(summary))
    return out


def watch_readers(done: threading.Event, timed: dict) -> None:
    """The largest peak RSS of this process's children (the facts readers) while they run, as
    /proc has it after their exec (ru_maxrss would count the parent's pages they were forked
    with); Linux only."""
    peak = 0
    while not done.wait(0.1):
        for children in Path("/proc/self/task").glob("*/children"):
            for pid in children.read_text().split():
                try:
                    status = Path(f"/proc/{pid}/status").read_text()
                except OSError:
                    continue
                for line in status.splitlines():
                    if line.startswith("VmHWM:"):
                        peak = max(peak, int(line.split()[1]))
    timed["readers_peak_rss_mib"] = peak / 1024


def step(name: str, path: str) -> dict:
    """One step, in this process: what it took, and the process's peak RSS (the viewer's
    HTTP side imported too, as `lmpress view` holds it)."""
    import lmpress.view.app  # noqa: F401
    from lmpress.view.query import Filters, search, select
    from lmpress.view.rows import table_rows
    from lmpress.view.sources import OpenSource
    from lmpress.view.stats import overview

    timed: dict[str, float] = {}
    started = time.perf_counter()
    source = OpenSource(path)
    snapshot = source.snapshot
    timed["open_s"] = time.perf_counter() - started
    if name == "open":
        table_rows(source, snapshot, select(source, snapshot, Filters()), 0, 100)
        timed["first_page_s"] = time.perf_counter() - started
        timed["indexed_at_first_page"] = snapshot.indexed
        while snapshot.indexed < snapshot.rows // 4:  # a quarter read: a filter meanwhile
            time.sleep(0.05)
            snapshot = source.refresh(force=True)
        asked = time.perf_counter()
        snapshot = source.refresh(force=True)
        chosen = select(source, snapshot, Filters(finish_reason="length"))
        table_rows(source, snapshot, chosen, 0, 100)
        timed["filter_while_indexing_s"] = time.perf_counter() - asked
        timed["indexed_then"] = snapshot.indexed
        timed["found_then"] = len(chosen)
        watching = threading.Event()
        readers = threading.Thread(target=watch_readers, args=(watching, timed), daemon=True)
        readers.start()
        snapshot = source.wait()
        timed["facts_done_s"] = time.perf_counter() - started
        watching.set()
        readers.join()
    elif name == "reopen":
        started = time.perf_counter()
        table_rows(source, snapshot, select(source, snapshot, Filters()), 0, 100)
        timed["open_and_first_page_s"] = timed["open_s"] + time.perf_counter() - started
    elif name == "filter":
        for label, filters in (
            ("failed_of_a_kind_s", Filters(status="failed", error_kind="invalid_row")),
            ("finish_reason_s", Filters(finish_reason="length")),
        ):
            started = time.perf_counter()
            chosen = select(source, snapshot, filters)
            table_rows(source, snapshot, chosen, 0, 100)
            timed[label] = time.perf_counter() - started
            timed[label.replace("_s", "_rows")] = len(chosen)
    elif name == "search":
        for label, word in (("rare_word_s", RARE), ("common_word_s", WORDS[0])):
            started = time.perf_counter()
            found = search(source, snapshot, word)
            timed[label] = time.perf_counter() - started
            timed[label.replace("_s", "_rows")] = len(found)
    elif name == "overview":
        started = time.perf_counter()
        overview(source, snapshot)
        timed["overview_s"] = time.perf_counter() - started
    timed["rows"] = snapshot.rows
    timed["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--keep", help="generate into (and keep) this folder")
    parser.add_argument("--step", choices=STEPS, help=argparse.SUPPRESS)
    parser.add_argument("--path", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.step:
        print(json.dumps(step(args.step, args.path)))
        return
    with tempfile.TemporaryDirectory(prefix="view-speed-") as scratch:
        folder = Path(args.keep or scratch)
        folder.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        out = generate(folder, args.rows)
        size = out.stat().st_size + (folder / "out.jsonl.errors.jsonl").stat().st_size
        print(f"generated {args.rows:,} rows ({size / 2**20:.0f} MiB) in "
              f"{time.perf_counter() - started:.1f} s")  # fmt: skip
        env = {"PYTHONPATH": str(REPO)}
        for name in STEPS:
            done = subprocess.run(
                [sys.executable, __file__, "--step", name, "--path", str(out)],
                capture_output=True, text=True, env={**os.environ, **env},
                check=True,
            )  # fmt: skip
            figures = json.loads(done.stdout.strip().splitlines()[-1])
            shown = ", ".join(
                f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v:,}" for k, v in figures.items()
            )
            print(f"{name:9} {shown}")


if __name__ == "__main__":
    main()
