"""`lmpress run`'s memory does not grow with its input: ten times the rows through a map, a
filter and a dedupe (a barrier, which must see all its input before it decides) peak at about
the same resident size, since the dedupe reads its input back from the journal."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.conftest import REPO
from tests.pipeline.helpers import DATA

PIPELINE = """steps:
  - {name: tag, kind: map, function: "fns:tag", makes: [tag]}
  - {name: some, kind: filter, expr: "tag != 'x'"}
  - {name: uniq, kind: dedupe, method: exact, columns: [text]}
"""

FUNCTIONS = """
def tag(row):
    row["tag"] = row["text"][:1]
    return row
"""

# Rows of 4 KB: 10,000 of them held in memory would be 40 MB and more, well past the 10%
# allowed; the sizes are small enough for a test of a few seconds a run.
PAD = "p" * 4000


def test_ten_times_the_rows_peak_at_about_the_same_memory(tmp_path):
    (tmp_path / "pipe.yaml").write_text(PIPELINE)
    (tmp_path / "fns.py").write_text(FUNCTIONS)
    small = peak_rss(tmp_path, 1_000)
    large = peak_rss(tmp_path, 10_000)
    assert large <= 1.1 * small, f"{large} KB with 10,000 rows, {small} KB with 1,000"


def peak_rss(tmp_path, rows: int) -> int:
    """The peak resident size (KB) of an `lmpress run` over `rows` rows, half of them copies."""
    source = tmp_path / f"in{rows}.jsonl"
    with source.open("w") as out:
        for i in range(rows):
            out.write(json.dumps({"text": f"{i % (rows // 2)} {PAD}"}) + "\n")
    out_dir = tmp_path / f"out{rows}"
    args = ["run", "pipe.yaml", "-i", source.name, "-o", out_dir.name]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "lmpress", *args], cwd=tmp_path, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    stderr = proc.stderr.read().decode()
    # wait4 gives this child's own rusage: RUSAGE_CHILDREN would hold the suite's others.
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    assert proc.returncode == 0, stderr
    assert sum(1 for _ in (out_dir / DATA).open()) == rows // 2
    return usage.ru_maxrss
