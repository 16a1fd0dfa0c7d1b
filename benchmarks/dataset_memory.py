"""Whether `lmpress batch` keeps memory flat on Parquet input as it grows: peak RSS for 10,000 vs
100,000 Parquet rows (target ratio <= 1.2), by the remote benchmark's method.

    python benchmarks/dataset_memory.py                  # Parquet in, Parquet out
    python benchmarks/dataset_memory.py --output jsonl   # Parquet in, JSONL out
    python benchmarks/dataset_memory.py --quick          # 1,000 vs 10,000 rows

Each run is the real CLI in a fresh process against a test server on 127.0.0.1 that answers at
once (REMOTE engine, num_workers=32), so what grows with the input is lmpress's own memory: the
rows read a record batch at a time, the journal, and the Parquet written from it at the end.
Peak RSS comes from os.wait4 on that process alone. The rows carry a prompt column made into
the user turn by --prompt-template, and two more columns that are written back out.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.remote_throughput import WORKERS, run_batch  # noqa: E402
from tests.servers.llm_server import Faults, LLMServer  # noqa: E402


def write_parquet_rows(path: Path, count: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    with pq.ParquetWriter(path, pa.schema([("id", pa.string()), ("question", pa.string()),
                                           ("topic", pa.string()), ("n", pa.int64())])) as w:  # fmt: skip
        for start in range(0, count, 10_000):
            ids = range(start, min(count, start + 10_000))
            w.write_table(pa.table({
                "id": [f"row-{i}" for i in ids],
                "question": [f"Question number {i}: why?" for i in ids],
                "topic": [("science", "history", "art")[i % 3] for i in ids],
                "n": list(ids),
            }))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="1,000 vs 10,000 rows")
    parser.add_argument("--output", choices=("parquet", "jsonl"), default="parquet")
    args = parser.parse_args()
    small, large = (1_000, 10_000) if args.quick else (10_000, 100_000)
    figures = {}
    with tempfile.TemporaryDirectory() as name, LLMServer(Faults()) as server:
        tmp = Path(name)
        for count in (small, large):
            rows, out = tmp / f"in{count}.parquet", tmp / f"out{count}.{args.output}"
            write_parquet_rows(rows, count)
            run = run_batch(server, rows, out, WORKERS, extra=["--prompt-template", "{question}"])
            figures[count] = (run.rss_kib / 1024, run.wall_s)
    ratio = figures[large][0] / figures[small][0]
    print(f"memory: peak RSS of lmpress batch, Parquet in, {args.output} out, num_workers="
          f"{WORKERS}: {small:,} rows {figures[small][0]:.1f} MiB ({figures[small][1]:.0f}s), "
          f"{large:,} rows {figures[large][0]:.1f} MiB ({figures[large][1]:.0f}s) -> ratio "
          f"{ratio:.3f} (target <= 1.2)")  # fmt: skip


if __name__ == "__main__":
    main()
