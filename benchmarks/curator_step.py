"""The Curator side of benchmarks/remote_curator.py: one step, each input row's `prompt` sent as
it is with max_tokens 16, run as a Bespoke Curator `LLM` subclass, its replies written out as
JSONL. It runs with .venv-curator's Python and imports nothing of lmpress; tiktoken's encoding
is pipeline_curator.py's stand-in, for the reason given there.

    .venv-curator/bin/python benchmarks/curator_step.py --base-url URL --input rows.jsonl \\
        --workers 32 --out DIR

It prints one JSON line: rows out, and the seconds from its first line to the output written.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from pipeline_curator import patch_tiktoken

MAX_TOKENS = 16  # remote_throughput.py's --generation.max_new_tokens


def main() -> None:
    started = time.perf_counter()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--input", required=True)
    parser.add_argument("--workers", type=int, default=32)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    patch_tiktoken()
    from bespokelabs import curator
    from datasets import Dataset

    class Reply(curator.LLM):
        def prompt(self, row):
            return row["prompt"]

        def parse(self, row, response):
            return {"id": row["id"], "response": response}

    with open(args.input) as rows:
        data = Dataset.from_list([json.loads(line) for line in rows if line.strip()])
    llm = Reply(
        model_name="bench",
        backend="openai",
        generation_params={"max_tokens": MAX_TOKENS},
        backend_params={
            "base_url": args.base_url,
            "api_key": "bench",
            "max_concurrent_requests": args.workers,  # the knob that matches num_workers
            "max_requests_per_minute": 10_000_000,  # out of the way, as in pipeline_curator.py
            "max_tokens_per_minute": 10_000_000_000,
            "max_retries": 1,
            "require_all_responses": True,
        },
    )
    data = llm(data, working_dir=os.path.join(args.out, "work")).dataset
    data.to_json(os.path.join(args.out, "replies.jsonl"))
    print(json.dumps({"rows": len(data), "seconds": time.perf_counter() - started}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
