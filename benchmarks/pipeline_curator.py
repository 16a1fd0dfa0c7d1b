"""The Curator side of benchmarks/pipeline_speed.py: the same four steps as
benchmarks/pipeline_speed.yaml, written as Bespoke Curator `LLM` subclasses and run one after
another, as Curator runs a pipeline. It runs with .venv-curator's Python (pipeline_speed.py
makes that environment) and imports nothing of lmpress.

    .venv-curator/bin/python benchmarks/pipeline_curator.py --base-url URL --input topics.jsonl \\
        --workers 32 --out DIR

It prints one JSON line: each step's seconds and rows out, and the whole run's seconds.

Curator counts a request's tokens with tiktoken's cl100k_base before sending it (its rate
limiter's token budget), and tiktoken downloads that encoding's file on first use, which this
machine cannot. Here, and only in this process, tiktoken.get_encoding hands out a stand-in that
counts a token per 4 characters: the budget is set far above what the run spends, so the count
decides nothing but must exist.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

# Mirrored in pipeline_speed.yaml: the two sides send the same prompts.
QUESTIONS = (
    "Write 10 questions about {topic}. Reply with a JSON object whose key question holds them."
)
ANSWER = "Answer this question: {question}"
JUDGE = (
    "Score how well the answer answers the question, from 1 to 10.\n"
    "Question: {question}\nAnswer: {answer}\n"
    'Reply with JSON: {{"explanation": "...", "score": N}}'
)
KEEP_FROM = 6  # the filter step keeps rows scored this or more (pipeline_speed.yaml's expr)


class _StandInEncoding:
    """What Curator's token counting calls on a tiktoken Encoding, without its BPE file."""

    name = "stand-in"

    def encode(self, text: str, *args: object, **kwargs: object) -> list[int]:
        return [0] * max(1, len(text) // 4)


def patch_tiktoken() -> None:
    import tiktoken

    tiktoken.get_encoding = lambda *args, **kwargs: _StandInEncoding()
    tiktoken.encoding_for_model = lambda *args, **kwargs: _StandInEncoding()


def _steps():
    from bespokelabs import curator

    class Questions(curator.LLM):
        def prompt(self, row):
            return QUESTIONS.format(topic=row["topic"])

        def parse(self, row, response):
            questions = json.loads(response)["question"]
            return [{**row, "question": q} for q in questions]  # fan-out: a row per question

    class Answers(curator.LLM):
        def prompt(self, row):
            return ANSWER.format(question=row["question"])

        def parse(self, row, response):
            return {**row, "answer": response}

    class Judge(curator.LLM):
        def prompt(self, row):
            return JUDGE.format(question=row["question"], answer=row["answer"])

        def parse(self, row, response):
            reply = json.loads(response)
            return {**row, "score": int(reply["score"]), "explanation": reply["explanation"]}

    return {"questions": Questions, "answers": Answers, "judge": Judge}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--input", required=True)
    parser.add_argument("--workers", type=int, default=32)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    started = time.perf_counter()
    patch_tiktoken()
    from datasets import Dataset

    with open(args.input) as rows:
        data = Dataset.from_list([json.loads(line) for line in rows if line.strip()])
    backend_params = {
        "base_url": args.base_url,
        "api_key": "bench",
        "max_concurrent_requests": args.workers,  # the knob that matches num_workers
        # Far above what the run sends, so that only the concurrency limits it, as on lmpress's
        # side (Curator's defaults are an API tier's limits).
        "max_requests_per_minute": 10_000_000,
        "max_tokens_per_minute": 10_000_000_000,
        "max_retries": 1,
        "require_all_responses": True,
    }
    steps: dict[str, dict[str, float]] = {}
    for name, step in _steps().items():
        begun = time.perf_counter()
        llm = step(
            model_name="bench",
            backend="openai",
            generation_params={"temperature": 0, "max_tokens": 256},
            backend_params=backend_params,
        )
        data = llm(data, working_dir=os.path.join(args.out, name)).dataset
        steps[name] = {"seconds": time.perf_counter() - begun, "rows": len(data)}
    begun = time.perf_counter()
    data = data.filter(lambda row: row["score"] >= KEEP_FROM)
    steps["good"] = {"seconds": time.perf_counter() - begun, "rows": len(data)}
    data.to_json(os.path.join(args.out, "data.jsonl"))
    result = {"steps": steps, "seconds": time.perf_counter() - started, "rows": len(data)}
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    sys.exit(main())
